"""KV write: scatter a step's K/V ``[num_tokens, H, D]`` into a layer's paged cache at its slots.

One kernel serves every layout: the launcher reads the block, K/V, token, head and dim strides
of the cache *view* (``KVPool.kv_cache``) at the positions the backend's :class:`KVLayout`
declares, so blocks-first, kv-first (split or page-local), NHD and HND, and MLA latent caches
are all just strides. Slots equal to ``PAD_SLOT_ID`` (negative) are skipped.
"""

from __future__ import annotations

import attrs
import torch
import triton
import triton.language as tl

from graphkv.errors import Problem, SpecError
from graphkv.kernels.cache_layout import CacheStrides, cache_strides
from graphkv.kernels.launch import device_kernel
from graphkv.spec.backends import CacheOrder, KVLayout

__all__ = ["KVWriteArgs", "check_reshape_and_cache", "reshape_and_cache"]


@device_kernel
def _reshape_and_cache_kernel(
    key_ptr,  # [num_tokens, H, D] (any strides)
    value_ptr,  # [num_tokens, H, D] (any strides; unused when HAS_VALUE is False)
    cache_ptr,  # paged cache view; addressed through the strides below
    slot_mapping_ptr,  # [>= num_tokens] int64, PAD_SLOT_ID (-1) skips the token
    k_stride_t, k_stride_h, k_stride_d,
    v_stride_t, v_stride_h, v_stride_d,
    c_stride_block, c_stride_kv, c_stride_tok, c_stride_h, c_stride_d,
    NUM_SLOTS, NUM_HEADS, HEAD_SIZE,
    KERNEL_BLOCK_SIZE: tl.constexpr,
    HAS_VALUE: tl.constexpr,
    TILE_H: tl.constexpr,
    TILE_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok)
    is_written = (slot >= 0) & (slot < NUM_SLOTS)  # padding skipped; a bad slot writes nothing
    kernel_block = slot // KERNEL_BLOCK_SIZE
    offset = slot % KERNEL_BLOCK_SIZE
    h = tl.arange(0, TILE_H).to(tl.int64)[:, None]
    d = tl.arange(0, TILE_D).to(tl.int64)[None, :]
    # Scalar condition folded into a bound (the interpreter mis-types vector & scalar bools).
    in_head = (h < tl.where(is_written, NUM_HEADS, 0)) & (d < HEAD_SIZE)
    dst = cache_ptr + kernel_block * c_stride_block + offset * c_stride_tok + h * c_stride_h + d * c_stride_d
    k = tl.load(key_ptr + tok * k_stride_t + h * k_stride_h + d * k_stride_d, mask=in_head, other=0.0)
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=in_head)
    if HAS_VALUE:
        v = tl.load(value_ptr + tok * v_stride_t + h * v_stride_h + d * v_stride_d, mask=in_head, other=0.0)
        tl.store(dst + c_stride_kv, v.to(cache_ptr.dtype.element_ty), mask=in_head)


@attrs.frozen(kw_only=True, eq=False)
class KVWriteArgs:
    """Checked arguments of a KV write: the cache's geometry and K/V as ``[num_tokens, H, D]``."""

    geometry: CacheStrides
    key: torch.Tensor  # [num_tokens, H, D]; a latent key [num_tokens, D] gets H = 1
    value: torch.Tensor | None  # [num_tokens, H, D]; None for a latent (MLA) cache


def check_reshape_and_cache(key: torch.Tensor, value: torch.Tensor | None, kv_cache: torch.Tensor,
                            slot_mapping: torch.Tensor, *, layout: KVLayout) -> KVWriteArgs:
    """Check the arguments of :func:`reshape_and_cache` (shared by every implementation), reporting
    every problem at once as a :class:`SpecError`; returns them with ``key`` made 3-D."""
    latent = layout.order is CacheOrder.LATENT
    geo = cache_strides(kv_cache, layout)
    heads, dim = geo.num_heads, geo.head_size
    k3 = key.unsqueeze(1) if latent and key.dim() == 2 else key
    want = (heads, dim)
    problems = []
    if k3.dim() != 3 or tuple(k3.shape[1:]) != want:
        problems.append(Problem(field="key", value=tuple(key.shape), limit=f"must be [num_tokens, {heads}, {dim}]",
                                fix="pass the step's K for this layer"))
    if latent and value is not None:
        problems.append(Problem(field="value", value=tuple(value.shape), limit="a latent (MLA) cache has no V",
                                fix="pass value=None"))
    if not latent and (value is None or tuple(value.shape) != tuple(k3.shape)):
        problems.append(Problem(field="value", value=None if value is None else tuple(value.shape),
                                limit=f"must match key {tuple(key.shape)}", fix="pass the step's V for this layer"))
    for name, t in (("key", key), ("value", value)):
        if t is not None and (t.dtype != kv_cache.dtype or t.device != kv_cache.device):
            problems.append(Problem(field=name, value=(t.dtype, str(t.device)),
                                    limit=f"must be {kv_cache.dtype} on {kv_cache.device} like the cache",
                                    fix=f"cast {name} to the cache dtype before writing"))
    if slot_mapping.dim() != 1 or slot_mapping.dtype != torch.int64 or slot_mapping.shape[0] < key.shape[0]:
        problems.append(Problem(field="slot_mapping", value=(tuple(slot_mapping.shape), slot_mapping.dtype),
                                limit=f"must be [>= {key.shape[0]}] int64", fix="pass slot_mappings[group]"))
    if problems:
        raise SpecError(*problems)
    return KVWriteArgs(geometry=geo, key=k3, value=value)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor | None, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, *, layout: KVLayout) -> None:
    """Write ``key`` / ``value`` ``[num_tokens, H, D]`` into ``kv_cache`` at ``slot_mapping``.

    ``kv_cache``: the layer's view from ``KVPool.kv_cache`` with ``layout`` its backend's declared
    layout (blocks-first ``(N, 2, kbs, H, D)``, kv-first ``(2, N, kbs, H, D)``, or latent ``(N,
    kbs, D)`` with ``key`` ``[num_tokens, D]`` and ``value=None``), same dtype as ``key``.
    ``slot_mapping``: ``[>= num_tokens] int64`` (the layer's group row of the step's slot mapping);
    negative slots are skipped, and so are slots past the cache (nothing is written out of
    bounds). Capture-safe.

    >>> reshape_and_cache(k, v, pool.kv_cache(name), slots[g], layout=pool.layout(name))
    """
    args = check_reshape_and_cache(key, value, kv_cache, slot_mapping, layout=layout)
    geo, k3 = args.geometry, args.key
    kbs, heads, dim = geo.kernel_block_size, geo.num_heads, geo.head_size
    latent = args.value is None
    num_tokens = k3.shape[0]
    if num_tokens == 0:
        return
    v3 = k3 if args.value is None else args.value
    _reshape_and_cache_kernel[(num_tokens,)](
        k3, v3, kv_cache, slot_mapping, *k3.stride(), *v3.stride(), *geo.strides, geo.num_kernel_blocks * kbs,
        heads, dim,
        KERNEL_BLOCK_SIZE=kbs, HAS_VALUE=not latent, TILE_H=triton.next_power_of_2(heads),
        TILE_D=triton.next_power_of_2(dim))
