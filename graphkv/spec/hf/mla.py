"""Latent attention from a config: a config with ``kv_lora_rank`` (or MLA's split
``qk_nope_head_dim`` / ``qk_rope_head_dim``) caches MLA latents.

Each token caches ``kv_lora_rank + qk_rope_head_dim`` elements (512 + 64 for DeepSeek-V3,
Kimi, GLM-4.7-Flash and LongCat-Flash; 256 + 32 for MiniCPM3), shared by all heads, so every
rank keeps the whole latent. ``indexed_attention`` layers (DeepSeek-V3.2, GLM-5) also cache the
indexer's keys: ``index_head_dim`` fp8 values and their scales, 132 bytes for 128
(:func:`~graphkv.spec.layers.indexer_key_bytes`). Multi-token-prediction layers
(``num_nextn_predict_layers``) are drafters and are not counted.
"""

from __future__ import annotations

from graphkv.spec.hf._reader import ConfigReader, Options
from graphkv.spec.hf.attention import query_heads
from graphkv.spec.layers import IndexerKeySpec, MLASpec, indexer_key_bytes

__all__ = ["MLAReader", "is_mla"]


def is_mla(cfg: ConfigReader) -> bool:
    """Whether attention layers of this config cache MLA latents (it names a latent rank or the
    split nope / rope query head sizes only MLA uses)."""
    return any(cfg.has(k) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim"))


class MLAReader:
    """One MLA spec (and indexer spec, when asked) for every latent-attention layer."""

    def __init__(self, cfg: ConfigReader, opts: Options, *, indexed: bool) -> None:
        query_heads(cfg, opts)
        rank = cfg.int_field("kv_lora_rank", cap="dim")
        rope = cfg.int_field("qk_rope_head_dim", cap="dim")
        self.latent = None if rank is None or rope is None else MLASpec(kv_lora_rank=rank, rope_dim=rope,
                                                                         dtype=opts.attention_dtype)
        self.indexer = None
        if indexed:
            dim = cfg.int_field("index_head_dim", cap="dim", why="because some layers use indexed (sparse) attention")
            self.indexer = None if dim is None else IndexerKeySpec(head_size=indexer_key_bytes(dim))
