"""What every layer spec shares: the kind enum, the page-demand record and dtype validation."""

from __future__ import annotations

import enum
from typing import Any

import attrs

from graphkv.errors import SpecError
from graphkv.spec._checks import Checker
from graphkv.spec.dtypes import DType, parse_dtype

__all__ = ["LayerKind", "MambaCacheMode", "PageDemand", "RankSpec", "check_dtype", "dtype_or_raw"]


class LayerKind(enum.Enum):
    """Which family a layer spec belongs to.

    ``MAMBA`` covers every recurrent state (Mamba1/2, gated-delta, KDA, lightning attention,
    short convolution; the spec's ``variant`` says which). ``KV_SHARED`` and ``NO_CACHE`` layers
    hold no cache of their own: the first reads an earlier layer's cache, the second (an MLP or
    MoE block) keeps nothing.
    """

    FULL_ATTENTION = "full_attention"
    SLIDING_WINDOW = "sliding_window"
    CHUNKED_LOCAL = "chunked_local"
    MLA = "mla"
    INDEXER = "indexer"
    MAMBA = "mamba"
    KV_SHARED = "kv_shared"
    NO_CACHE = "none"

    @property
    def is_latent(self) -> bool:
        """A one-"head" latent cache (MLA, the indexer's keys): read in whole token rows, so never
        padded; it needs an MLA backend, and vLLM declares both as ``MLAAttentionSpec``."""
        return self in (LayerKind.MLA, LayerKind.INDEXER)


class MambaCacheMode(enum.Enum):
    """How Mamba states are cached: one live state (none), two for prefix alignment (align), or
    one per page for prefix caching (all)."""

    NONE = "none"
    ALIGN = "align"
    ALL = "all"


@attrs.frozen(kw_only=True)
class PageDemand:
    """The inputs that decide a request's worst-case page count for one layer group.

    ``max_concurrent_batches`` steps may be scheduled but not yet settled; each holds up to
    ``max_num_batched_tokens`` tokens whose out-of-window pages are not freed yet (1 here: a
    single step in flight; :class:`~graphkv.spec.limits.Limits` defaults to 2, as vLLM's async
    scheduling). ``extra_retained_tokens`` are kept below a sliding window for drafters that
    re-prefill them.
    """

    block_size: int
    max_model_len: int
    max_num_batched_tokens: int
    mamba_cache_mode: MambaCacheMode = MambaCacheMode.NONE
    num_speculative_blocks: int = 0
    max_concurrent_batches: int = 1
    extra_retained_tokens: int = 0

    @property
    def in_flight_tokens(self) -> int:
        """Tokens scheduled but not yet settled: ``max_concurrent_batches * max_num_batched_tokens``."""
        return self.max_concurrent_batches * self.max_num_batched_tokens


@attrs.frozen
class RankSpec:
    """What one tensor-parallel rank caches for a layer: its ``spec`` and how many consecutive
    ranks (``replicas``) hold the same cache (KV heads fewer than ``tp``, latents every rank keeps)."""

    spec: Any
    replicas: int = 1


def dtype_or_raw(value: Any) -> Any:
    """attrs converter: parse dtype names, keep the raw value if unknown so validation reports it."""
    try:
        return parse_dtype(value)
    except SpecError:
        return value


def check_dtype(check: Checker, field: str, value: Any) -> None:
    """Record a problem unless ``value`` is a parsed :class:`DType`."""
    if not isinstance(value, DType):
        check.add(field, value, "is not a known dtype", "use e.g. 'bfloat16', 'float16', 'float32' or 'fp8'")
