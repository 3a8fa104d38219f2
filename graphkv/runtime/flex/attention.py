"""The flex attention call over a paged kv-first cache, with a mask from :class:`FlexMaskBuilder`.

K and V are the strided views of :mod:`graphkv.runtime.flex.views` (kernel block ``b`` is flex kv block ``b * r``);
the mask lists only kernel blocks, so the bytes between them (V, or other layers' pages) are never attended.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention

from graphkv.errors import Problem, SpecError
from graphkv.runtime.flex.region import flex_kernel_options
from graphkv.runtime.flex.views import flex_kv_block_stride, paged_kv_views

__all__ = ["paged_flex_attention"]




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


def _refuse_compiled_views(device_type: str, compiling: bool) -> None:
    """Compiled on CUDA, flex over ``as_strided`` views of the cache built inside the compiled function
    gives wrong outputs (H200, torch 2.11: every row off by 2-4 from the reference; views built outside
    are right), so that form is refused rather than served."""
    if compiling and device_type == "cuda":
        raise SpecError(Problem(
            field="paged_flex_attention", value="compiled on cuda",
            limit="builds its K/V views with as_strided inside the compiled function, which compiled CUDA flex "
                  "gets wrong (torch 2.11)",
            fix="compile through graphkv.runtime.flex.region.FlexRegions (views built once outside the region), or "
                "call paged_flex_attention eagerly"))


def paged_flex_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_mask: BlockMask, *,
                         scale: float | None = None,
                         return_lse: bool = False) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
    """Attention of packed queries ``[num_tokens_padded, Hq, D]`` over the paged cache.

    ``kv_cache``: kv-first NHD ``(2, num_kernel_blocks, kbs, Hkv, D)``, split or page-local (see
    the module docstring), with the step's new K/V already written; ``Hq`` a multiple of ``Hkv``
    (GQA). ``block_mask``: from :meth:`FlexMaskBuilder.build` with the same ``num_tokens_padded``,
    built for this cache (same pool size and kv block stride, checked: :class:`SpecError`
    otherwise). Returns ``[num_tokens_padded, Hq, D]`` (a view of flex attention's output;
    padding tokens get zeros). ``return_lse=True`` also returns the log-sum-exp of each
    query's scores, ``[num_tokens_padded, Hq]`` float32 (``-inf`` for padding), which attention
    sinks need (eager flex and compiled flex on a GPU give it; torch 2.13's compiled CPU flex
    does not). Capture-safe.

    This is the one-call form (eager, or compiled by a caller on a CPU, which needs torch 2.13 or later:
    :func:`~graphkv.runtime.flex.region.cpu_flex_compiles`): it builds the flat K/V views itself with
    ``as_strided``. Compiled on CUDA it is refused (:class:`SpecError`): compiled CUDA flex over views built inside
    the compiled function was measured wrong on an H200 (torch 2.11). Serving calls
    :class:`~graphkv.runtime.flex.region.FlexRegions` instead, which compiles once per group and phase over views
    built once outside the region.

    Uncompiled flex attention (the eager math path) scores every key of the flat view and only
    then applies the mask, so it reads the bytes between kernel blocks too (V, and in a hybrid
    pool other groups' pages, e.g. Mamba states): they never change the result as long as they
    are finite. Compiled flex reads only the blocks the mask lists.
    """
    _refuse_compiled_views(query.device.type, torch.compiler.is_compiling())
    k, v = paged_kv_views(kv_cache)
    _check_mask_matches_cache(block_mask, kv_cache, k)
    q = query.transpose(0, 1).unsqueeze(0)
    if query.device.type == "cpu":
        # A fresh [1, Hq, T, D] buffer: inductor's CPU flex template reads the 4-D shape off the
        # query's base buffer, which a view of a [T, Hq, D] tensor lacks (torch 2.13).
        q = q.clone(memory_format=torch.contiguous_format)
    q_tile, kbs = block_mask.BLOCK_SIZE
    options = flex_kernel_options(query.device.type, q_tile, kbs)
    if return_lse:
        out, aux = flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True, kernel_options=options,
                                  return_aux=AuxRequest(lse=True))
        return out[0].transpose(0, 1), aux.lse[0].transpose(0, 1)
    out = flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True, kernel_options=options)
    return out[0].transpose(0, 1)
