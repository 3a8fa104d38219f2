"""Jamba: attention every ``attn_layer_period`` layers, Mamba1 everywhere else.

Layer ``i`` is attention when ``i % attn_layer_period == attn_layer_offset``. Mamba1 has no
heads: with ``d_inner = mamba_expand * hidden_size``, a rank keeps a conv state
``(mamba_d_conv - 1, d_inner / tp)`` and an ssm state ``(d_inner / tp, mamba_d_state)``.
"""

from __future__ import annotations

from graphkv.spec.hf._common import attention_shape, attention_spec, decl
from graphkv.spec.hf._reader import ConfigReader, Options
from graphkv.spec.layers import MambaSpec
from graphkv.spec.model import LayerDecl

__all__ = ["build"]


def _attention_every(cfg: ConfigReader) -> tuple[int | None, int | None]:
    period = cfg.int_field("attn_layer_period")
    offset = cfg.int_field("attn_layer_offset", minimum=0)
    if period is not None and offset is not None and offset >= period:
        cfg.problem("attn_layer_offset", offset, f"must be < attn_layer_period={period}",
                    "set attn_layer_offset to the position of the attention layer inside each period")
        return period, None
    return period, offset


def _mamba1_state(cfg: ConfigReader, opts: Options) -> MambaSpec | None:
    kernel = cfg.int_field("mamba_d_conv", minimum=2)
    state_size = cfg.int_field("mamba_d_state")
    expand = cfg.int_field("mamba_expand")
    hidden = cfg.int_field("hidden_size")
    d_inner = None if expand is None or hidden is None else expand * hidden
    d_inner = cfg.shard("mamba_expand * hidden_size", d_inner, opts.tp)
    if kernel is None or state_size is None or d_inner is None:
        return None
    return MambaSpec(shapes=((kernel - 1, d_inner), (d_inner, state_size)),
                     dtypes=(opts.model_dtype, opts.ssm_dtype), variant="mamba1")


def build(cfg: ConfigReader, opts: Options, num_layers: int | None) -> list[LayerDecl]:
    """Attention layers on the attention backend, Mamba1 layers on ``mamba``."""
    period, offset = _attention_every(cfg)
    kv_heads, head_size = attention_shape(cfg, opts)
    state = _mamba1_state(cfg, opts)
    cfg.raise_if_any()
    assert period is not None and offset is not None and kv_heads is not None and head_size is not None
    assert state is not None and num_layers is not None
    attention = attention_spec(opts, kv_heads, head_size)
    return [decl(i, attention, opts.attention_backend) if i % period == offset else decl(i, state, "mamba")
            for i in range(num_layers)]
