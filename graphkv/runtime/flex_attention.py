"""The flex attention call over a paged kv-first cache, with a mask from :class:`FlexMaskBuilder`.

Flex attention wants K and V as ``[1, H, kv_len, D]`` tensors with one token stride. A kv-first
cache ``(2, N, kbs, H, D)`` (NHD) gives that without a copy whenever the stride between kernel
blocks is a whole number ``r`` of kernel-block halves (``kbs * H * D`` elements):

- the *split* layout (K of all kernel blocks, then V): ``r = 1``, K is simply contiguous;
- the *page-local* layout of a pool shared with Mamba states (each kernel block physically
  ``(2, kbs, H, D)``, see :mod:`graphkv.runtime.kv_views`): ``r = 2`` (more with page padding).

K is then the strided view whose token ``j`` sits ``j * H * D`` elements after K of kernel block
0, so kernel block ``b``'s tokens are flex kv indices ``b*r*kbs .. b*r*kbs + kbs - 1`` (flex kv
block ``b*r``); the flex kv blocks in between hold V or other layers' bytes and are never listed
by the mask. The view stops after the last kernel block: ``kv_len = ((N - 1) * r + 1) * kbs``.
"""

from __future__ import annotations

import math

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from graphkv.errors import Problem, SpecError
from graphkv.runtime.flex_geometry import flex_kv_tokens

__all__ = ["flex_kernel_options", "flex_kv_block_stride", "paged_flex_attention", "paged_kv_views"]



def flex_kv_block_stride(kv_cache: torch.Tensor) -> int:
    """Flex kv blocks between consecutive kernel blocks, ``r``, of a kv-first NHD cache view
    ``(2, N, kbs, H, D)``: ``stride(1) // (kbs * H * D)`` (1 for the split layout, 2 for an
    unpadded page-local one; 1 when ``N == 1``). Reads strides only; capture-safe.

    Raises :class:`SpecError` naming the shape or strides when K (or V) cannot be one strided
    token sequence: not kv-first, HND with more than one head, or a kernel-block stride that is
    not a whole number of kernel-block halves (e.g. odd page padding).

    Example::

        >>> flex_kv_block_stride(torch.zeros(2, 5, 16, 2, 8))  # split
        1
        >>> flex_kv_block_stride(torch.zeros(5, 2, 16, 2, 8).transpose(0, 1))  # page-local
        2
    """
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise SpecError(Problem(field="kv_cache", value=tuple(kv_cache.shape),
                                limit="must be kv-first (2, num_kernel_blocks, kernel_block_size, heads, head_size)",
                                fix="pass the flex backend's cache view of the layer"))
    _, nkb, kbs, heads, dim = kv_cache.shape
    strides = kv_cache.stride()
    want = {2: heads * dim, 3: dim, 4: 1}  # NHD inside a kernel block; size-1 dims may have any stride
    if any(kv_cache.shape[d] > 1 and strides[d] != s for d, s in want.items()):
        raise SpecError(Problem(field="kv_cache.stride()", value=tuple(strides),
                                limit=f"tokens, heads and head dim must have strides ({heads * dim}, {dim}, 1) "
                                      "(NHD inside each kernel block)",
                                fix="give flex layers a kv-first NHD backend layout and pass pool.kv_cache(layer)"))
    if nkb == 1:
        return 1
    half = kbs * heads * dim
    if strides[1] <= 0 or strides[1] % half:
        raise SpecError(Problem(field="kv_cache.stride(1)", value=strides[1],
                                limit=f"the kernel-block stride must be a positive multiple of kbs x heads x "
                                      f"head_size = {half} elements so that K forms one token sequence",
                                fix=f"pad the page (page_size_padded) so that each kernel block gets a multiple of "
                                    f"{half * kv_cache.element_size()} bytes, or leave it unpadded"))
    return strides[1] // half


def paged_kv_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of a kv-first NHD cache ``(2, N, kbs, Hkv, D)`` as strided views ``[1, Hkv,
    kv_len, D]`` of its storage (no copy), ``kv_len = ((N - 1) * r + 1) * kbs`` with ``r =
    flex_kv_block_stride(kv_cache)``: kernel block ``b``'s token ``t`` is kv index ``b*r*kbs + t``.
    Capture-safe. Raises :class:`SpecError` like :func:`flex_kv_block_stride`.

    Example::

        >>> k, v = paged_kv_views(pool.kv_cache("layers.1"))  # page-local: r = 2
        >>> k.shape                                           # (1, 2, (2 * N - 1) * 16, 16)
    """
    r = flex_kv_block_stride(kv_cache)
    _, nkb, kbs, heads, dim = kv_cache.shape
    kv_len = flex_kv_tokens(nkb, kbs, r)
    size = (1, heads, kv_len, dim)
    stride = (kv_len * heads * dim, dim, heads * dim, 1)  # the batch stride is never used (size 1)
    # as_strided keeps the storage offset of the tensor it is called on (K or V of kernel block
    # 0); dynamo cannot trace an explicit storage_offset() (it returns an int).
    return kv_cache[0].as_strided(size, stride), kv_cache[1].as_strided(size, stride)


def flex_kernel_options(query: torch.Tensor, block_mask: BlockMask) -> dict[str, int | bool] | None:
    """Triton tile sizes compatible with the mask's sparse blocks on CUDA (``None`` on CPU).

    The kernel's key tile must divide the kernel block size (a multiple of 16) and its query tile
    the query tile, so take the largest power of two <= 64 dividing each; one kernel (not the
    short-query decoding one) serves mixed and decode steps alike. Untested on a GPU so far."""
    if query.device.type != "cuda":
        return None
    q_tile, kbs = block_mask.BLOCK_SIZE
    return {"BLOCK_M": math.gcd(q_tile, 64), "BLOCK_N": math.gcd(kbs, 64), "FORCE_USE_FLEX_ATTENTION": True}


def _check_mask_matches_cache(block_mask: BlockMask, kv_cache: torch.Tensor, k: torch.Tensor) -> None:
    # Python ints only: free in eager, constant-folded under torch.compile. The mask's key length
    # encodes the builder's kv block stride r (and pool size), so a mask built for the split
    # layout used on a page-local cache, or vice versa, is caught here.
    kbs, kv_len = kv_cache.shape[2], k.shape[2]
    if block_mask.BLOCK_SIZE[1] != kbs or block_mask.seq_lengths[1] != kv_len:
        raise SpecError(Problem(
            field="block_mask", value={"kv_tokens": block_mask.seq_lengths[1], "kv_block": block_mask.BLOCK_SIZE[1]},
            limit=f"must match the cache's flex view: kv_tokens={kv_len} (num_kernel_blocks={kv_cache.shape[1]}, "
                  f"kv_block_stride={flex_kv_block_stride(kv_cache)}), kv_block={kbs}",
            fix="build the mask with FlexMaskBuilder.from_plan(plan, group, ...) for the plan the pool was allocated "
                "from (or pass FlexMaskGeometry(kv_block_stride=flex_kv_block_stride(kv_cache)))"))


def paged_flex_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_mask: BlockMask, *,
                         scale: float | None = None) -> torch.Tensor:
    """Attention of packed queries ``[num_tokens_padded, Hq, D]`` over the paged cache.

    ``kv_cache``: kv-first NHD ``(2, num_kernel_blocks, kbs, Hkv, D)``, split or page-local (see
    the module docstring), with the step's new K/V already written; ``Hq`` a multiple of ``Hkv``
    (GQA). ``block_mask``: from :meth:`FlexMaskBuilder.build` with the same ``num_tokens_padded``,
    built for this cache (same pool size and kv block stride, checked: :class:`SpecError`
    otherwise). Returns ``[num_tokens_padded, Hq, D]`` (a view of flex attention's output;
    padding tokens get zeros). Capture-safe.

    Uncompiled flex attention (the eager math path) scores every key of the flat view and only
    then applies the mask, so it reads the bytes between kernel blocks too (V, and in a hybrid
    pool other groups' pages, e.g. Mamba states): they never change the result as long as they
    are finite. Compiled flex reads only the blocks the mask lists.
    """
    k, v = paged_kv_views(kv_cache)
    _check_mask_matches_cache(block_mask, kv_cache, k)
    q = query.transpose(0, 1).unsqueeze(0)
    if query.device.type == "cpu":
        # A fresh [1, Hq, T, D] buffer: inductor's CPU flex template reads the 4-D shape off the
        # query's base buffer, which a view of a [T, Hq, D] tensor lacks (torch 2.13).
        q = q.clone(memory_format=torch.contiguous_format)
    out = flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True,
                         kernel_options=flex_kernel_options(query, block_mask))
    return out[0].transpose(0, 1)
