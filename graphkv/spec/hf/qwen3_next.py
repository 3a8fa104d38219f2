"""Qwen3-Next: gated-delta (linear attention) layers with full attention every N-th layer.

Layer ``i`` is full attention when ``(i + 1) % full_attention_interval == 0`` (``layer_types``
of ``linear_attention`` / ``full_attention`` wins when present). Per rank, a gated-delta layer
keeps two states:

- conv state ``(linear_conv_kernel_dim - 1, conv_dim / tp)``, with the q, k and v channels
  concatenated: ``conv_dim = 2 * linear_num_key_heads * linear_key_head_dim +
  linear_num_value_heads * linear_value_head_dim``;
- recurrent state ``(linear_num_value_heads / tp, linear_key_head_dim, linear_value_head_dim)``:
  one key-by-value matrix per value head.

Tensor parallelism splits the key and value heads, so both counts must divide by ``tp``.
"""

from __future__ import annotations

from graphkv.spec.hf._common import FULL, attention_shape, attention_spec, decl
from graphkv.spec.hf._reader import ConfigReader, Options
from graphkv.spec.layers import MambaSpec
from graphkv.spec.model import LayerDecl

__all__ = ["GATED_DELTA_CHUNK_TOKENS", "build"]

LINEAR = "linear_attention"
GATED_DELTA_CHUNK_TOKENS = 64  # chunk length of the chunked gated-delta prefill kernel


def _layer_kinds(cfg: ConfigReader, num_layers: int | None) -> list[str] | None:
    if cfg.has("layer_types"):
        return cfg.str_list("layer_types", (FULL, LINEAR), num_layers)
    interval = cfg.int_field("full_attention_interval")
    if interval is None or num_layers is None:
        return None
    return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]


def _gated_delta_state(cfg: ConfigReader, opts: Options) -> MambaSpec | None:
    kernel = cfg.int_field("linear_conv_kernel_dim", minimum=2)
    key_heads = cfg.shard("linear_num_key_heads", cfg.int_field("linear_num_key_heads"), opts.tp)
    value_heads = cfg.shard("linear_num_value_heads", cfg.int_field("linear_num_value_heads"), opts.tp)
    key_dim = cfg.int_field("linear_key_head_dim")
    value_dim = cfg.int_field("linear_value_head_dim")
    if kernel is None or key_heads is None or value_heads is None or key_dim is None or value_dim is None:
        return None
    conv_dim = 2 * key_heads * key_dim + value_heads * value_dim  # per rank: q, k, v channels
    return MambaSpec(shapes=((kernel - 1, conv_dim), (value_heads, key_dim, value_dim)),
                     dtypes=(opts.model_dtype, opts.ssm_dtype), variant="gated_delta",
                     chunk_size=GATED_DELTA_CHUNK_TOKENS)


def build(cfg: ConfigReader, opts: Options, num_layers: int | None) -> list[LayerDecl]:
    """Gated-delta layers on ``gdn`` and every N-th layer full attention."""
    kinds = _layer_kinds(cfg, num_layers)
    kv_heads, head_size = attention_shape(cfg, opts)
    state = _gated_delta_state(cfg, opts)
    cfg.raise_if_any()
    assert kinds is not None and kv_heads is not None and head_size is not None and state is not None
    full = attention_spec(opts, kv_heads, head_size)
    return [decl(i, full, opts.attention_backend) if kind == FULL else decl(i, state, "gdn")
            for i, kind in enumerate(kinds)]
