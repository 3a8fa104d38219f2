"""Tiny random-weight models of every family graphkv.hf runs, built from transformers' config
classes (``AutoConfig.for_model``) — no download. The tests, ``benchmarks/hf_serving.py`` and
``graphkv demo --hf`` use them.

Every config: vocabulary 128, hidden size 64, 4 query heads of 16 over 2 KV heads, float32, no
end-of-sequence token (so runs generate every token they are asked for), plus what makes the
family itself: a 24-token sliding window (Mistral on every layer; Gemma-3 and gpt-oss on some), a
rotary embedding per layer type, a query scale and output-logit soft-capping (Gemma-3), sinks and 4 experts
(gpt-oss), gated-delta layers and experts (Qwen3-Next), Mamba2, attention and MLP blocks (Nemotron-H); the
attention-only families (Qwen2, Mixtral, Phi-3, OLMo, Granite, Cohere, GLM, EXAONE, ...) 2 layers, their window
where they slide, 4 experts where they route. A family newer than the installed transformers has a tiny config
here but no config class there: :func:`tiny_config` then raises transformers' own error.
"""

from __future__ import annotations

import types
from typing import Any, Mapping

__all__ = ["CORE_FAMILIES", "TINY_CONFIGS", "tiny_config", "tiny_model"]

_COMMON: Mapping[str, Any] = types.MappingProxyType(dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None))

TINY_CONFIGS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType({
    "llama": dict(num_hidden_layers=2),
    "qwen3": dict(num_hidden_layers=2),
    "mistral": dict(num_hidden_layers=2, sliding_window=24),
    # Gemma-2: weights drawn 15x wider than transformers' default, so scores reach the 1.5 soft-cap (at the default
    # they stay near 0, where tanh changes nothing and a missing soft-cap would pass)
    "gemma2": dict(num_hidden_layers=2, sliding_window=24, layer_types=["sliding_attention", "full_attention"],
                   attn_logit_softcapping=1.5, final_logit_softcapping=8.0, query_pre_attn_scalar=16,
                   initializer_range=0.3),
    "gemma3_text": dict(num_hidden_layers=3, sliding_window=24, query_pre_attn_scalar=24, final_logit_softcapping=8.0,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    "gpt_oss": dict(num_hidden_layers=2, sliding_window=24, layer_types=["sliding_attention", "full_attention"],
                    num_local_experts=4, num_experts_per_tok=2),
    "qwen3_next": dict(num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                       shared_expert_intermediate_size=64),
    "nemotron_h": dict(num_hidden_layers=4, layers_block_type=["mamba", "attention", "mamba", "mlp"],
                       mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=16),
    "lfm2": dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"], conv_L_cache=3),
    "lfm2_moe": dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"], conv_L_cache=3,
                     num_dense_layers=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64),
    "bamba": dict(num_hidden_layers=3, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2,
                  mamba_d_state=16, mamba_expand=1, mamba_chunk_size=16),
    "granitemoehybrid": dict(num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=4,
                             mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_expand=1, mamba_chunk_size=16,
                             num_local_experts=4, num_experts_per_tok=2),
    # attention-only families: 2 layers, a 24-token window where the family slides (a sliding and a full layer where
    # it has layer types), 4 experts (2 per token) where it routes
    "apertus": dict(num_hidden_layers=2),
    "arcee": dict(num_hidden_layers=2),
    "aria_text": dict(num_hidden_layers=2, moe_num_experts=4),
    "beam": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention'],
                 num_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1),
    "bitnet": dict(num_hidden_layers=2),
    "cohere": dict(num_hidden_layers=2),
    "cohere2": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention']),
    "cohere2_moe": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention'],
                        num_experts=4),
    "ernie4_5": dict(num_hidden_layers=2),
    "ernie4_5_moe": dict(num_hidden_layers=2, num_experts=4, moe_num_experts=4, num_experts_per_tok=2, moe_k=2),
    "exaone4": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention']),
    "exaone_moe": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention'],
                       num_experts=4, num_experts_per_tok=2),
    "flex_olmo": dict(num_hidden_layers=2, num_experts=4, num_local_experts=4, num_experts_per_tok=2),
    "flint": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention'],
                  num_experts=4, num_experts_per_tok=2),
    "gemma": dict(num_hidden_layers=2),
    "gemma4_text": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention']),
    "glm": dict(num_hidden_layers=2),
    "glm4": dict(num_hidden_layers=2),
    "glm4_moe": dict(num_hidden_layers=2, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2),
    "granite": dict(num_hidden_layers=2),
    "granite_swa": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention']),
    "granitemoe": dict(num_hidden_layers=2, num_local_experts=4),
    "granitemoeshared": dict(num_hidden_layers=2, num_local_experts=4),
    "helium": dict(num_hidden_layers=2),
    "hunyuan_v1_dense": dict(num_hidden_layers=2),
    "hunyuan_v1_moe": dict(num_hidden_layers=2),
    "hy_v3": dict(num_hidden_layers=2, num_experts=4, num_local_experts=4, num_experts_per_tok=2),
    "internlm3": dict(num_hidden_layers=2),
    "iquestcoder": dict(num_hidden_layers=2),
    "jais2": dict(num_hidden_layers=2),
    "kolibri1": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention'],
                     num_experts=4, num_local_experts=4, num_experts_per_tok=2),
    "laguna": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention'],
                   num_experts=4, num_experts_per_tok=2),
    "mellum": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention'],
                   num_experts=4, num_local_experts=4, num_experts_per_tok=2),
    "minimax_m2": dict(num_hidden_layers=2, num_experts=4, num_local_experts=4, num_experts_per_tok=2),
    "ministral": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention']),
    "ministral3": dict(num_hidden_layers=2),
    "mixtral": dict(num_hidden_layers=2, num_experts=4, num_local_experts=4, sliding_window=24),
    "nanochat": dict(num_hidden_layers=2),
    "olmo": dict(num_hidden_layers=2),
    "olmo2": dict(num_hidden_layers=2),
    "olmo3": dict(num_hidden_layers=2, sliding_window=24, layer_types=['sliding_attention', 'full_attention']),
    "olmoe": dict(num_hidden_layers=2, num_experts=4, num_local_experts=4, num_experts_per_tok=2),
    "phi": dict(num_hidden_layers=2),
    "phi3": dict(num_hidden_layers=2, sliding_window=24),
    "phimoe": dict(num_hidden_layers=2, num_local_experts=4),
    "qwen2": dict(num_hidden_layers=2, use_sliding_window=True, sliding_window=24, max_window_layers=1),
    "qwen2_moe": dict(num_hidden_layers=2, use_sliding_window=True, sliding_window=24, max_window_layers=2,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                      shared_expert_intermediate_size=64),
    "qwen3_moe": dict(num_hidden_layers=2, num_experts=4, num_local_experts=4, num_experts_per_tok=2),
    "seed_oss": dict(num_hidden_layers=2),
    "smollm3": dict(num_hidden_layers=2),
    "solar_open": dict(num_hidden_layers=2, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2),
    "starcoder2": dict(num_hidden_layers=2, sliding_window=24),
    "vaultgemma": dict(num_hidden_layers=2, sliding_window=24, layer_types=["sliding_attention", "full_attention"],
                       attn_logit_softcapping=1.5, final_logit_softcapping=8.0, query_pre_attn_scalar=16,
                       initializer_range=0.3),
    # multi-head families: as many KV heads as query heads (GPTBigCode: multi-query, one)
    "ctrl": dict(num_hidden_layers=2, num_key_value_heads=None),
    "gpt2": dict(num_hidden_layers=2, num_key_value_heads=None),
    "gpt_bigcode": dict(num_hidden_layers=2, num_key_value_heads=1),
    "gpt_neox": dict(num_hidden_layers=2, num_key_value_heads=None),
    "opt": dict(num_hidden_layers=2, num_key_value_heads=None),
    "persimmon": dict(num_hidden_layers=2, num_key_value_heads=None),
})
"""Per family, the fields a tiny config sets on top of the common ones."""

CORE_FAMILIES: tuple[str, ...] = ("gemma3_text", "gpt_oss", "llama", "mistral", "nemotron_h", "qwen3", "qwen3_next")
"""One family of each structure graphkv.hf serves (full, every layer sliding, sliding and full with a rotary
embedding per type, sinks and MoE, gated delta, Mamba2): the GPU-path tests and the GPU suite serve these on every
path; the attention-only families' tiny models are served by the continuous-batching test."""

# Eager attention for the reference model where another would be wrong: gpt-oss applies its sinks only in eager
# attention (its own default); Gemma-2 and VaultGemma soft-cap their attention logits, which transformers' sdpa
# attention dropped silently in 5.17 (their logits 3.4 off eager's at the tiny config; 5.24 refuses sdpa there).
_EAGER = ("gemma2", "gpt_oss", "vaultgemma")


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """The tiny ``PretrainedConfig`` of ``model_type`` (a key of :data:`TINY_CONFIGS`), with
    ``overrides``. Raises :class:`SpecError` for another model type."""
    from transformers import AutoConfig

    from graphkv.errors import Problem, SpecError

    if model_type not in TINY_CONFIGS:
        raise SpecError(Problem(field="model_type", value=model_type,
                                limit=f"has no tiny config; one of {', '.join(TINY_CONFIGS)}",
                                fix="pick one of those"))
    return AutoConfig.for_model(model_type, **{**_COMMON, **TINY_CONFIGS[model_type], **overrides})


def tiny_model(model_type: str, *, seed: int = 0, **overrides: Any) -> Any:
    """A tiny random-weight causal LM of ``model_type`` (float32, CPU, eval mode), its weights
    drawn from ``torch.manual_seed(seed)``. Raises :class:`SpecError` for another model type, a seed
    that is not an int >= 0, or ``overrides`` transformers cannot build a config or model of (its config class's
    validators included; its message kept)."""
    import torch
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoModelForCausalLM

    from graphkv.errors import Problem, SpecError
    from graphkv.spec._checks import is_bool

    if is_bool(seed) or not isinstance(seed, int) or seed < 0:
        raise SpecError(Problem(field="seed", value=seed, limit="must be an int >= 0",
                                fix="pass e.g. seed=0 (torch.manual_seed's seed)"))
    if "vocab_size" in overrides and not (isinstance(overrides["vocab_size"], int) and overrides["vocab_size"] >= 2):
        raise SpecError(Problem(field="vocab_size", value=overrides["vocab_size"], limit="must be an int >= 2",
                                fix="leave it out (the tiny configs use 128) or pass e.g. vocab_size=128"))
    def refused(error: Exception, what: str) -> SpecError:
        said = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        return SpecError(Problem(field="overrides", value=overrides,
                                 limit=f"transformers cannot build a {model_type} {what} of them "
                                       f"({type(error).__name__}: {said[:300]})",
                                 fix=f"change or drop the overrides (tiny_config({model_type!r}) lists the tiny "
                                     "config's values)"))

    try:
        config = tiny_config(model_type, **overrides)
    except SpecError:
        raise
    except (ValueError, TypeError, StrictDataclassError) as error:  # the config class's validators
        if not overrides:  # the tiny config itself: transformers' own error (a family it does not know)
            raise
        raise refused(error, "config") from error
    torch.manual_seed(seed)
    attn = {"attn_implementation": "eager"} if model_type in _EAGER else {}
    try:
        return AutoModelForCausalLM.from_config(config, **attn).eval()
    except (ValueError, TypeError, RuntimeError, AttributeError) as error:
        raise refused(error, "model") from error
