"""The flat K/V views flex attention reads from a paged kv-first cache (no copy).

Flex attention wants K and V as ``[1, H, kv_len, D]`` tensors with one token stride. A kv-first
cache ``(2, N, kbs, H, D)`` (NHD) gives that without a copy whenever the stride between kernel
blocks is a whole number ``r`` of kernel-block halves (``kbs * H * D`` elements):

- the *split* layout (K of all kernel blocks, then V): ``r = 1``, K is simply contiguous;
- the *page-local* layout of a pool shared with Mamba states (each kernel block physically
  ``(2, kbs, H, D)``, see :mod:`graphkv.runtime.pool.views`): ``r = 2`` (more with page padding).

K is then the strided view whose token ``j`` sits ``j * H * D`` elements after K of kernel block
0, so kernel block ``b``'s tokens are flex kv indices ``b*r*kbs .. b*r*kbs + kbs - 1`` (flex kv
block ``b*r``); the flex kv blocks in between hold V or other layers' bytes and are never listed
by the mask. The view stops after the last kernel block: ``kv_len = ((N - 1) * r + 1) * kbs``.
"""

from __future__ import annotations

import torch

from graphkv.errors import Problem, SpecError

__all__ = ["flex_kv_block_stride", "flex_kv_tokens", "paged_kv_views"]


def flex_kv_tokens(num_kernel_blocks: int, kernel_block_size: int, kv_block_stride: int) -> int:
    """Length of the flat K/V flex view of a kv-first cache: ``((num_kernel_blocks - 1) *
    kv_block_stride + 1) * kernel_block_size`` tokens, so it ends with the last kernel block and
    never runs past the storage (kernel block ``b`` is flex kv block ``b * kv_block_stride``)."""
    return ((num_kernel_blocks - 1) * kv_block_stride + 1) * kernel_block_size


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

    Example (the tiny hybrid "MAMA", 8 pages: its attention layers share slots with Mamba layers)::

        >>> import graphkv
        >>> from graphkv.models.tiny_hybrid import TinyHybridConfig, model_kv
        >>> plan = graphkv.compile(model_kv(TinyHybridConfig(pattern="MAMA")), graphkv.Limits(
        ...     max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32, num_blocks_override=8))
        >>> from graphkv.runtime import allocate
        >>> k, v = paged_kv_views(allocate(plan, "cpu").kv_cache("layers.1"))  # page-local: r = 2
        >>> tuple(k.shape)  # (1, H, ((8 - 1) * 2 + 1) * 16, D)
        (1, 2, 240, 16)
    """
    r = flex_kv_block_stride(kv_cache)
    _, nkb, kbs, heads, dim = kv_cache.shape
    kv_len = flex_kv_tokens(nkb, kbs, r)
    size = (1, heads, kv_len, dim)
    stride = (kv_len * heads * dim, dim, heads * dim, 1)  # the batch stride is never used (size 1)
    # as_strided keeps the storage offset of the tensor it is called on (K or V of kernel block
    # 0); dynamo cannot trace an explicit storage_offset() (it returns an int).
    return kv_cache[0].as_strided(size, stride), kv_cache[1].as_strided(size, stride)
