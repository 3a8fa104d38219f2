"""Read a paged cache view's strides at the positions its backend's :class:`KVLayout` declares.

Kernels address a cache only through ``(block, kv, token, head, dim)`` strides, so one kernel
serves blocks-first, kv-first (split or page-local), NHD, HND and latent caches. The block
dimension comes from the declaration, never from the shape (with two blocks the blocks-first
and kv-first shapes coincide).
"""

from __future__ import annotations

import attrs
import torch

from graphkv.errors import Problem, SpecError
from graphkv.spec.backends import CacheOrder, KVLayout

__all__ = ["CacheStrides", "cache_strides"]


@attrs.frozen(kw_only=True)
class CacheStrides:
    """Element strides and sizes of a cache view, in (block, kv, token, head, dim) order."""

    strides: tuple[int, int, int, int, int]
    num_kernel_blocks: int
    kernel_block_size: int
    num_heads: int
    head_size: int


def cache_strides(kv_cache: torch.Tensor, layout: KVLayout) -> CacheStrides:
    """The strides of ``kv_cache`` (blocks-first ``(N, 2, kbs, H, D)``, kv-first ``(2, N, kbs, H,
    D)`` or latent ``(N, kbs, D)``) as declared by ``layout``; raises :class:`SpecError` for a
    state layout or a tensor whose rank does not match the layout."""
    order = layout.order
    if order is CacheOrder.STATE:
        raise SpecError(Problem(field="layout", value=order.value, limit="state layers have no KV cache",
                                fix="use pool.mamba_states(layer) for Mamba layers"))
    rank = 3 if order is CacheOrder.LATENT else 5
    if kv_cache.dim() != rank or (order is not CacheOrder.LATENT and kv_cache.shape[1 - layout.block_dim] != 2):
        raise SpecError(Problem(field="kv_cache", value=tuple(kv_cache.shape),
                                limit=f"must be the {order.value} cache view ({rank}-D) that layout declares",
                                fix="pass pool.kv_cache(layer) with layout=pool.layout(layer)"))
    s, n = kv_cache.stride(), kv_cache.shape
    if order is CacheOrder.LATENT:
        return CacheStrides(strides=(s[0], 0, s[1], 0, s[2]), num_kernel_blocks=n[0], kernel_block_size=n[1],
                            num_heads=1, head_size=n[2])
    b, kv = layout.block_dim, 1 - layout.block_dim
    return CacheStrides(strides=(s[b], s[kv], s[2], s[3], s[4]), num_kernel_blocks=n[b], kernel_block_size=n[2],
                        num_heads=n[3], head_size=n[4])
