"""Attention layer specs: full, sliding-window and chunked-local attention over K and V heads.

page bytes = ``block_size * num_kv_heads * (head_size + head_size_v) * itemsize`` for all three
(``head_size_v`` defaults to ``head_size``; it differs in MiMo-V2); they differ in how many pages
a request holds at worst:

- full: every token, ``cdiv(max_model_len, block_size)``;
- sliding window: the window plus what in-flight steps still hold,
  ``cdiv(min(window - 1 + extra_retained + max_concurrent_batches * max_num_batched_tokens,
  max_model_len), block_size) + 1`` (vLLM 0.33 ``SlidingWindowSpec.max_admission_blocks_per_request``);
- chunked local: ``cdiv(min(chunk + max_concurrent_batches * max_num_batched_tokens,
  max_model_len), block_size)`` (vLLM 0.33 ``ChunkedLocalAttentionSpec.max_admission_blocks_per_request``).

Example::

    >>> FullAttentionSpec(num_kv_heads=8, head_size=128, dtype="bfloat16").page_size_bytes(16)
    65536
"""

from __future__ import annotations

from typing import Any

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec._checks import Checker, as_int, cdiv
from graphkv.spec.dtypes import DType
from graphkv.spec.layers._base import LayerKind, PageDemand, RankSpec, check_dtype, dtype_or_raw
from graphkv.spec.split_rules import Refusal, SplitRule, split_count

__all__ = ["ChunkedLocalSpec", "FullAttentionSpec", "PromotedLocalSpec", "SlidingWindowSpec"]


@attrs.frozen(kw_only=True, cache_hash=True)
class FullAttentionSpec:
    """Full (global causal) attention: every past token is kept.

    page bytes = ``block_size * num_kv_heads * (head_size + head_size_v) * itemsize``, or
    ``page_size_padded`` when set (which must not be smaller).
    """

    num_kv_heads: int = attrs.field(converter=as_int)
    head_size: int = attrs.field(converter=as_int)
    head_size_v: int | None = attrs.field(default=None, converter=as_int)
    dtype: DType = attrs.field(default=DType.BFLOAT16, converter=dtype_or_raw)
    page_size_padded: int | None = attrs.field(default=None, converter=as_int)

    kind = LayerKind.FULL_ATTENTION
    is_ssm = False
    holds_cache = True

    def __attrs_post_init__(self) -> None:
        check = Checker(type(self).__name__)
        self._check_fields(check)
        check.raise_if_any()

    def _check_fields(self, check: Checker) -> None:
        check.positive_int("num_kv_heads", self.num_kv_heads)
        check.positive_int("head_size", self.head_size)
        if self.head_size_v is not None:
            check.positive_int("head_size_v", self.head_size_v)
        check_dtype(check, "dtype", self.dtype)
        if self.page_size_padded is not None:
            check.positive_int("page_size_padded", self.page_size_padded)

    @property
    def value_head_size(self) -> int:
        """Head size of V (defaults to ``head_size``)."""
        return self.head_size if self.head_size_v is None else self.head_size_v

    @property
    def uniform_type_key(self) -> tuple[Any, ...]:
        """Layers with equal keys need the same number of pages per request, whatever their page
        sizes, so they may share one group with a slot each (vLLM's ``UniformTypeKVCacheSpecs``)."""
        return ("full",)

    def bytes_per_token(self) -> int:
        """Unpadded cache bytes one token takes in this layer."""
        return self.num_kv_heads * (self.head_size + self.value_head_size) * self.dtype.itemsize

    def real_page_size_bytes(self, block_size: int) -> int:
        """Unpadded bytes of one page."""
        return block_size * self.bytes_per_token()

    def page_size_bytes(self, block_size: int) -> int:
        """Bytes of one page as allocated (padded if ``page_size_padded`` is set)."""
        real = self.real_page_size_bytes(block_size)
        return real if self.page_size_padded is None else max(real, self.page_size_padded)

    def max_pages(self, demand: PageDemand) -> int:
        """Worst-case pages per request: ``cdiv(max_model_len, block_size)``."""
        return cdiv(demand.max_model_len, demand.block_size)

    def per_rank(self, tp_size: int) -> RankSpec:
        """This spec (``num_kv_heads`` = the model's KV heads) as one of ``tp_size`` ranks caches it:
        ``num_kv_heads / tp`` heads, or one head replicated on ``tp / num_kv_heads`` ranks when
        ``tp`` exceeds them (vLLM 0.33). Raises :class:`SpecError` naming ``num_kv_heads`` when
        ``tp`` cannot split them."""
        split = split_count(self.num_kv_heads, tp_size, SplitRule.KV_HEADS, name="num_kv_heads")
        if isinstance(split, Refusal):
            raise SpecError(Problem(field=f"{type(self).__name__}.num_kv_heads", value=self.num_kv_heads,
                                    limit=split.limit, fix=split.fix))
        return RankSpec(spec=attrs.evolve(self, num_kv_heads=split.per_rank), replicas=split.replicas)

    def describe(self) -> str:
        """A short human description."""
        v = "" if self.head_size_v is None or self.head_size_v == self.head_size else f"/{self.head_size_v}"
        return f"{self.kind.value} {self.num_kv_heads}x{self.head_size}{v} {self.dtype.value}"

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready fields, ``kind`` first."""
        fields: dict[str, Any] = {"kind": self.kind.value, "num_kv_heads": self.num_kv_heads,
                                  "head_size": self.head_size, "head_size_v": self.value_head_size,
                                  "dtype": self.dtype.value}
        if self.page_size_padded is not None:
            fields["page_size_padded"] = self.page_size_padded
        return fields


@attrs.frozen(kw_only=True, cache_hash=True)
class SlidingWindowSpec(FullAttentionSpec):
    """Sliding-window attention over the last ``window`` tokens.

    Worst case per request: ``cdiv(min(window - 1 + extra_retained_tokens + max_concurrent_batches
    * max_num_batched_tokens, max_model_len), block_size) + 1`` pages — out-of-window pages are
    freed only for processed tokens, so every step still in flight keeps its pages, and the +1
    is because a window can start inside a page.
    """

    window: int = attrs.field(converter=as_int)

    kind = LayerKind.SLIDING_WINDOW

    def _check_fields(self, check: Checker) -> None:
        super()._check_fields(check)
        check.positive_int("window", self.window)

    @property
    def uniform_type_key(self) -> tuple[Any, ...]:
        """Sliding layers with one window need the same pages, whatever their head sizes."""
        return ("sliding", self.window)

    def max_pages(self, demand: PageDemand) -> int:
        """Worst-case pages a request holds at once inside its window."""
        # vLLM 0.33: SlidingWindowSpec.max_admission_blocks_per_request (window, retained and in-flight tokens)
        tokens = min(self.window - 1 + demand.extra_retained_tokens + demand.in_flight_tokens, demand.max_model_len)
        return cdiv(tokens, demand.block_size) + 1

    def describe(self) -> str:
        """A short human description."""
        return f"{super().describe()} window={self.window}"

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready fields, with ``sliding_window``."""
        return {**super().to_dict(), "sliding_window": self.window}


@attrs.frozen(kw_only=True, cache_hash=True)
class ChunkedLocalSpec(FullAttentionSpec):
    """Chunked local attention (Llama-4): tokens attend within fixed chunks of ``chunk`` tokens.

    Worst case per request: ``cdiv(min(chunk + max_concurrent_batches * max_num_batched_tokens,
    max_model_len), block_size)``.
    """

    chunk: int = attrs.field(converter=as_int)

    kind = LayerKind.CHUNKED_LOCAL

    def _check_fields(self, check: Checker) -> None:
        super()._check_fields(check)
        check.positive_int("chunk", self.chunk)

    @property
    def uniform_type_key(self) -> tuple[Any, ...]:
        """Chunked layers with one chunk size need the same pages."""
        return ("chunked", self.chunk)

    def max_pages(self, demand: PageDemand) -> int:
        """Worst-case pages a request holds at once inside its chunk."""
        # vLLM 0.33: ChunkedLocalAttentionSpec.max_admission_blocks_per_request (chunk plus in-flight tokens)
        tokens = min(self.chunk + demand.in_flight_tokens, demand.max_model_len)
        return cdiv(tokens, demand.block_size)

    def describe(self) -> str:
        """A short human description."""
        return f"{super().describe()} chunk={self.chunk}"

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready fields, with ``attention_chunk_size``."""
        return {**super().to_dict(), "attention_chunk_size": self.chunk}


@attrs.frozen(kw_only=True, cache_hash=True)
class PromotedLocalSpec(FullAttentionSpec):
    """A sliding-window or chunked-local layer whose cache is allocated as full attention.

    vLLM 0.33 does this when ``--disable-hybrid-kv-cache-manager`` is set and, on its own, when
    page sizes cannot be unified beside MLA (:mod:`graphkv.plan.promotion`): the layer keeps
    every token's page (``cdiv(max_model_len, block_size)`` per request, nothing freed below the
    window) and groups with full attention, while its attention still reads only its window or
    chunk. ``local`` is the layer's own spec; the page is the same.

    >>> local = SlidingWindowSpec(num_kv_heads=8, head_size=64, window=128)
    >>> PromotedLocalSpec.of(local).describe()
    'full_attention 8x64 bfloat16 (promoted from sliding window=128)'
    """

    local: SlidingWindowSpec | ChunkedLocalSpec

    @classmethod
    def of(cls, local: "SlidingWindowSpec | ChunkedLocalSpec") -> "PromotedLocalSpec":
        """``local`` allocated as full attention (same heads, dtype and page padding)."""
        return cls(num_kv_heads=local.num_kv_heads, head_size=local.head_size, head_size_v=local.head_size_v,
                   dtype=local.dtype, page_size_padded=local.page_size_padded, local=local)

    @property
    def window(self) -> int | None:
        """The sliding window attention still applies (``None`` for a chunked-local layer)."""
        return getattr(self.local, "window", None)

    @property
    def chunk(self) -> int | None:
        """The chunk attention still applies (``None`` for a sliding-window layer)."""
        return getattr(self.local, "chunk", None)

    def describe(self) -> str:
        """A short human description: full attention, and the local attention it was promoted from."""
        what = f"sliding window={self.window}" if self.window is not None else f"chunked local chunk={self.chunk}"
        return f"{super().describe()} (promoted from {what})"

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready fields: full attention, with the local spec it was promoted from."""
        return {**super().to_dict(), "promoted_from": self.local.to_dict()}
