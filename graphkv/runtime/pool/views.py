"""Typed views of a pool slot's raw bytes: attention caches through a backend's declared layout,
Mamba states at per-state byte offsets inside each page.

Layers of different groups share a slot (``P`` = its page bytes); a page index belongs to one
group at a time, so every layer must map page ``b`` to the same bytes, ``[b * P, (b + 1) * P)``:

- an attention page is split into ``bpk`` kernel blocks at a uniform stride of ``P // bpk``
  bytes (when the page is padded, each kernel block gets an equal share of the padding);
- a kv-first layout is *page-local* (each kernel block laid out physically as ``(2, kbs, H, D)``,
  the view permuted to the logical ``(2, N, kbs, H, D)``) unless every layer of its slot is an
  unpadded kv-first attention layer and no layer of the same groups is page-local in another
  slot (decided by the planner, :mod:`graphkv.plan.layout`); only then K of all pages comes first
  and V after it (the same page-to-bytes map for every layer of the slot). Either way K of one
  NHD layer is a single strided token sequence for flex attention, with ``r = 1`` (split) or
  ``r = 2`` (page-local, unpadded) kernel-block halves between kernel blocks (see
  :mod:`graphkv.runtime.flex.views`); one decision per group keeps ``r`` uniform in a group;
- HND stores each kernel block's K (and V) as ``(H, kbs, D)`` and is permuted to ``(kbs, H, D)``;
- a Mamba state ``i`` is ``(num_blocks, *shape_i)`` at byte offset ``sum(bytes of states < i)``
  with page stride ``P``; the padding sits at the end of each page.

The block dimension is read from :attr:`KVLayout.block_dim` (the declaration), never guessed.
"""

from __future__ import annotations

import math

import attrs
import torch

from graphkv.errors import PlanError, Problem
from graphkv.spec.backends import CacheOrder, KVLayout, StrideOrder

__all__ = ["AttentionGeometry", "StateGeometry", "attention_view", "state_views"]


@attrs.frozen(kw_only=True)
class AttentionGeometry:
    """Where one attention layer's kernel blocks live inside its slot."""

    layer_name: str
    layout: KVLayout
    num_blocks: int  # pages in the pool
    bpk: int  # kernel blocks per page
    kernel_block_size: int  # tokens per kernel block
    num_heads: int  # KV heads (1 for MLA)
    head_size: int
    dtype: torch.dtype
    page_size_bytes: int  # the slot's page bytes (stride between pages)
    page_local: bool  # kv-first only: K and V of each kernel block stay inside its page

    @property
    def num_kernel_blocks(self) -> int:
        """Kernel blocks in the pool: ``num_blocks * bpk``."""
        return self.num_blocks * self.bpk

    @property
    def logical_shape(self) -> tuple[int, ...]:
        """The backend's logical cache shape."""
        return self.layout.logical_shape(self.num_kernel_blocks, self.kernel_block_size, self.num_heads,
                                         self.head_size)


@attrs.frozen(kw_only=True)
class StateGeometry:
    """Where one Mamba layer's state tensors live inside each page of its slot."""

    layer_name: str
    num_blocks: int
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    page_size_bytes: int

    @property
    def offsets_bytes(self) -> tuple[int, ...]:
        """Byte offset of each state inside a page (states packed in order, padding last)."""
        sizes = [math.prod(s) * d.itemsize for s, d in zip(self.shapes, self.dtypes)]
        return tuple(sum(sizes[:i]) for i in range(len(sizes)))


def _misaligned(layer_name: str, what: str, value: int, itemsize: int, fix: str) -> PlanError:
    return PlanError(Problem(field=f"{layer_name}.{what}", value=value,
                             limit=f"must be a multiple of the element size {itemsize} bytes to view it typed",
                             fix=fix))


def attention_view(slot: torch.Tensor, geo: AttentionGeometry) -> torch.Tensor:
    """The layer's cache as a strided view of ``slot`` (``[num_blocks * P] uint8``) with the
    backend's logical shape: blocks-first ``(N, 2, kbs, H, D)``, kv-first ``(2, N, kbs, H, D)`` or
    latent ``(N, kbs, D)``, ``N = num_blocks * bpk``, dtype ``geo.dtype``. No copy; capture-safe."""
    itemsize = geo.dtype.itemsize
    page, bpk = geo.page_size_bytes, geo.bpk
    if page % bpk or (page // bpk) % itemsize:
        raise _misaligned(geo.layer_name, "page_size_bytes / bpk", page // bpk if page % bpk == 0 else page, itemsize,
                          f"pad the page to a multiple of bpk x itemsize = {bpk * itemsize} bytes")
    kb_stride = page // bpk // itemsize  # elements between consecutive kernel blocks
    kbs, heads, dim = geo.kernel_block_size, geo.num_heads, geo.head_size
    halves = 1 if geo.layout.order is CacheOrder.LATENT else 2
    assert halves * kbs * heads * dim <= kb_stride, "a kernel block must fit its share of the page"
    n = geo.num_kernel_blocks
    typed = slot.view(geo.dtype)
    if geo.layout.order is CacheOrder.LATENT:
        return typed.as_strided((n, kbs, dim), (kb_stride, dim, 1))
    half = kbs * heads * dim  # elements of K (or V) of one kernel block
    if geo.layout.stride is StrideOrder.HND:
        tok_s, head_s = dim, kbs * dim
    else:
        tok_s, head_s = heads * dim, dim
    inner = (kbs, heads, dim)
    inner_strides = (tok_s, head_s, 1)
    if geo.layout.order is CacheOrder.BLOCKS_FIRST:
        return typed.as_strided((n, 2, *inner), (kb_stride, half, *inner_strides))
    if geo.layout.order is CacheOrder.KV_FIRST:
        if geo.page_local:
            return typed.as_strided((2, n, *inner), (half, kb_stride, *inner_strides))
        assert kb_stride == 2 * half, "a kv-first split layout needs unpadded pages"
        return typed.as_strided((2, n, *inner), (n * half, half, *inner_strides))
    raise PlanError(Problem(field=f"{geo.layer_name}.kv_layout", value=geo.layout.order.value,
                            limit="a state layout has no attention view", fix="use mamba_states() for state layers"))


def state_views(slot: torch.Tensor, geo: StateGeometry) -> tuple[torch.Tensor, ...]:
    """One view ``(num_blocks, *shape_i)`` per state, page stride ``P`` bytes, at the state's byte
    offset inside the page. No copy; capture-safe."""
    views = []
    for i, (shape, dtype, offset) in enumerate(zip(geo.shapes, geo.dtypes, geo.offsets_bytes)):
        itemsize = dtype.itemsize
        if geo.page_size_bytes % itemsize:
            raise _misaligned(geo.layer_name, "page_size_bytes", geo.page_size_bytes, itemsize,
                              f"pad the Mamba page (page_size_padded) to a multiple of {itemsize} bytes")
        if offset % itemsize:
            raise _misaligned(geo.layer_name, f"state[{i}] byte offset", offset, itemsize,
                              "order the states so wider dtypes come first, or pad the earlier states")
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        views.append(slot.view(dtype).as_strided((geo.num_blocks, *shape), (geo.page_size_bytes // itemsize,
                                                                                *strides), offset // itemsize))
    return tuple(views)
