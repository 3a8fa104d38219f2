"""Paged decode attention for the ``triton_paged`` backend: one query token per sequence.

One program per (sequence, KV head) walks the sequence's kernel blocks through its block table
and keeps an online softmax in fp32; the ``num_q_heads // num_kv_heads`` query heads of a KV
head (GQA) share every K/V load. The cache is addressed through the strides its layout declares
(:mod:`graphkv.kernels.cache_layout`), so blocks-first / kv-first and NHD / HND all work.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphkv.errors import Problem, SpecError
from graphkv.kernels.cache_layout import cache_strides
from graphkv.kernels.launch import device_kernel
from graphkv.spec.backends import CacheOrder, KVLayout

__all__ = ["paged_decode_attention"]


@device_kernel
def _paged_decode_attention_kernel(
    query_ptr,  # [num_seqs, num_q_heads, D]
    cache_ptr,  # paged cache view; addressed through the strides below
    block_table_ptr,  # [>= num_seqs, width] int32, kernel blocks
    seq_lens_ptr,  # [>= num_seqs] int32, the query sits at position seq_len - 1
    out_ptr,  # [num_seqs, num_q_heads, D]
    q_stride_s, q_stride_h, q_stride_d,
    o_stride_s, o_stride_h, o_stride_d,
    table_stride,
    c_stride_block, c_stride_kv, c_stride_tok, c_stride_h, c_stride_d,
    scale,
    window,
    TABLE_WIDTH, NUM_KERNEL_BLOCKS, HEAD_SIZE,
    QUERIES_PER_KV: tl.constexpr,
    KERNEL_BLOCK_SIZE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    TILE_G: tl.constexpr,
    TILE_N: tl.constexpr,
    TILE_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int64)
    g = tl.arange(0, TILE_G).to(tl.int64)
    d = tl.arange(0, TILE_D).to(tl.int64)
    n = tl.arange(0, TILE_N).to(tl.int64)
    q_head = kv_head * QUERIES_PER_KV + g
    is_head = g < QUERIES_PER_KV
    is_dim = d < HEAD_SIZE
    q_mask = is_head[:, None] & is_dim[None, :]
    q = tl.load(query_ptr + seq * q_stride_s + q_head[:, None] * q_stride_h + d[None, :] * q_stride_d,
                mask=q_mask, other=0.0).to(tl.float32)

    first_pos = 0
    if HAS_WINDOW:
        first_pos = tl.maximum(seq_len - window, 0)  # keys x with (seq_len - 1) - x < window
    end_block = tl.minimum((seq_len + KERNEL_BLOCK_SIZE - 1) // KERNEL_BLOCK_SIZE, TABLE_WIDTH)
    # Finite start: a fully masked tile then gives exp(-inf - m) = 0 instead of NaN.
    m_i = tl.full([TILE_G], -1.0e30, tl.float32)
    l_i = tl.zeros([TILE_G], tl.float32)
    acc = tl.zeros([TILE_G, TILE_D], tl.float32)
    for j in range(first_pos // KERNEL_BLOCK_SIZE, end_block):
        kernel_block = tl.load(block_table_ptr + seq * table_stride + j).to(tl.int64)
        pos = j * KERNEL_BLOCK_SIZE + n
        # A bad table entry reads nothing (scalar folded into a bound: see the interpreter note).
        block_tokens = tl.where((kernel_block >= 0) & (kernel_block < NUM_KERNEL_BLOCKS), KERNEL_BLOCK_SIZE, 0)
        is_key = (n < block_tokens) & (pos < seq_len) & (pos >= first_pos)
        kv_mask = is_key[:, None] & is_dim[None, :]
        k_ptrs = (cache_ptr + kernel_block * c_stride_block + kv_head * c_stride_h + n[:, None] * c_stride_tok
                  + d[None, :] * c_stride_d)
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0).to(tl.float32)  # [TILE_N, TILE_D]
        v = tl.load(k_ptrs + c_stride_kv, mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [TILE_G, TILE_N]
        scores = tl.where(is_key[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    out = tl.where(l_i[:, None] > 0, acc / tl.maximum(l_i, 1e-30)[:, None], 0.0)  # seq_len 0 -> zeros
    tl.store(out_ptr + seq * o_stride_s + q_head[:, None] * o_stride_h + d[None, :] * o_stride_d,
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_decode_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                           seq_lens: torch.Tensor, *, layout: KVLayout, scale: float | None = None,
                           sliding_window: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention of ``query`` ``[num_seqs, num_q_heads, D]`` over the paged cache.

    ``kv_cache``: a layer's view from ``KVPool.kv_cache`` (its K/V for the query token already
    written) with ``layout`` its backend's declared layout; ``block_table``: ``[>= num_seqs,
    width] int32`` kernel blocks (the group's gathered table); ``seq_lens``: ``[>= num_seqs]
    int32`` tokens per sequence including the query (0: output zeros). ``num_q_heads`` must be a
    multiple of the cache's heads (GQA); ``sliding_window``: attend only the last that many tokens.
    Accumulates in fp32; returns ``out`` (allocated as ``query``'s dtype unless given).
    Capture-safe when ``out`` is given.
    """
    if layout.order not in (CacheOrder.BLOCKS_FIRST, CacheOrder.KV_FIRST):
        raise SpecError(Problem(field="layout", value=layout.order.value,
                                limit="paged decode attention reads (.., 2, kbs, H, D) K/V caches",
                                fix="use an MLA kernel for latent caches"))
    geo = cache_strides(kv_cache, layout)
    problems = []
    if query.dim() != 3 or query.shape[2] != geo.head_size or query.shape[1] % geo.num_heads:
        problems.append(Problem(field="query", value=tuple(query.shape),
                                limit=f"must be [num_seqs, k * {geo.num_heads}, {geo.head_size}] (GQA)",
                                fix="pass one query token per sequence with head_size matching the cache"))
    if query.device != kv_cache.device:
        problems.append(Problem(field="query.device", value=str(query.device), limit=f"must be {kv_cache.device}",
                                fix="move query to the cache's device"))
    num_seqs = query.shape[0] if query.dim() == 3 else 0
    if block_table.dim() != 2 or block_table.dtype != torch.int32 or block_table.shape[0] < num_seqs \
            or block_table.stride(1) != 1:
        problems.append(Problem(field="block_table", value=(tuple(block_table.shape), block_table.dtype),
                                limit=f"must be [>= {num_seqs}, width] int32 with contiguous rows",
                                fix="pass the group's gathered block table"))
    if seq_lens.dim() != 1 or seq_lens.dtype != torch.int32 or seq_lens.shape[0] < num_seqs:
        problems.append(Problem(field="seq_lens", value=(tuple(seq_lens.shape), seq_lens.dtype),
                                limit=f"must be [>= {num_seqs}] int32", fix="pass the persistent seq_lens buffer"))
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                       or sliding_window <= 0):
        problems.append(Problem(field="sliding_window", value=sliding_window, limit="must be None or an int > 0",
                                fix="pass the layer's window in tokens"))
    if out is not None and (tuple(out.shape) != tuple(query.shape) or out.device != query.device):
        problems.append(Problem(field="out", value=tuple(out.shape), limit=f"must be {tuple(query.shape)} on "
                                f"{query.device}", fix="allocate out like query"))
    if problems:
        raise SpecError(*problems)
    if out is None:
        out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    group = query.shape[1] // geo.num_heads
    _paged_decode_attention_kernel[(num_seqs, geo.num_heads)](
        query, kv_cache, block_table, seq_lens, out, *query.stride(), *out.stride(), block_table.stride(0),
        *geo.strides, geo.head_size ** -0.5 if scale is None else float(scale), sliding_window or 1,
        block_table.shape[1], geo.num_kernel_blocks, geo.head_size,
        QUERIES_PER_KV=group, KERNEL_BLOCK_SIZE=geo.kernel_block_size, HAS_WINDOW=sliding_window is not None,
        TILE_G=triton.next_power_of_2(group), TILE_N=triton.next_power_of_2(geo.kernel_block_size),
        TILE_D=triton.next_power_of_2(geo.head_size))
    return out
