"""Which transformers models ``graphkv.hf`` runs, and the one-line refusal for the others.

A family is supported when its attention modules call transformers' attention-function interface
(so graphkv's paged flex attention can stand in, see :mod:`graphkv.hf.attention`) and each of its
recurrent mixers has a paged twin in :mod:`graphkv.hf.mixers`. Each family here is checked by the
tests (``tests/hf``): greedy tokens equal to ``model.generate`` and logits equal to the model's own
forward, on a tiny random-weight config.
"""

from __future__ import annotations

import types
from typing import Any, Mapping

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec.hf.families import FAMILIES as PLANNED_FAMILIES

__all__ = ["FAMILIES", "FamilySupport", "family_of", "vocab_size_of"]


@attrs.frozen(kw_only=True)
class FamilySupport:
    """How graphkv runs one transformers family: the class of its attention modules and, per
    recurrent mixer class, the paged mixer that replaces it (``"gated_delta"``, ``"mamba2"``)."""

    model_type: str
    attention: str
    mixers: Mapping[str, str] = attrs.field(factory=dict, converter=lambda m: types.MappingProxyType(dict(m)))
    # every layer slides over config.sliding_window (no module attribute): only the families whose transformers model
    # builds a sliding-window mask from it (transformers 5.24: Mistral, Ministral-3, Mixtral, Phi-3, PhiMoE,
    # StarCoder2); the others keep the field and attend to the whole context
    window_from_config: bool = False
    # its attention modules pass their attn_logit_softcapping to the attention function (Gemma-2, VaultGemma);
    # Gemma-3's keep the attribute and never apply it
    softcaps: bool = False
    # its attention sizes K from hidden_size / num_attention_heads (GPT-BigCode: one head with multi_query) and
    # ignores head_dim / num_key_value_heads, which the planner reads (the multi-head families)
    heads_from_hidden: bool = False
    # its attention passes config.sliding_window to the attention function, but only transformers' flash-attention
    # kernels apply it: its eager / sdpa mask (the default) is full causal, and graphkv attends as that mask does
    passes_unapplied_window: bool = False
    note: str = ""

    def sliding_window(self, attention: Any) -> int | None:
        """The window an attention module of this family slides over (``None``: full attention)."""
        if self.window_from_config:
            return getattr(attention.config, "sliding_window", None) or None  # 0: no window (Qwen2-MoE)
        if getattr(attention, "is_sliding", True) is False:  # a full layer that keeps the window (EXAONE 4)
            return None
        return getattr(attention, "sliding_window", None) or None

    def softcap(self, attention: Any) -> float | None:
        """The attention-logit soft-cap an attention module applies: its ``attn_logit_softcapping`` attribute in a
        family that applies it (:attr:`softcaps`: Gemma-2, VaultGemma), else ``None`` (Gemma-3 keeps the attribute
        and attends uncapped). A module that passes a cap it does not keep there is refused at its first step
        (:func:`graphkv.hf.attention.paged_attention_forward`)."""
        if not self.softcaps:
            return None
        value = getattr(attention, "attn_logit_softcapping", None)
        return float(value) if value else None


FAMILIES: Mapping[str, FamilySupport] = types.MappingProxyType({f.model_type: f for f in (
    FamilySupport(model_type="llama", attention="LlamaAttention"),
    FamilySupport(model_type="qwen3", attention="Qwen3Attention"),
    FamilySupport(model_type="mistral", attention="MistralAttention", window_from_config=True,
                  note="sliding window on every layer"),
    FamilySupport(model_type="gemma2", attention="Gemma2Attention", softcaps=True,
                  note="alternating sliding / full layers, attention-logit soft-capping"),
    FamilySupport(model_type="gemma3_text", attention="Gemma3Attention",
                  note="sliding and full layers, a rotary embedding per layer type"),
    FamilySupport(model_type="gpt_oss", attention="GptOssAttention",
                  note="alternating sliding / full layers, attention sinks, MoE"),
    FamilySupport(model_type="qwen3_next", attention="Qwen3NextAttention",
                  mixers={"Qwen3NextGatedDeltaNet": "gated_delta"}, note="gated delta + gated full attention"),
    FamilySupport(model_type="nemotron_h", attention="NemotronHAttention",
                  mixers={"NemotronHMamba2Mixer": "mamba2"}, note="Mamba2 + attention + MLP blocks"),
    FamilySupport(model_type="lfm2", attention="Lfm2Attention", mixers={"Lfm2ShortConv": "short_conv"},
                  note="short convolutions + attention"),
    FamilySupport(model_type="lfm2_moe", attention="Lfm2MoeAttention", mixers={"Lfm2MoeShortConv": "short_conv"},
                  note="short convolutions + attention, MoE"),
    FamilySupport(model_type="bamba", attention="BambaAttention", mixers={"BambaMixer": "mamba2"},
                  note="Mamba2 + attention layers"),
    FamilySupport(model_type="granitemoehybrid", attention="GraniteMoeHybridAttention",
                  mixers={"GraniteMoeHybridMambaLayer": "mamba2"},
                  note="Mamba2 + attention layers, MoE (Granite 4.0-H)"),
    # Attention-only families whose attention modules call the interface like the ones above (dense, MoE, sliding
    # and full layers); each is checked by the same continuous-batching test against its own generate.
    FamilySupport(model_type="apertus", attention="ApertusAttention"),
    FamilySupport(model_type="arcee", attention="ArceeAttention"),
    FamilySupport(model_type="aria_text", attention="AriaTextAttention"),
    FamilySupport(model_type="beam", attention="BeamAttention"),
    FamilySupport(model_type="bitnet", attention="BitNetAttention"),
    FamilySupport(model_type="cohere", attention="CohereAttention"),
    FamilySupport(model_type="cohere2", attention="Cohere2Attention"),
    FamilySupport(model_type="cohere2_moe", attention="Cohere2MoeAttention"),
    FamilySupport(model_type="ernie4_5", attention="Ernie4_5Attention"),
    FamilySupport(model_type="ernie4_5_moe", attention="Ernie4_5_MoeAttention"),
    FamilySupport(model_type="exaone4", attention="Exaone4Attention"),
    FamilySupport(model_type="exaone_moe", attention="ExaoneMoeAttention"),
    FamilySupport(model_type="flex_olmo", attention="FlexOlmoAttention"),
    FamilySupport(model_type="flint", attention="FlintAttention"),
    FamilySupport(model_type="gemma", attention="GemmaAttention"),
    FamilySupport(model_type="gemma4_text", attention="Gemma4TextAttention"),
    FamilySupport(model_type="glm", attention="GlmAttention"),
    FamilySupport(model_type="glm4", attention="Glm4Attention"),
    FamilySupport(model_type="glm4_moe", attention="Glm4MoeAttention"),
    FamilySupport(model_type="granite", attention="GraniteAttention"),
    FamilySupport(model_type="granite_swa", attention="GraniteSWAAttention"),
    FamilySupport(model_type="granitemoe", attention="GraniteMoeAttention"),
    FamilySupport(model_type="granitemoeshared", attention="GraniteMoeSharedAttention"),
    FamilySupport(model_type="helium", attention="HeliumAttention"),
    FamilySupport(model_type="hunyuan_v1_dense", attention="HunYuanDenseV1Attention"),
    FamilySupport(model_type="hunyuan_v1_moe", attention="HunYuanMoEV1Attention"),
    FamilySupport(model_type="hy_v3", attention="HYV3Attention"),
    FamilySupport(model_type="internlm3", attention="LlamaAttention"),
    FamilySupport(model_type="iquestcoder", attention="LlamaAttention"),
    FamilySupport(model_type="jais2", attention="Jais2Attention"),
    FamilySupport(model_type="kolibri1", attention="Kolibri1Attention"),
    FamilySupport(model_type="laguna", attention="LagunaAttention"),
    FamilySupport(model_type="mellum", attention="MellumAttention"),
    FamilySupport(model_type="minimax_m2", attention="MiniMaxM2Attention"),
    FamilySupport(model_type="ministral", attention="MinistralAttention"),
    FamilySupport(model_type="ministral3", attention="Ministral3Attention", window_from_config=True),
    FamilySupport(model_type="mixtral", attention="MixtralAttention", window_from_config=True),
    FamilySupport(model_type="nanochat", attention="NanoChatAttention"),
    FamilySupport(model_type="olmo", attention="OlmoAttention"),
    FamilySupport(model_type="olmo2", attention="Olmo2Attention"),
    FamilySupport(model_type="olmo3", attention="Olmo3Attention"),
    FamilySupport(model_type="olmoe", attention="OlmoeAttention", passes_unapplied_window=True),
    FamilySupport(model_type="phi", attention="PhiAttention"),
    FamilySupport(model_type="phi3", attention="Phi3Attention", window_from_config=True),
    FamilySupport(model_type="phimoe", attention="PhimoeAttention", window_from_config=True),
    FamilySupport(model_type="qwen2", attention="Qwen2Attention"),
    FamilySupport(model_type="qwen2_moe", attention="Qwen2MoeAttention"),
    FamilySupport(model_type="qwen3_moe", attention="Qwen3MoeAttention"),
    FamilySupport(model_type="seed_oss", attention="SeedOssAttention"),
    FamilySupport(model_type="smollm3", attention="SmolLM3Attention"),
    FamilySupport(model_type="solar_open", attention="SolarOpenAttention"),
    FamilySupport(model_type="starcoder2", attention="Starcoder2Attention", window_from_config=True),
    FamilySupport(model_type="vaultgemma", attention="VaultGemmaAttention", softcaps=True),
    # multi-head (no grouped KV) families: their configs name no KV heads, the planner reads the query heads
    FamilySupport(model_type="ctrl", attention="MultiHeadAttention", heads_from_hidden=True),
    FamilySupport(model_type="gpt2", attention="GPT2Attention", heads_from_hidden=True),
    FamilySupport(model_type="gpt_bigcode", attention="GPTBigCodeAttention", heads_from_hidden=True),
    FamilySupport(model_type="gpt_neox", attention="GPTNeoXAttention", heads_from_hidden=True),
    FamilySupport(model_type="opt", attention="OPTAttention", heads_from_hidden=True),
    FamilySupport(model_type="persimmon", attention="PersimmonAttention", heads_from_hidden=True),
)})


def vocab_size_of(model: Any) -> int | None:
    """Token ids ``model`` embeds: the rows of its input embedding (``config.vocab_size`` when it has
    none to read); ``None`` when neither says."""
    embedding = getattr(model, "get_input_embeddings", lambda: None)()
    rows = getattr(embedding, "num_embeddings", None)
    if rows is None:
        rows = getattr(getattr(model, "config", None), "vocab_size", None)
    return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0 else None


def family_of(model: Any) -> FamilySupport:
    """The :class:`FamilySupport` of ``model`` (a loaded transformers causal LM).

    Raises :class:`SpecError` in one line naming what is missing: not a transformers model, not a
    causal LM with an output head, or a ``model_type`` graphkv does not run (with the families it
    does)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if config is None or not isinstance(model_type, str) or not callable(getattr(model, "forward", None)):
        raise SpecError(Problem(field="model", value=type(model).__name__,
                                limit="is not a loaded transformers model (no .config.model_type)",
                                fix="pass a causal LM, e.g. AutoModelForCausalLM.from_config(config) or "
                                    ".from_pretrained(local_dir)"))
    family = FAMILIES.get(model_type)
    if family is None:
        raise SpecError(Problem(
            field="model.config.model_type", value=model_type,
            limit=f"graphkv.hf runs {', '.join(sorted(FAMILIES))}; this family's attention / recurrent modules have "
                  "no paged twin yet",
            fix=f"plan its cache with `graphkv plan --hf-config` (planning reads {len(PLANNED_FAMILIES)} "
                "families), and run it with transformers' own generate until its modules are supported"))
    if getattr(model, "get_output_embeddings", lambda: None)() is None:
        raise SpecError(Problem(field="model", value=type(model).__name__,
                                limit=f"is a {model_type} model without an output head (not a causal LM)",
                                fix="load it with AutoModelForCausalLM"))
    return family
