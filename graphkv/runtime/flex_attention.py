"""The flex attention call over a paged kv-first cache, with a mask from :class:`FlexMaskBuilder`."""

from __future__ import annotations

import math

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from graphkv.errors import Problem, SpecError

__all__ = ["flex_kernel_options", "paged_flex_attention", "paged_kv_views"]


def paged_kv_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of a kv-first cache ``(2, num_kernel_blocks, kbs, Hkv, D)`` as flattened views
    ``[1, Hkv, num_kernel_blocks * kbs, D]`` (no copy): physical token ``j`` is slot ``j``.

    Raises :class:`SpecError` when a token dimension with one stride cannot be formed (e.g. a
    pool that interleaves each page's K and V)."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise SpecError(Problem(field="kv_cache", value=tuple(kv_cache.shape),
                                limit="must be kv-first (2, num_kernel_blocks, kernel_block_size, heads, head_size)",
                                fix="pass the flex backend's cache view of the layer"))
    _, nkb, kbs, heads, dim = kv_cache.shape
    views = []
    for half in (kv_cache[0], kv_cache[1]):
        try:
            flat = half.view(nkb * kbs, heads, dim)
        except RuntimeError:
            raise SpecError(Problem(field="kv_cache.stride()", value=tuple(kv_cache.stride()),
                                    limit="K and V must each be viewable as (num_kernel_blocks * kbs, heads, "
                                          "head_size)",
                                    fix="give flex layers a slot of their own, unpadded, so that K of all kernel "
                                        "blocks comes first and V after it")) from None
        views.append(flat.transpose(0, 1).unsqueeze(0))
    return views[0], views[1]


def flex_kernel_options(query: torch.Tensor, block_mask: BlockMask) -> dict[str, int | bool] | None:
    """Triton tile sizes compatible with the mask's sparse blocks on CUDA (``None`` on CPU).

    The kernel's key tile must divide the kernel block size (a multiple of 16) and its query tile
    the query tile, so take the largest power of two <= 64 dividing each; one kernel (not the
    short-query decoding one) serves mixed and decode steps alike. Untested on a GPU so far."""
    if query.device.type != "cuda":
        return None
    q_tile, kbs = block_mask.BLOCK_SIZE
    return {"BLOCK_M": math.gcd(q_tile, 64), "BLOCK_N": math.gcd(kbs, 64), "FORCE_USE_FLEX_ATTENTION": True}


def paged_flex_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_mask: BlockMask, *,
                         scale: float | None = None) -> torch.Tensor:
    """Attention of packed queries ``[num_tokens_padded, Hq, D]`` over the paged cache.

    ``kv_cache``: kv-first ``(2, num_kernel_blocks, kbs, Hkv, D)`` with the step's new K/V already
    written; ``Hq`` a multiple of ``Hkv`` (GQA). ``block_mask``: from
    :meth:`FlexMaskBuilder.build` with the same ``num_tokens_padded``. Returns ``[num_tokens_padded,
    Hq, D]`` (a view of flex attention's output; padding tokens get zeros). Capture-safe.
    """
    k, v = paged_kv_views(kv_cache)
    q = query.transpose(0, 1).unsqueeze(0)
    if query.device.type == "cpu":
        # A fresh [1, Hq, T, D] buffer: inductor's CPU flex template reads the 4-D shape off the
        # query's base buffer, which a view of a [T, Hq, D] tensor lacks (torch 2.13).
        q = q.clone(memory_format=torch.contiguous_format)
    out = flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True,
                         kernel_options=flex_kernel_options(query, block_mask))
    return out[0].transpose(0, 1)
