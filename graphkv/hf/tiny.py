"""Tiny random-weight models of every family graphkv.hf runs, built from transformers' config
classes (``AutoConfig.for_model``) — no download. The tests, ``benchmarks/hf_serving.py`` and
``graphkv demo --hf`` use them.

Every config: vocabulary 128, hidden size 64, 4 query heads of 16 over 2 KV heads, float32, no
end-of-sequence token (so runs generate every token they are asked for), plus what makes the
family itself: a 24-token sliding window (Mistral on every layer; Gemma-3 and gpt-oss on some), a
rotary embedding per layer type, a query scale and output-logit soft-capping (Gemma-3), sinks and 4 experts (gpt-oss),
gated-delta layers and experts (Qwen3-Next), Mamba2, attention and MLP blocks (Nemotron-H).
"""

from __future__ import annotations

import types
from typing import Any, Mapping

__all__ = ["TINY_CONFIGS", "tiny_config", "tiny_model"]

_COMMON: Mapping[str, Any] = types.MappingProxyType(dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None))

TINY_CONFIGS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType({
    "llama": dict(num_hidden_layers=2),
    "qwen3": dict(num_hidden_layers=2),
    "mistral": dict(num_hidden_layers=2, sliding_window=24),
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
})
"""Per family, the fields a tiny config sets on top of the common ones."""

# gpt-oss applies its sinks only in eager attention (its own default).
_EAGER = ("gpt_oss",)


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
    drawn from ``torch.manual_seed(seed)``."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type, **overrides)
    torch.manual_seed(seed)
    attn = {"attn_implementation": "eager"} if model_type in _EAGER else {}
    return AutoModelForCausalLM.from_config(config, **attn).eval()
