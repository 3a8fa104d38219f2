"""Multi-head latent attention (MLA) and the sparse-attention indexer's key cache.

MLA caches one latent of ``kv_lora_rank + rope_dim`` elements per token, shared by all heads
(DeepSeek-V2/V3, Kimi, GLM-4.7-Flash, MiniCPM3, LongCat-Flash), so tensor parallelism does not
shrink it. DeepSeek-V3.2 and GLM-5 add a lightning indexer per layer whose keys are cached too:
``index_head_dim`` fp8 values plus one float32 scale per 128 of them, stored as bytes — 132
``uint8`` per token for ``index_head_dim=128`` (vLLM 0.33 ``DeepseekV32IndexerCache``). Both
keep every token (worst case ``cdiv(max_model_len, block_size)`` pages) and have one "head".

Example::

    >>> MLASpec(kv_lora_rank=512, rope_dim=64).page_size_bytes(64)
    73728
    >>> IndexerKeySpec(head_size=132).page_size_bytes(64)
    8448
"""

from __future__ import annotations

from typing import Any

import attrs

from graphkv.spec._checks import Checker, as_int, cdiv
from graphkv.spec.dtypes import DType
from graphkv.spec.layers._base import LayerKind, PageDemand, RankSpec, check_dtype, dtype_or_raw

__all__ = ["INDEXER_QUANT_BLOCK", "IndexerKeySpec", "MLASpec", "indexer_key_bytes"]

INDEXER_QUANT_BLOCK = 128  # fp8 indexer key values per float32 scale


def indexer_key_bytes(index_head_dim: int) -> int:
    """Bytes one token's indexer key takes: the fp8 values plus a 4-byte scale per 128 of them."""
    return index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * 4


class _LatentCache:
    """Shared behaviour of single-"head" caches that keep every token."""

    head_size: int
    dtype: DType
    page_size_padded: int | None
    is_ssm = False
    holds_cache = True

    @property
    def num_kv_heads(self) -> int:
        """One latent "head"."""
        return 1

    @property
    def value_head_size(self) -> int:
        """A latent has no separate V."""
        return self.head_size

    @property
    def uniform_type_key(self) -> tuple[Any, ...]:
        """Keeps every token, like full attention (vLLM groups both under ``FullAttentionSpec``)."""
        return ("full",)

    def bytes_per_token(self) -> int:
        """Unpadded cache bytes one token takes."""
        return self.head_size * self.dtype.itemsize

    def real_page_size_bytes(self, block_size: int) -> int:
        """Unpadded bytes of one page."""
        return block_size * self.bytes_per_token()

    def page_size_bytes(self, block_size: int) -> int:
        """Bytes of one page as allocated."""
        real = self.real_page_size_bytes(block_size)
        return real if self.page_size_padded is None else max(real, self.page_size_padded)

    def max_pages(self, demand: PageDemand) -> int:
        """Worst-case pages per request: ``cdiv(max_model_len, block_size)``."""
        return cdiv(demand.max_model_len, demand.block_size)

    def per_rank(self, tp_size: int) -> RankSpec:
        """Every rank keeps the whole latent (vLLM 0.33 declares ``max_tp_shards=1``): the same
        spec, replicated on all ``tp_size`` ranks."""
        return RankSpec(spec=self, replicas=tp_size)


@attrs.frozen(kw_only=True, cache_hash=True)
class MLASpec(_LatentCache):
    """Multi-head latent attention: one latent vector of ``kv_lora_rank + rope_dim`` per token.

    page bytes = ``block_size * (kv_lora_rank + rope_dim) * itemsize`` (or ``page_size_padded``).
    """

    kv_lora_rank: int = attrs.field(converter=as_int)
    rope_dim: int = attrs.field(converter=as_int)
    dtype: DType = attrs.field(default=DType.BFLOAT16, converter=dtype_or_raw)
    page_size_padded: int | None = attrs.field(default=None, converter=as_int)

    kind = LayerKind.MLA

    def __attrs_post_init__(self) -> None:
        check = Checker(type(self).__name__)
        check.positive_int("kv_lora_rank", self.kv_lora_rank)
        check.positive_int("rope_dim", self.rope_dim)
        check_dtype(check, "dtype", self.dtype)
        if self.page_size_padded is not None:
            check.positive_int("page_size_padded", self.page_size_padded)
        check.raise_if_any()

    @property
    def head_size(self) -> int:  # type: ignore[override]
        """Elements per token of the single latent "head"."""
        return self.kv_lora_rank + self.rope_dim

    def describe(self) -> str:
        """A short human description."""
        return f"mla {self.kv_lora_rank}+{self.rope_dim} {self.dtype.value}"

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready fields, ``kind`` first."""
        return {"kind": self.kind.value, "kv_lora_rank": self.kv_lora_rank, "rope_dim": self.rope_dim,
                "num_kv_heads": 1, "head_size": self.head_size, "dtype": self.dtype.value}


@attrs.frozen(kw_only=True, cache_hash=True)
class IndexerKeySpec(_LatentCache):
    """The key cache of a sparse-attention indexer: ``head_size`` elements per token.

    page bytes = ``block_size * head_size * itemsize``; the default ``uint8`` holds fp8 keys and
    their scales as raw bytes (:func:`indexer_key_bytes`).
    """

    head_size: int = attrs.field(converter=as_int)
    dtype: DType = attrs.field(default=DType.UINT8, converter=dtype_or_raw)
    page_size_padded: int | None = attrs.field(default=None, converter=as_int)

    kind = LayerKind.INDEXER

    def __attrs_post_init__(self) -> None:
        check = Checker(type(self).__name__)
        check.positive_int("head_size", self.head_size)
        check_dtype(check, "dtype", self.dtype)
        if self.page_size_padded is not None:
            check.positive_int("page_size_padded", self.page_size_padded)
        check.raise_if_any()

    def describe(self) -> str:
        """A short human description."""
        return f"indexer keys {self.head_size} {self.dtype.value}"

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready fields, ``kind`` first."""
        return {"kind": self.kind.value, "num_kv_heads": 1, "head_size": self.head_size, "dtype": self.dtype.value}
