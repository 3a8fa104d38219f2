"""Pieces every family shares: the attention head shape and the layer declarations."""

from __future__ import annotations

from graphkv.spec.hf._reader import MISSING, ConfigReader, Options
from graphkv.spec.layers import FullAttentionSpec, LayerSpec, SlidingWindowSpec
from graphkv.spec.model import LayerDecl

__all__ = ["FULL", "SLIDING", "attention_layers", "attention_shape", "attention_spec", "decl"]

FULL = "full_attention"
SLIDING = "sliding_attention"


def attention_shape(cfg: ConfigReader, opts: Options,
                    head_dim_keys: tuple[str, ...] = ("head_dim",)) -> tuple[int | None, int | None]:
    """``(kv heads per rank, head size)`` of the attention layers.

    KV heads: ``num_key_value_heads`` (default ``num_attention_heads``) split over ``opts.tp``;
    head size: the first of ``head_dim_keys`` that is set, else ``hidden_size // num_attention_heads``.
    """
    heads = cfg.int_field("num_attention_heads")
    kv_heads = cfg.int_field("num_key_value_heads") if cfg.has("num_key_value_heads") else heads
    kv_per_rank = cfg.kv_heads_per_rank("num_key_value_heads", kv_heads, opts.tp)
    for key in head_dim_keys:
        if cfg.has(key):
            return kv_per_rank, cfg.int_field(key)
    hidden = cfg.int_field("hidden_size", why=f"to derive the head size when {head_dim_keys[0]} is absent")
    if hidden is None or heads is None:
        return kv_per_rank, None
    if hidden % heads:
        cfg.problem(head_dim_keys[0], MISSING, f"is absent and hidden_size={hidden} is not divisible by "
                                            f"num_attention_heads={heads}",
                    f"add {head_dim_keys[0]} to the config")
        return kv_per_rank, None
    return kv_per_rank, hidden // heads


def attention_spec(opts: Options, kv_heads: int, head_size: int, window: int | None = None) -> FullAttentionSpec:
    """Full attention, or sliding-window attention when ``window`` is set, in the attention dtype."""
    if window is None:
        return FullAttentionSpec(num_kv_heads=kv_heads, head_size=head_size, dtype=opts.attention_dtype)
    return SlidingWindowSpec(num_kv_heads=kv_heads, head_size=head_size, dtype=opts.attention_dtype, window=window)


def decl(index: int, spec: LayerSpec, backend: str) -> LayerDecl:
    """Layer ``index`` of the full stack, named ``layers.{index}``."""
    return LayerDecl(index=index, name=f"layers.{index}", spec=spec, backend=backend)


def attention_layers(cfg: ConfigReader, opts: Options, kinds: list[str] | None) -> list[LayerDecl]:
    """One attention layer per entry of ``kinds`` (``full_attention`` / ``sliding_attention``).

    Reads the head shape, and ``sliding_window`` when any layer slides; raises every problem
    recorded so far before building.
    """
    kv_heads, head_size = attention_shape(cfg, opts)
    window = None
    if kinds is not None and SLIDING in kinds:
        window = cfg.int_field("sliding_window", why="because some layers use sliding-window attention")
    cfg.raise_if_any()
    assert kinds is not None and kv_heads is not None and head_size is not None
    full = attention_spec(opts, kv_heads, head_size)
    sliding = attention_spec(opts, kv_heads, head_size, window) if window is not None else full
    return [decl(i, sliding if kind == SLIDING else full, opts.attention_backend) for i, kind in enumerate(kinds)]
