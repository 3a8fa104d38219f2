"""Layer KV specs: what one layer stores per page, and how many pages a request can need.

Every spec is frozen and keyword-only, validated at construction (all problems reported at
once), and answers two questions the planner asks:

- ``page_size_bytes(block_size)``: bytes one page of ``block_size`` tokens takes for this layer;
- ``max_pages(demand)``: worst-case pages one request needs (see :class:`PageDemand`).

One module per idea: :mod:`.attention` (full, sliding window, chunked local), :mod:`.mla` (latent
attention and the indexer's key cache), :mod:`.state` (every recurrent state), :mod:`.cacheless`
(KV-shared layers and layers that hold nothing).

Example::

    >>> spec = FullAttentionSpec(num_kv_heads=8, head_size=128, dtype="bfloat16")
    >>> spec.page_size_bytes(16)
    65536
"""

from __future__ import annotations

from typing import Union

from graphkv.spec.layers._base import LayerKind, MambaCacheMode, PageDemand, RankSpec
from graphkv.spec.layers.attention import ChunkedLocalSpec, FullAttentionSpec, PromotedLocalSpec, SlidingWindowSpec
from graphkv.spec.layers.cacheless import CachelessSpec, KVSharedSpec, NoCacheSpec
from graphkv.spec.layers.mla import IndexerKeySpec, MLASpec, indexer_key_bytes
from graphkv.spec.layers.state import STATE_VARIANTS, MambaSpec
from graphkv.spec.layers.state_split import SplitCount, StateSplit

__all__ = [
    "CachelessSpec",
    "ChunkedLocalSpec",
    "FullAttentionSpec",
    "IndexerKeySpec",
    "KVSharedSpec",
    "LayerKind",
    "LayerSpec",
    "MLASpec",
    "MambaCacheMode",
    "MambaSpec",
    "NoCacheSpec",
    "PageDemand",
    "RankSpec",
    "PromotedLocalSpec",
    "STATE_VARIANTS",
    "SlidingWindowSpec",
    "SplitCount",
    "StateSplit",
    "indexer_key_bytes",
    "kind_label",
]

LayerSpec = Union[FullAttentionSpec, PromotedLocalSpec, SlidingWindowSpec, ChunkedLocalSpec, MLASpec, IndexerKeySpec, MambaSpec]
"""A spec of a layer that holds a cache."""


def kind_label(spec: "LayerSpec | CachelessSpec") -> str:
    """The kind of ``spec`` as a user reads it: the state variant for recurrent layers
    (``mamba2``, ``gated_delta``, …), the kind's value otherwise."""
    return spec.variant if isinstance(spec, MambaSpec) else spec.kind.value
