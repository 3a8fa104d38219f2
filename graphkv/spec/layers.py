"""Layer KV specs: what one layer stores per page, and how many pages a request can need.

Every spec is frozen and keyword-only, validated at construction (all problems reported at
once), and answers two questions the planner asks:

- ``page_size_bytes(block_size)``: bytes one page of ``block_size`` tokens takes for this layer;
- ``max_pages(demand)``: worst-case pages one request needs (see :class:`PageDemand`).

Example::

    >>> spec = FullAttentionSpec(num_kv_heads=8, head_size=128, dtype="bfloat16")
    >>> spec.page_size_bytes(16)
    65536
"""

from __future__ import annotations

import enum
import math
from typing import Any, Union

import attrs

from graphkv.errors import SpecError
from graphkv.spec._checks import Checker, cdiv
from graphkv.spec.dtypes import DType, parse_dtype

__all__ = [
    "ChunkedLocalSpec",
    "FullAttentionSpec",
    "LayerKind",
    "LayerSpec",
    "MLASpec",
    "MambaCacheMode",
    "MambaSpec",
    "PageDemand",
    "SlidingWindowSpec",
]


class LayerKind(enum.Enum):
    """Which family a layer spec belongs to."""

    FULL_ATTENTION = "full_attention"
    SLIDING_WINDOW = "sliding_window"
    CHUNKED_LOCAL = "chunked_local"
    MLA = "mla"
    MAMBA = "mamba"


class MambaCacheMode(enum.Enum):
    """How Mamba states are cached: one live state (none), two for prefix alignment (align), or
    one per page for prefix caching (all)."""

    NONE = "none"
    ALIGN = "align"
    ALL = "all"


@attrs.frozen(kw_only=True)
class PageDemand:
    """The inputs that decide a request's worst-case page count for one layer group."""

    block_size: int
    max_model_len: int
    max_num_batched_tokens: int
    mamba_cache_mode: MambaCacheMode = MambaCacheMode.NONE
    num_speculative_blocks: int = 0


def _dtype_or_raw(value: Any) -> Any:
    """attrs converter: parse dtype names, keep the raw value if unknown so validation reports it."""
    try:
        return parse_dtype(value)
    except SpecError:
        return value


def _check_dtype(check: Checker, field: str, value: Any) -> None:
    if not isinstance(value, DType):
        check.add(field, value, "is not a known dtype", "use e.g. 'bfloat16', 'float16', 'float32' or 'fp8'")


@attrs.frozen(kw_only=True)
class FullAttentionSpec:
    """Full (global causal) attention: every past token is kept.

    page bytes = ``block_size * num_kv_heads * (head_size + head_size_v) * itemsize``, or
    ``page_size_padded`` when set (which must not be smaller).
    """

    num_kv_heads: int
    head_size: int
    head_size_v: int | None = None
    dtype: DType = attrs.field(default=DType.BFLOAT16, converter=_dtype_or_raw)
    page_size_padded: int | None = None

    kind = LayerKind.FULL_ATTENTION
    is_ssm = False

    def __attrs_post_init__(self) -> None:
        check = Checker(type(self).__name__)
        self._check_fields(check)
        check.raise_if_any()

    def _check_fields(self, check: Checker) -> None:
        check.positive_int("num_kv_heads", self.num_kv_heads)
        check.positive_int("head_size", self.head_size)
        if self.head_size_v is not None:
            check.positive_int("head_size_v", self.head_size_v)
        _check_dtype(check, "dtype", self.dtype)
        if self.page_size_padded is not None:
            check.positive_int("page_size_padded", self.page_size_padded)

    @property
    def value_head_size(self) -> int:
        """Head size of V (defaults to ``head_size``)."""
        return self.head_size if self.head_size_v is None else self.head_size_v

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

    def describe(self) -> str:
        """A short human description."""
        v = "" if self.head_size_v is None else f"/{self.head_size_v}"
        return f"{self.kind.value} {self.num_kv_heads}x{self.head_size}{v} {self.dtype.value}"


@attrs.frozen(kw_only=True)
class SlidingWindowSpec(FullAttentionSpec):
    """Sliding-window attention over the last ``window`` tokens.

    Worst case per request: ``cdiv(min(window - 1 + max_num_batched_tokens, max_model_len),
    block_size) + 1`` pages (the +1 because a window can start inside a page).
    """

    window: int

    kind = LayerKind.SLIDING_WINDOW

    def _check_fields(self, check: Checker) -> None:
        super()._check_fields(check)
        check.positive_int("window", self.window)

    def max_pages(self, demand: PageDemand) -> int:
        """Worst-case pages a request holds at once inside its window."""
        tokens = min(self.window - 1 + demand.max_num_batched_tokens, demand.max_model_len)
        return cdiv(tokens, demand.block_size) + 1

    def describe(self) -> str:
        """A short human description."""
        return f"{super().describe()} window={self.window}"


@attrs.frozen(kw_only=True)
class ChunkedLocalSpec(FullAttentionSpec):
    """Chunked local attention: tokens attend within fixed chunks of ``chunk`` tokens.

    Worst case per request: ``cdiv(min(chunk + max_num_batched_tokens, max_model_len), block_size)``.
    """

    chunk: int

    kind = LayerKind.CHUNKED_LOCAL

    def _check_fields(self, check: Checker) -> None:
        super()._check_fields(check)
        check.positive_int("chunk", self.chunk)

    def max_pages(self, demand: PageDemand) -> int:
        """Worst-case pages a request holds at once inside its chunk."""
        tokens = min(self.chunk + demand.max_num_batched_tokens, demand.max_model_len)
        return cdiv(tokens, demand.block_size)

    def describe(self) -> str:
        """A short human description."""
        return f"{super().describe()} chunk={self.chunk}"


@attrs.frozen(kw_only=True)
class MLASpec:
    """Multi-head latent attention: one latent vector of ``kv_lora_rank + rope_dim`` per token.

    page bytes = ``block_size * (kv_lora_rank + rope_dim) * itemsize`` (or ``page_size_padded``).
    """

    kv_lora_rank: int
    rope_dim: int
    dtype: DType = attrs.field(default=DType.BFLOAT16, converter=_dtype_or_raw)
    page_size_padded: int | None = None

    kind = LayerKind.MLA
    is_ssm = False

    def __attrs_post_init__(self) -> None:
        check = Checker(type(self).__name__)
        check.positive_int("kv_lora_rank", self.kv_lora_rank)
        check.positive_int("rope_dim", self.rope_dim)
        _check_dtype(check, "dtype", self.dtype)
        if self.page_size_padded is not None:
            check.positive_int("page_size_padded", self.page_size_padded)
        check.raise_if_any()

    @property
    def head_size(self) -> int:
        """Elements per token of the single latent "head"."""
        return self.kv_lora_rank + self.rope_dim

    @property
    def num_kv_heads(self) -> int:
        """MLA caches one latent "head"."""
        return 1

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

    def describe(self) -> str:
        """A short human description."""
        return f"mla {self.kv_lora_rank}+{self.rope_dim} {self.dtype.value}"


def _shapes(value: Any) -> Any:
    try:
        return tuple(tuple(int(d) for d in shape) for shape in value)
    except (TypeError, ValueError):
        return value


def _dtypes(value: Any) -> Any:
    if isinstance(value, (str, DType)):
        return (_dtype_or_raw(value),)
    try:
        return tuple(_dtype_or_raw(v) for v in value)
    except TypeError:
        return value


@attrs.frozen(kw_only=True)
class MambaSpec:
    """Recurrent state of a Mamba / gated-delta / linear-attention layer.

    ``shapes`` are the per-request state tensors (e.g. conv ``(k - 1, conv_dim)`` and ssm
    ``(heads, head_dim, state)``), ``dtypes`` one per shape. A page holds one whole state:
    page bytes = ``sum(prod(shape) * itemsize)``, independent of ``block_size``, or
    ``page_size_padded`` when set (the planner pads it to the attention page in hybrid models).
    ``chunk_size`` is the kernel's chunk length in tokens (used by prefix-caching mode ``all``).
    """

    shapes: tuple[tuple[int, ...], ...] = attrs.field(converter=_shapes)
    dtypes: tuple[DType, ...] = attrs.field(converter=_dtypes)
    variant: str = "mamba2"
    chunk_size: int = 256
    page_size_padded: int | None = None

    kind = LayerKind.MAMBA
    is_ssm = True

    def __attrs_post_init__(self) -> None:
        check = Checker(type(self).__name__)
        shapes_ok = isinstance(self.shapes, tuple) and len(self.shapes) > 0
        if not shapes_ok:
            check.add("shapes", self.shapes, "must be a non-empty tuple of shapes",
                      "pass e.g. shapes=((3, 8192), (64, 64, 128))")
        else:
            for i, shape in enumerate(self.shapes):
                if not shape or any(d <= 0 for d in shape):
                    check.add(f"shapes[{i}]", shape, "every dimension must be > 0",
                              "derive the state shape from positive config sizes")
        if not isinstance(self.dtypes, tuple):
            check.add("dtypes", self.dtypes, "must be a tuple of dtypes", "pass one dtype per state shape")
        else:
            for i, dt in enumerate(self.dtypes):
                _check_dtype(check, f"dtypes[{i}]", dt)
            if shapes_ok and len(self.dtypes) != len(self.shapes):
                names = tuple(dt.value if isinstance(dt, DType) else dt for dt in self.dtypes)
                check.add("dtypes", names,
                          f"needs one dtype per shape ({len(self.shapes)} shapes, {len(names)} dtypes)",
                          "pass as many dtypes as shapes")
        check.positive_int("chunk_size", self.chunk_size)
        if self.page_size_padded is not None and check.positive_int("page_size_padded", self.page_size_padded):
            if not check.problems and self.page_size_padded < self.real_page_size_bytes():
                check.add("page_size_padded", self.page_size_padded,
                          f"must be >= the real state size {self.real_page_size_bytes()} bytes",
                          "leave page_size_padded unset or raise it")
        check.raise_if_any()

    def state_bytes(self) -> tuple[int, ...]:
        """Bytes of each state tensor."""
        return tuple(math.prod(s) * dt.itemsize for s, dt in zip(self.shapes, self.dtypes))

    def real_page_size_bytes(self, block_size: int = 0) -> int:
        """Unpadded bytes of one whole state (``block_size`` is ignored)."""
        return sum(self.state_bytes())

    def page_size_bytes(self, block_size: int = 0) -> int:
        """Bytes of one page as allocated (``block_size`` is ignored)."""
        real = self.real_page_size_bytes()
        return real if self.page_size_padded is None else self.page_size_padded

    def bytes_per_token(self) -> int:
        """Mamba state does not grow per token."""
        return 0

    def max_pages(self, demand: PageDemand) -> int:
        """Pages per request: 1 (none), 2 (align) or cdiv(max_model_len, block_size) (all), plus
        one per speculative block."""
        if demand.mamba_cache_mode is MambaCacheMode.ALL:
            base = cdiv(demand.max_model_len, demand.block_size)
        elif demand.mamba_cache_mode is MambaCacheMode.ALIGN:
            base = 2
        else:
            base = 1
        return base + demand.num_speculative_blocks

    def describe(self) -> str:
        """A short human description."""
        parts = " + ".join(f"{s}:{d.value}" for s, d in zip(self.shapes, self.dtypes))
        return f"{self.variant} state {parts}"


LayerSpec = Union[FullAttentionSpec, SlidingWindowSpec, ChunkedLocalSpec, MLASpec, MambaSpec]
