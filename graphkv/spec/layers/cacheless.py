"""Layers that hold no cache of their own, declared so a plan can say what every layer became.

- :class:`KVSharedSpec`: an attention layer that reads an earlier layer's cache (Gemma-3n and
  Gemma-4 share the last ``num_kv_shared_layers`` layers' KV with the last earlier layer of the
  same attention type);
- :class:`NoCacheSpec`: a block that keeps nothing between steps (Nemotron-H's MLP / MoE layers).

Both take 0 bytes per page and 0 pages per request; the planner lists them but never groups them.

Example::

    >>> KVSharedSpec(source="layers.18").page_size_bytes(16)
    0
"""

from __future__ import annotations

from typing import Any

import attrs

from graphkv.spec._checks import Checker
from graphkv.spec.layers._base import LayerKind, PageDemand

__all__ = ["CachelessSpec", "KVSharedSpec", "NoCacheSpec"]


class _Cacheless:
    """Zero pages, zero bytes."""

    is_ssm = False
    holds_cache = False

    def page_size_bytes(self, block_size: int = 0) -> int:
        """A layer without a cache of its own takes no page bytes."""
        return 0

    def real_page_size_bytes(self, block_size: int = 0) -> int:
        """No bytes."""
        return 0

    def bytes_per_token(self) -> int:
        """No bytes."""
        return 0

    def max_pages(self, demand: PageDemand) -> int:
        """No pages."""
        return 0


@attrs.frozen(kw_only=True, cache_hash=True)
class KVSharedSpec(_Cacheless):
    """An attention layer that reads the cache of layer ``source`` (a layer name) and writes none."""

    source: str

    kind = LayerKind.KV_SHARED

    def __attrs_post_init__(self) -> None:
        check = Checker(type(self).__name__)
        if not isinstance(self.source, str) or not self.source:
            check.add("source", self.source, "must name the layer whose cache is read",
                      "pass e.g. source='layers.18'")
        check.raise_if_any()

    def describe(self) -> str:
        """A short human description."""
        return f"reads {self.source}'s cache"

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready fields, ``kind`` first."""
        return {"kind": self.kind.value, "source": self.source}


@attrs.frozen(kw_only=True, cache_hash=True)
class NoCacheSpec(_Cacheless):
    """A layer that keeps nothing between steps; ``role`` says what it computes (``mlp``, ``moe``)."""

    role: str = "mlp"

    kind = LayerKind.NO_CACHE

    def __attrs_post_init__(self) -> None:
        check = Checker(type(self).__name__)
        if not isinstance(self.role, str) or not self.role:
            check.add("role", self.role, "must be a non-empty name", "pass e.g. role='mlp'")
        check.raise_if_any()

    def describe(self) -> str:
        """A short human description."""
        return f"{self.role} (no cache)"

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready fields, ``kind`` first."""
        return {"kind": self.kind.value, "role": self.role}


CachelessSpec = KVSharedSpec | NoCacheSpec
"""A spec of a layer that holds no cache of its own."""
