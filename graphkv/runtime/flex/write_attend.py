"""One layer's attention step as one traceable function: write the step's K/V, then paged flex attention.

:func:`write_kv` (``graphkv.runtime.ops``) skips padding slots by selecting the real tokens (a
data-dependent size, so eager work and a host sync on a GPU); here padding tokens (``PAD_SLOT_ID``)
write the first slot of the null page instead — page 0 is never handed out and no block mask
lists it, so what lands there is never attended — which makes the write branch-free. Compiled
together with the attention (``torch.compile(write_and_attend)``) the write is fused into the
same graph: one compiled call per layer instead of an eager write and a compiled attention.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask

from graphkv.runtime.flex.attention import paged_flex_attention

__all__ = ["write_and_attend", "write_kv_padding_to_null"]


def write_kv_padding_to_null(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                             slot_mapping: torch.Tensor) -> None:
    """Write ``key`` / ``value`` ``[num_tokens, Hkv, D]`` (any strides) into the kv-first cache
    view ``(2, num_kernel_blocks, kbs, Hkv, D)`` at ``slot_mapping[:num_tokens]`` (int64; slot
    ``s`` is kernel block ``s // kbs``, token ``s % kbs``); negative (padding) slots write slot 0,
    in the null page. Slots must be below ``num_kernel_blocks * kbs`` (a Step's always are).
    Capture-safe: fixed shapes, no host sync."""
    kbs = kv_cache.shape[2]
    slots = slot_mapping[:key.shape[0]].clamp(min=0)
    index = (slots // kbs, slots % kbs)
    kv_cache[0].index_put_(index, key.to(kv_cache.dtype))
    kv_cache[1].index_put_(index, value.to(kv_cache.dtype))


def write_and_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                     slot_mapping: torch.Tensor, block_mask: BlockMask, *, scale: float | None = None,
                     return_lse: bool = False) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
    """:func:`write_kv_padding_to_null` of the step's ``key`` / ``value``, then
    :func:`~graphkv.runtime.flex.attention.paged_flex_attention` of ``query`` ``[num_tokens, Hq,
    D]`` over the cache with ``block_mask`` (same arguments and result). Capture-safe."""
    write_kv_padding_to_null(key, value, kv_cache, slot_mapping)
    return paged_flex_attention(query, kv_cache, block_mask, scale=scale, return_lse=return_lse)
