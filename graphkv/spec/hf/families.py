"""The model families graphkv reads, as data: what ``graphkv models`` lists and README's table shows.

The reader does not dispatch on this table — it follows the config's fields, so a family missing
here still plans when its fields say what its layers are. A row names the family's
``model_type``, its reference checkpoint (a representative public repository of the family), the
layer kinds its layers map to — checked against ``transformers.AutoConfig.for_model(model_type)``,
the family's reference config, by ``tests/spec/hf/test_hf_families.py`` — and the few defaults its
configs do not write:

- ``sliding_pattern``: every N-th layer is full attention, the others slide, when the config
  has neither ``layer_types`` nor a pattern field (Gemma-2 alternates; its config.json says only
  ``sliding_window``);
- ``state_dtype``: the recurrent state dtype when neither the config nor the user sets one
  (Nemotron-H: float32, vLLM 0.33 ``NemotronHForCausalLMConfig``);
- ``attentions_per_layer``: LongCat-Flash runs two MLA attentions in every layer (vLLM 0.33
  ``LongcatFlashDecoderLayer``), so each layer holds two latent caches;
- ``parallel_hybrid``: every layer runs attention and Mamba2 side by side (Falcon-H1; its config
  has no layout field), so each layer holds a KV cache and a state.

``aliases`` are the model types of the same decoder under another wrapper (a multimodal config's
outer type, or its ``text_config`` type).
"""

from __future__ import annotations

from typing import Mapping

import attrs

__all__ = ["FAMILIES", "Family", "find_family"]


@attrs.frozen(kw_only=True)
class Family:
    """One model family: its type, reference checkpoint, layer kinds and unwritten defaults."""

    model_type: str
    checkpoint: str
    kinds: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    sliding_pattern: int | None = None
    state_dtype: str | None = None
    # tokens between the prefill checkpoints its state layers export in mamba_cache_mode="align" (vLLM 0.33 on sm_90:
    # Qwen's QwenGatedDeltaNetAttention with FlashInfer's GDN prefill, every 64 tokens); None: it exports none
    state_checkpoint_tokens: int | None = None
    attentions_per_layer: int = 1
    parallel_hybrid: bool = False
    # its attention layers have sinks (gpt-oss), which only Hopper's FlashAttention serves in vLLM 0.33
    attention_sinks: bool = False
    # vLLM 0.33 serves it with Triton below Hopper: "always" (MiMo-V2, its own backend choice), "mixed_heads" (Gemma-4
    # when its layers' head sizes differ: Gemma4Config, FlashAttention 4 being Hopper's); "": vLLM's usual choice
    triton_below_hopper: str = ""
    # its transformers config gates ``sliding_window`` behind ``use_sliding_window``, false when not written (Qwen2 /
    # Qwen3 and their MoE, SmolLM3, IQuest-Coder): a config without the flag has every layer full attention
    sliding_window_flag: bool = False


def _f(model_type: str, checkpoint: str, kinds: str, **quirks: object) -> Family:
    return Family(model_type=model_type, checkpoint=checkpoint, kinds=tuple(kinds.split()), **quirks)  # type: ignore[arg-type]


_FULL, _SLIDE, _BOTH = "full_attention", "sliding_window", "full_attention sliding_window"
_FLASHINFER_GDN_CHECKPOINTS = 64  # vLLM 0.33 FLASHINFER_GDN_CHECKPOINT_ALIGNMENT (v1/attention/backends/gdn_attn.py)

FAMILIES: tuple[Family, ...] = (
    # --- full attention (MHA / GQA / MQA)
    _f("llama", "meta-llama/Llama-3.1-8B", _FULL),
    _f("mistral", "mistralai/Mistral-7B-v0.1", _SLIDE),
    _f("mixtral", "mistralai/Mixtral-8x7B-v0.1", _FULL),
    _f("ministral", "mistralai/Ministral-8B-Instruct-2410", _SLIDE),
    _f("ministral3", "mistralai/Ministral-3-8B-Base-2512", _FULL),
    _f("qwen2", "Qwen/Qwen2-7B", _FULL, sliding_window_flag=True),
    _f("qwen2_moe", "Qwen/Qwen1.5-MoE-A2.7B", _FULL, sliding_window_flag=True),
    _f("qwen3", "Qwen/Qwen3-8B", _FULL, sliding_window_flag=True),
    _f("qwen3_moe", "Qwen/Qwen3-30B-A3B-Base", _FULL, sliding_window_flag=True),
    _f("gemma", "google/gemma-7b", _FULL),
    _f("phi", "microsoft/phi-1", _FULL),
    _f("phi3", "microsoft/Phi-3-mini-4k-instruct", _FULL),
    _f("phimoe", "microsoft/Phi-3.5-MoE-instruct", _FULL),
    _f("granite", "ibm-granite/granite-3.0-8b-base", _FULL),
    _f("granitemoe", "ibm-granite/granite-3.0-1b-a400m-base", _FULL),
    _f("granitemoeshared", "ibm-research/PowerMoE-3b", _FULL),
    _f("cohere", "CohereForAI/c4ai-command-r-v01", _FULL),
    _f("glm", "THUDM/glm-4-9b-chat", _FULL),
    _f("glm4", "THUDM/GLM-4-9B-0414", _FULL),
    _f("glm4_moe", "zai-org/GLM-4.5", _FULL),
    _f("olmo", "allenai/OLMo-7B-hf", _FULL),
    _f("olmo2", "allenai/OLMo-2-1124-7B", _FULL),
    _f("olmoe", "allenai/OLMoE-1B-7B-0924", _FULL),
    _f("flex_olmo", "allenai/FlexOlmo-7x7B-1T", _FULL),
    _f("starcoder2", "bigcode/starcoder2-7b", _FULL),
    _f("stablelm", "stabilityai/stablelm-3b-4e1t", _FULL),
    _f("persimmon", "adept/persimmon-8b-base", _FULL),
    _f("gpt_neox", "EleutherAI/gpt-neox-20b", _FULL),
    _f("gpt_neox_japanese", "abeja/gpt-neox-japanese-2.7b", _FULL),
    _f("gptj", "EleutherAI/gpt-j-6B", _FULL),
    _f("codegen", "Salesforce/codegen-2B-mono", _FULL),
    _f("gpt2", "openai-community/gpt2", _FULL),
    _f("gpt_bigcode", "bigcode/gpt_bigcode-santacoder", _FULL),
    _f("openai-gpt", "openai-community/openai-gpt", _FULL),
    _f("ctrl", "Salesforce/ctrl", _FULL),
    _f("xglm", "facebook/xglm-564M", _FULL),
    _f("falcon", "tiiuae/falcon-7b", _FULL),
    _f("bloom", "bigscience/bloom", _FULL),
    _f("opt", "facebook/opt-350m", _FULL),
    _f("mpt", "mosaicml/mpt-7b", _FULL),
    _f("dbrx", "databricks/dbrx-instruct", _FULL),
    _f("internlm3", "internlm/internlm3-8b-instruct", _FULL),
    _f("helium", "kyutai/helium-1-preview", _FULL),
    _f("ernie4_5", "baidu/ERNIE-4.5-0.3B-PT", _FULL),
    _f("ernie4_5_moe", "baidu/ERNIE-4.5-21B-A3B-PT", _FULL),
    _f("seed_oss", "ByteDance-Seed/Seed-OSS-36B-Instruct", _FULL),
    _f("smollm3", "HuggingFaceTB/SmolLM3-3B", _FULL, sliding_window_flag=True),
    _f("hunyuan_v1_dense", "tencent/Hunyuan-7B-Instruct", _FULL),
    _f("hunyuan_v1_moe", "tencent/Hunyuan-A13B-Instruct", _FULL),
    _f("minimax_m2", "MiniMaxAI/MiniMax-M2", _FULL),
    _f("jetmoe", "jetmoe/jetmoe-8b", _FULL),
    _f("nemotron", "nvidia/Minitron-8B-Base", _FULL),
    _f("bitnet", "microsoft/bitnet-b1.58-2B-4T", _FULL),
    _f("apertus", "swiss-ai/Apertus-8B-Instruct-2509", _FULL),
    _f("arcee", "arcee-ai/AFM-4.5B", _FULL),
    _f("diffllama", "kajuma/DiffLlama-0.3B-handcut", _FULL),
    _f("nanochat", "karpathy/nanochat-d32", _FULL),
    _f("solar_open", "upstage/Solar-Open-100B", _FULL),
    _f("dots1", "rednote-hilab/dots.llm1.base", _FULL),
    _f("hy_v3", "tencent/Hy3-preview", _FULL),
    _f("iquestcoder", "IQuestLab/IQuest-Coder-V1-40B-Instruct", _FULL, sliding_window_flag=True),
    _f("jais2", "inceptionai/Jais-2-8B-Chat", _FULL),
    _f("laguna", "poolside/laguna-XS.2", _FULL),
    _f("mellum", "JetBrains/Mellum2-12B-A2.5B-Base", _FULL),
    _f("aria_text", "rhymes-ai/Aria", _FULL, aliases=("aria",)),
    _f("emu3", "Emu3-community/Emu3-Chat-hf", _FULL, aliases=("emu3_text_model",)),
    # --- sliding window + full attention
    _f("gemma2", "google/gemma-2-9b", _BOTH, sliding_pattern=2),
    _f("gemma3_text", "google/gemma-3-4b-it", _BOTH, aliases=("gemma3",), sliding_pattern=6),
    _f("vaultgemma", "google/vaultgemma-1b", _BOTH, sliding_pattern=2),
    _f("cohere2", "CohereForAI/c4ai-command-r7b-12-2024", _BOTH, sliding_pattern=4),
    _f("cohere2_moe", "CohereLabs/command-a-plus-05-2026", _BOTH, sliding_pattern=4),
    _f("gpt_oss", "openai/gpt-oss-20b", _BOTH, sliding_pattern=2, attention_sinks=True),
    _f("olmo3", "allenai/Olmo-3-7B-Instruct", _BOTH, sliding_pattern=4),
    _f("exaone4", "LGAI-EXAONE/EXAONE-4.0-32B", _BOTH, sliding_pattern=4),
    _f("exaone_moe", "LGAI-EXAONE/K-EXAONE-236B-A23B", _BOTH, sliding_pattern=4),
    _f("afmoe", "arcee-ai/Trinity-Mini", _BOTH, sliding_pattern=4),
    _f("cwm", "facebook/cwm", _BOTH),
    _f("granite_swa", "ibm-granite/granite-swash-2b", _BOTH),
    _f("kolibri1", "Aleph-Alpha/Kolibri-1", _BOTH),
    _f("flint", "RecursiveSI/flint", _BOTH),
    _f("beam", "reflection/Beam-1.0-501B-A23B", _BOTH),
    _f("gpt_neo", "EleutherAI/gpt-neo-1.3B", _BOTH),
    _f("mimo_v2_flash", "XiaomiMiMo/MiMo-V2-Flash", _BOTH, triton_below_hopper="always"),
    # --- chunked local attention, per-layer head sizes, KV sharing
    _f("llama4_text", "meta-llama/Llama-4-Scout-17B-16E", "full_attention chunked_local", aliases=("llama4",)),
    _f("gemma4_text", "google/gemma-4-e2b-it", _BOTH, aliases=("gemma4",), triton_below_hopper="mixed_heads"),
    _f("gemma3n_text", "google/gemma-3n-E4B", _BOTH + " kv_shared", aliases=("gemma3n",)),
    # --- multi-head latent attention (and the sparse-attention indexer)
    _f("deepseek_v2", "deepseek-ai/DeepSeek-V2-Lite", "mla"),
    _f("deepseek_v3", "deepseek-ai/DeepSeek-V3", "mla"),
    _f("glm4_moe_lite", "zai-org/GLM-4.7-Flash", "mla"),
    _f("minicpm3", "openbmb/MiniCPM3-4B", "mla"),
    _f("youtu", "tencent/Youtu-LLM-2B", "mla"),
    _f("longcat_flash", "meituan-longcat/LongCat-Flash-Chat", "mla", attentions_per_layer=2),
    _f("deepseek_v32", "deepseek-ai/DeepSeek-V3.2-Exp", "mla indexer"),
    _f("glm_moe_dsa", "zai-org/GLM-5", "mla indexer"),
    # --- recurrent states, alone or with attention
    _f("mamba", "state-spaces/mamba-2.8b-hf", "mamba1"),
    _f("falcon_mamba", "tiiuae/falcon-mamba-7b", "mamba1"),
    _f("jamba", "ai21labs/AI21-Jamba-Mini-1.5", "full_attention mamba1"),
    _f("mamba2", "state-spaces/mamba2-2.8b", "mamba2"),
    _f("bamba", "ibm-fms/Bamba-9B", "full_attention mamba2"),
    _f("granitemoehybrid", "ibm-granite/granite-4.0-h-small", "full_attention mamba2"),
    _f("zamba2", "Zyphra/Zamba2-2.7B", "full_attention mamba2"),
    _f("falcon_h1", "tiiuae/Falcon-H1-1.5B-Deep-Instruct", "full_attention mamba2", parallel_hybrid=True),
    _f("nemotron_h", "nvidia/Nemotron-H-8B-Base-8K", "full_attention mamba2 none", state_dtype="float32"),
    _f("qwen3_next", "Qwen/Qwen3-Next-80B-A3B-Instruct", "full_attention gated_delta",
       state_checkpoint_tokens=_FLASHINFER_GDN_CHECKPOINTS),
    _f("qwen3_5_text", "Qwen/Qwen3.5-27B", "full_attention gated_delta", aliases=("qwen3_5",),
       state_checkpoint_tokens=_FLASHINFER_GDN_CHECKPOINTS),
    _f("qwen3_5_moe_text", "Qwen/Qwen3.5-397B-A17B", "full_attention gated_delta", aliases=("qwen3_5_moe",),
       state_checkpoint_tokens=_FLASHINFER_GDN_CHECKPOINTS),
    _f("olmo_hybrid", "allenai/Olmo-Hybrid-7B", "full_attention gated_delta"),
    _f("kimi_linear", "moonshotai/Kimi-Linear-48B-A3B-Instruct", "mla kda"),
    _f("bailing_hybrid", "inclusionAI/Ling-3.0-Flash", "mla kda"),
    _f("minimax", "MiniMaxAI/MiniMax-Text-01-hf", "full_attention lightning"),
    _f("lfm2", "LiquidAI/LFM2-1.2B", "full_attention short_conv"),
    _f("lfm2_moe", "LiquidAI/LFM2-8B-A1B", "full_attention short_conv"),
    _f("lfm3", "LiquidAI/LFM3-1.7B", "full_attention sliding_window short_conv"),
)
"""Every family graphkv reads, in the order ``graphkv models`` prints them."""

_BY_TYPE: Mapping[str, Family] = {t: f for f in FAMILIES for t in (f.model_type, *f.aliases)}


def find_family(model_type: object) -> Family | None:
    """The family whose ``model_type`` (or alias) is ``model_type``; ``None`` when graphkv lists none."""
    return _BY_TYPE.get(model_type) if isinstance(model_type, str) else None
