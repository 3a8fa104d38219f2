"""Paged decode attention for the ``triton_paged`` backend: one query token per sequence, split-KV.

Two kernels, in the flash-decoding pattern:

1. ``_paged_decode_split_kernel``, grid ``(num_seqs, num_kv_heads, num_splits)``. Program ``(s, h,
   j)`` takes the ``j``-th of ``num_splits`` contiguous, equal runs of ``TILE_N``-token tiles of
   sequence ``s``'s attended tokens (the whole sequence, or its sliding window) and reads them
   through the block table, ``TILE_N // kernel_block_size`` kernel blocks per iteration (one
   table entry per token, so any kernel block size works and each load is a ``[TILE_N,
   head_size]`` tile). The ``num_q_heads // num_kv_heads`` query heads of KV head ``h`` (GQA) are
   one ``[TILE_G, head_size]`` operand, so each K/V tile is loaded once for all of them; both
   products run on tensor cores (``tl.dot``), softmax statistics and accumulators stay fp32. A split
   writes its partial (running max, sum, unnormalised output) per query head to the workspace; a
   split with no tokens (a short sequence, a padding row with ``seq_len == 0``) writes the neutral
   partial (max -1e30, sum 0, output 0), never NaN. With one split the kernel normalises and writes
   ``out`` itself and the second kernel does not run.
2. ``_paged_decode_combine_kernel``, grid ``(num_seqs, num_q_heads)``: rescales the splits' partials
   to their common max, adds the attention sink to the denominator, writes ``out``.

``num_splits`` comes from :func:`~graphkv.kernels.decode_splits.num_decode_splits`, a pure function
of the launched batch (a capture key's padded request count), the KV heads, the table width in
kernel blocks and the SM count: one split when ``num_seqs * num_kv_heads`` programs already give
every SM two, otherwise enough splits to reach that (132 SMs: 264 programs), with at least 64
tokens of a full-width table per split and at most 128 splits (e.g. 8 KV heads, 32k-token table:
33 splits for 1 request, 2 for 32, 1 from 33 on). The launch configuration is therefore fixed per
capture key and never tuned at launch.

Tiles: ``TILE_N`` tokens per iteration, 16 KiB of K and of V (bfloat16: 64 tokens at head size 128,
128 at 64; float32 half that; within 16..128); ``TILE_G = max(16, next_pow2(group))`` query rows (the
smallest ``tl.dot`` tile; rows past the group compute but are never stored); ``TILE_D`` the head
size rounded up to a power of two (at least 16). Four warps, three pipeline stages.

Workspace (only with more than one split): float32 ``[rows >= num_seqs * num_splits, num_q_heads,
head_size + 2 rounded up to 4]``, a persistent buffer sized once by
:func:`~graphkv.kernels.decode_splits.decode_workspace`; row ``seq * num_splits + split`` holds the
unnormalised output in ``[..., :head_size]``, the running max (log2 units) at ``head_size`` and the
sum at ``head_size + 1``.

Scores are ``scale * q.k``, then ``softcap * tanh(score / softcap)`` with a soft-cap (Gemma 2),
then the softmax over the attended keys, whose denominator also holds ``exp(sink[head])`` with
attention sinks (gpt-oss). The cache is addressed through the strides its layout declares
(:mod:`graphkv.kernels.cache_layout`), so blocks-first / kv-first and NHD / HND all work.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from graphkv.errors import Problem, SpecError
from graphkv.kernels.cache_layout import cache_strides
from graphkv.kernels.decode_splits import (DEFAULT_NUM_SMS, MAX_DECODE_SPLITS, decode_workspace,
                                           decode_workspace_shape, num_decode_splits, workspace_row_floats)
from graphkv.kernels.launch import device_kernel
from graphkv.spec.backends import CacheOrder, KVLayout

__all__ = ["decode_workspace", "decode_workspace_shape", "num_decode_splits", "paged_decode_attention"]

_LOG2E = tl.constexpr(1.4426950408889634)  # scores are kept in log2 units: exp2 is the native instruction
_NEUTRAL_MAX = tl.constexpr(-1.0e30)  # finite: an empty split rescales by exp2(0) * 0, not exp2(-inf + inf)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_NUM_WARPS = 4


def _num_stages(num_splits: int) -> int:
    """Software-pipeline stages of the split kernel's tile loop for a launch of ``num_splits`` splits (fixed per
    capture key, as the splits are). Measured on an H100 (2026-11-27, torch 2.11 / Triton 3.6,
    ``benchmarks/decode_kernel_sweep.py``, bf16, head 128, 4 warps, 64-token tiles): with splits, 2 stages beat 3
    in every cell the rule splits (1 x 512 with 8 splits 6.0 vs 6.2 us, 32 x 512 with 2 splits 30.9 vs over 32.1 us,
    32 x 4k 0.187 vs over 0.192 ms, 32 x 16k 0.720 vs over 0.728 ms, 1 x 16k with 33 splits 32.4 vs 33.0 us); one
    split reads a whole sequence and 3 stages (the table entries two tiles ahead) beat 2 (32 x 512: 28.7 vs 30.3 us;
    32 x 4k: 0.189 vs over 0.192 ms)."""
    return 3 if num_splits == 1 else 2


@triton.jit
def _tanh(x):
    """tanh from exp (the interpreter has no libdevice): +-1 at overflow, never NaN."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _join_sink(m, denom, sink):
    """A sink logit (log2 units) joins the softmax denominator: the factor that rescales the
    output accumulated against max ``m``, and the new denominator."""
    m_all = tl.maximum(m, sink)
    alpha = tl.exp2(m - m_all)
    return alpha, denom * alpha + tl.exp2(sink - m_all)


@device_kernel
def _paged_decode_split_kernel(
    query_ptr,  # [num_seqs, num_q_heads, HEAD_SIZE], the cache's dtype
    cache_ptr,  # paged cache view, addressed through the c_stride_* below
    block_table_ptr,  # [>= num_seqs, table_width] int32 kernel blocks, rows contiguous
    seq_lens_ptr,  # [>= num_seqs] int32, the query sits at position seq_len - 1
    sinks_ptr,  # [num_q_heads] float sink logits (read only when HAS_SINKS)
    out_ptr,  # [num_seqs, num_q_heads, HEAD_SIZE] (written only when ONE_SPLIT)
    ws_ptr,  # [>= num_seqs * num_splits, num_q_heads, >= HEAD_SIZE + 2] float32 partials (unless ONE_SPLIT)
    q_stride_s, q_stride_h, q_stride_d,
    o_stride_s, o_stride_h, o_stride_d,
    ws_stride_row, ws_stride_h,
    table_stride,
    c_stride_block, c_stride_kv, c_stride_tok, c_stride_h, c_stride_d,
    scale, softcap, window,
    table_width, num_kernel_blocks,
    HEAD_SIZE: tl.constexpr,
    QUERIES_PER_KV: tl.constexpr,
    KERNEL_BLOCK_SIZE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    ONE_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,  # interpreted bfloat16: Triton's interpreter multiplies bf16 dot operands as uint16
    TILE_G: tl.constexpr,
    TILE_N: tl.constexpr,
    TILE_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2).to(tl.int64)
    num_splits = tl.num_programs(2).to(tl.int64)
    g = tl.arange(0, TILE_G).to(tl.int64)
    d = tl.arange(0, TILE_D).to(tl.int64)
    n = tl.arange(0, TILE_N).to(tl.int64)
    q_head = kv_head * QUERIES_PER_KV + g
    is_head = g < QUERIES_PER_KV
    is_dim = d < HEAD_SIZE
    q_mask = is_head[:, None] & is_dim[None, :]
    q = tl.load(query_ptr + seq * q_stride_s + q_head[:, None] * q_stride_h + d[None, :] * q_stride_d,
                mask=q_mask, other=0.0)  # [TILE_G, TILE_D]
    if UPCAST_DOT:
        q = q.to(tl.float32)  # exact: the same products as the bf16 tensor-core dot

    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int64)
    end_tok = tl.minimum(seq_len, table_width * KERNEL_BLOCK_SIZE)
    first_tok = tl.zeros([], tl.int64)
    if HAS_WINDOW:
        first_tok = tl.maximum(seq_len - window, 0)  # keys x with (seq_len - 1) - x < window
    # This split's run of tiles; tiles are aligned to TILE_N from position 0, runs are equal and
    # contiguous, the last runs of a short sequence are empty.
    first_tile = first_tok // TILE_N
    num_tiles = tl.maximum((end_tok + TILE_N - 1) // TILE_N - first_tile, 0)
    tiles_per_split = (num_tiles + num_splits - 1) // num_splits
    tile_lo = first_tile + split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, first_tile + num_tiles)

    m_i = tl.full([TILE_G], _NEUTRAL_MAX, tl.float32)
    l_i = tl.zeros([TILE_G], tl.float32)
    acc = tl.zeros([TILE_G, TILE_D], tl.float32)
    for tile in range(tile_lo, tile_hi):
        tok = tile * TILE_N + n
        in_range = (tok >= first_tok) & (tok < end_tok)
        kernel_block = tl.load(block_table_ptr + seq * table_stride + tok // KERNEL_BLOCK_SIZE, mask=in_range,
                               other=0).to(tl.int64)
        is_key = in_range & (kernel_block >= 0) & (kernel_block < num_kernel_blocks)  # a bad entry reads nothing
        kv_mask = is_key[:, None] & is_dim[None, :]
        k_ptrs = (cache_ptr + kernel_block[:, None] * c_stride_block + (tok % KERNEL_BLOCK_SIZE)[:, None] * c_stride_tok
                  + kv_head * c_stride_h + d[None, :] * c_stride_d)
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)  # [TILE_N, TILE_D]
        v = tl.load(k_ptrs + c_stride_kv, mask=kv_mask, other=0.0)
        if UPCAST_DOT:
            k, v = k.to(tl.float32), v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [TILE_G, TILE_N] fp32
        if HAS_SOFTCAP:
            scores = softcap * _tanh(scores / softcap)
        scores = tl.where(is_key[None, :], scores * _LOG2E, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p = p.to(cache_ptr.dtype.element_ty)  # the probabilities enter the second product in the cache's dtype
        if UPCAST_DOT:
            p = p.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new

    if ONE_SPLIT:
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + q_head, mask=is_head, other=0.0).to(tl.float32) * _LOG2E
            alpha, l_i = _join_sink(m_i, l_i, sink)
            acc = acc * alpha[:, None]
        out = tl.where(l_i[:, None] > 0, acc / tl.maximum(l_i, 1e-30)[:, None], 0.0)  # seq_len 0 -> zeros
        tl.store(out_ptr + seq * o_stride_s + q_head[:, None] * o_stride_h + d[None, :] * o_stride_d,
                 out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        row = ws_ptr + (seq * num_splits + split) * ws_stride_row + q_head * ws_stride_h  # [TILE_G]
        tl.store(row[:, None] + d[None, :], acc, mask=q_mask)
        tl.store(row + HEAD_SIZE, m_i, mask=is_head)
        tl.store(row + HEAD_SIZE + 1, l_i, mask=is_head)


@device_kernel
def _paged_decode_combine_kernel(
    ws_ptr,  # [>= num_seqs * num_splits, num_q_heads, >= HEAD_SIZE + 2] float32 partials
    sinks_ptr,  # [num_q_heads] float sink logits (read only when HAS_SINKS)
    out_ptr,  # [num_seqs, num_q_heads, HEAD_SIZE]
    ws_stride_row, ws_stride_h,
    o_stride_s, o_stride_h, o_stride_d,
    num_splits,
    HEAD_SIZE: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    TILE_SPLITS: tl.constexpr,  # >= num_splits: every split's statistics at once
    TILE_S: tl.constexpr,  # splits' outputs per iteration
    TILE_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, TILE_D).to(tl.int64)
    is_dim = d < HEAD_SIZE
    first_row = ws_ptr + seq * num_splits * ws_stride_row + head * ws_stride_h
    j = tl.arange(0, TILE_SPLITS).to(tl.int64)
    m = tl.load(first_row + j * ws_stride_row + HEAD_SIZE, mask=j < num_splits, other=_NEUTRAL_MAX)
    l_j = tl.load(first_row + j * ws_stride_row + HEAD_SIZE + 1, mask=j < num_splits, other=0.0)
    m_max = tl.max(m, axis=0)
    denom = tl.sum(l_j * tl.exp2(m - m_max), axis=0)
    acc = tl.zeros([TILE_D], tl.float32)
    for s0 in range(0, num_splits, TILE_S):
        s = s0 + tl.arange(0, TILE_S).to(tl.int64)
        is_split = s < num_splits
        w = tl.exp2(tl.load(first_row + s * ws_stride_row + HEAD_SIZE, mask=is_split, other=_NEUTRAL_MAX) - m_max)
        part = tl.load(first_row + s[:, None] * ws_stride_row + d[None, :], mask=is_split[:, None] & is_dim[None, :],
                       other=0.0)  # [TILE_S, TILE_D]
        acc += tl.sum(part * w[:, None], axis=0)
    if HAS_SINKS:
        alpha, denom = _join_sink(m_max, denom, tl.load(sinks_ptr + head).to(tl.float32) * _LOG2E)
        acc = acc * alpha
    out = tl.where(denom > 0, acc / tl.maximum(denom, 1e-30), 0.0)  # no tokens in any split -> zeros
    tl.store(out_ptr + seq * o_stride_s + head * o_stride_h + d * o_stride_d, out.to(out_ptr.dtype.element_ty),
             mask=is_dim)


def _tile_tokens(tile_d: int, element_bytes: int) -> int:
    """Tokens per iteration: K and V tiles of 16 KiB each (bfloat16: 64 tokens at head size 128,
    128 at 64, 32 at 256; float32 half that), within 16..128 (``tl.dot`` needs 16). Larger tiles
    spill registers (float32, head size 64, 128 tokens: 160 bytes on sm_90)."""
    return max(16, min(128, 16384 // (tile_d * element_bytes)))


def paged_decode_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                           seq_lens: torch.Tensor, *, layout: KVLayout, scale: float | None = None,
                           sliding_window: int | None = None, sinks: torch.Tensor | None = None,
                           softcap: float | None = None, out: torch.Tensor | None = None,
                           workspace: torch.Tensor | None = None, num_splits: int | None = None,
                           num_sms: int = DEFAULT_NUM_SMS) -> torch.Tensor:
    """Decode attention of ``query`` ``[num_seqs, num_q_heads, head_size]`` over the paged cache.

    ``kv_cache``: a layer's view from ``KVPool.kv_cache`` (its K/V for the query token already
    written), float16 / bfloat16 / float32 like ``query``, with ``layout`` its backend's declared
    layout; ``block_table``: ``[>= num_seqs, width] int32`` kernel blocks (the group's gathered
    table); ``seq_lens``: ``[>= num_seqs] int32`` tokens per sequence including the query (0, a
    padding row: output zeros). ``num_q_heads`` must be a multiple of the cache's heads (GQA).

    - ``scale``: score scale (default ``head_size ** -0.5``);
    - ``sliding_window``: attend only the last that many tokens;
    - ``sinks``: ``[num_q_heads]`` float sink logits joining each head's softmax denominator only
      (gpt-oss);
    - ``softcap``: scores become ``softcap * tanh(score / softcap)`` (Gemma 2);
    - ``out``: ``[num_seqs, num_q_heads, head_size]`` float output (allocated as ``query``'s dtype
      unless given);
    - ``workspace``: float32 ``[>= num_seqs * num_splits, num_q_heads, >= head_size + 2]``
      partials, from :func:`decode_workspace` (allocated per call when needed and not given);
    - ``num_splits``: splits per sequence (default :func:`num_decode_splits` of ``num_seqs``, the
      cache's heads, the table width and ``num_sms``).

    Accumulates in fp32; returns ``out``. Capture-safe when ``out`` is given and, for a launch of
    more than one split, ``workspace`` (reads only shapes on the host; the grid is fixed by
    ``num_seqs``, the heads and the table width).

    Example::

        ws = decode_workspace(max_num_seqs, num_q_heads=32, num_kv_heads=8, head_size=128,
                              table_width_kernel_blocks=table.shape[1], kernel_block_size=16, device="cuda")
        out = torch.empty_like(query)  # [num_seqs, 32, 128] bfloat16
        paged_decode_attention(query, pool.kv_cache(layer), table, seq_lens, layout=pool.layout(layer),
                               sliding_window=4096, out=out, workspace=ws)
    """
    if layout.order not in (CacheOrder.BLOCKS_FIRST, CacheOrder.KV_FIRST):
        raise SpecError(Problem(field="layout", value=layout.order.value,
                                limit="paged decode attention reads (.., 2, kbs, H, D) K/V caches",
                                fix="use an MLA kernel for latent caches"))
    geo = cache_strides(kv_cache, layout)
    problems = _check(query, kv_cache, block_table, seq_lens, geo.num_heads, geo.head_size, scale=scale,
                      sliding_window=sliding_window, sinks=sinks, softcap=softcap, out=out, num_splits=num_splits,
                      num_sms=num_sms)
    if problems:
        raise SpecError(*problems)
    num_seqs, num_q_heads = query.shape[:2]
    if num_splits is None:
        num_splits = num_decode_splits(max(num_seqs, 1), num_kv_heads=geo.num_heads,
                                       table_width_kernel_blocks=block_table.shape[1],
                                       kernel_block_size=geo.kernel_block_size, num_sms=num_sms)
    if num_splits > 1 and workspace is not None:
        problem = _check_workspace(workspace, num_seqs * num_splits, num_q_heads, geo.head_size, query.device)
        if problem is not None:
            raise SpecError(problem)
    if out is None:
        out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    if num_splits > 1 and workspace is None:
        workspace = torch.empty(num_seqs * num_splits, num_q_heads, workspace_row_floats(geo.head_size),
                                dtype=torch.float32, device=query.device)
    one_split = num_splits == 1
    upcast = query.is_cpu and query.dtype == torch.bfloat16  # CPU tensors run in the interpreter (launch.py)
    ws = out if one_split else workspace  # a placeholder pointer the one-split kernel never touches
    group = num_q_heads // geo.num_heads
    tile_d = max(16, triton.next_power_of_2(geo.head_size))  # tl.dot needs 16
    _paged_decode_split_kernel[(num_seqs, geo.num_heads, num_splits)](
        query, kv_cache, block_table, seq_lens, query if sinks is None else sinks, out, ws,
        *query.stride(), *out.stride(), ws.stride(0), ws.stride(1), block_table.stride(0), *geo.strides,
        geo.head_size ** -0.5 if scale is None else float(scale), float(softcap or 1.0), sliding_window or 1,
        block_table.shape[1], geo.num_kernel_blocks,
        HEAD_SIZE=geo.head_size, QUERIES_PER_KV=group, KERNEL_BLOCK_SIZE=geo.kernel_block_size,
        HAS_WINDOW=sliding_window is not None, HAS_SINKS=sinks is not None, HAS_SOFTCAP=softcap is not None,
        ONE_SPLIT=one_split, DOT_PRECISION="ieee" if kv_cache.dtype == torch.float32 or upcast else "tf32",
        UPCAST_DOT=upcast,
        TILE_G=max(16, triton.next_power_of_2(group)), TILE_N=_tile_tokens(tile_d, kv_cache.element_size()),
        TILE_D=tile_d,
        num_warps=_NUM_WARPS, num_stages=_num_stages(num_splits))
    if not one_split:
        tile_splits = triton.next_power_of_2(num_splits)
        _paged_decode_combine_kernel[(num_seqs, num_q_heads)](
            workspace, query if sinks is None else sinks, out, workspace.stride(0), workspace.stride(1),
            *out.stride(), num_splits,
            HEAD_SIZE=geo.head_size, HAS_SINKS=sinks is not None, TILE_SPLITS=tile_splits,
            TILE_S=min(tile_splits, max(1, 2048 // tile_d)), TILE_D=tile_d, num_warps=_NUM_WARPS)
    return out


def _check(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
           num_kv_heads: int, head_size: int, *, scale: float | None, sliding_window: int | None,
           sinks: torch.Tensor | None, softcap: float | None, out: torch.Tensor | None, num_splits: int | None,
           num_sms: int) -> list[Problem]:
    """Every problem with the launcher's arguments (shapes, dtypes, devices, options), none with values."""
    problems = []
    if query.dim() != 3 or query.shape[2] != head_size or query.shape[1] % num_kv_heads or not query.shape[1]:
        problems.append(Problem(field="query", value=tuple(query.shape),
                                limit=f"must be [num_seqs, k * {num_kv_heads}, {head_size}] (GQA)",
                                fix="pass one query token per sequence with head_size matching the cache"))
    if kv_cache.dtype not in _DTYPES or query.dtype != kv_cache.dtype:
        problems.append(Problem(field="query.dtype", value=(str(query.dtype), str(kv_cache.dtype)),
                                limit="query and kv_cache must share one dtype of float16, bfloat16, float32",
                                fix=f"cast query to the cache's dtype ({kv_cache.dtype})"))
    if query.device != kv_cache.device:
        problems.append(Problem(field="query.device", value=str(query.device), limit=f"must be {kv_cache.device}",
                                fix="move query to the cache's device"))
    num_seqs = query.shape[0] if query.dim() == 3 else 0
    num_q_heads = query.shape[1] if query.dim() == 3 else 0
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
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        problems.append(Problem(field="scale", value=scale, limit="must be None or a finite float",
                                fix=f"pass the model's attention scale (default head_size ** -0.5 = "
                                    f"{head_size ** -0.5:.6g})"))
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not math.isfinite(softcap) or softcap <= 0):
        problems.append(Problem(field="softcap", value=softcap, limit="must be None or a finite float > 0",
                                fix="pass the model's attn_logit_softcapping (e.g. 50.0), or None for no soft-cap"))
    if sinks is not None and (sinks.dim() != 1 or sinks.shape[0] != num_q_heads
                              or not sinks.dtype.is_floating_point or sinks.device != kv_cache.device):
        problems.append(Problem(field="sinks", value=(tuple(sinks.shape), str(sinks.dtype), str(sinks.device)),
                                limit=f"must be [{num_q_heads}] (one logit per query head), floating point, on "
                                      f"{kv_cache.device}",
                                fix="pass the attention layer's sinks parameter, or None for no sinks"))
    if out is not None and (tuple(out.shape) != tuple(query.shape) or out.device != query.device
                            or not out.dtype.is_floating_point):
        problems.append(Problem(field="out", value=(tuple(out.shape), str(out.dtype)),
                                limit=f"must be {tuple(query.shape)} floating point on {query.device}",
                                fix="allocate out like query"))
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or not 1 <= num_splits <= MAX_DECODE_SPLITS):
        problems.append(Problem(field="num_splits", value=num_splits,
                                limit=f"must be None or 1..{MAX_DECODE_SPLITS}",
                                fix="leave it None to use num_decode_splits"))
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1:
        problems.append(Problem(field="num_sms", value=num_sms, limit="must be an int >= 1",
                                fix="pass torch.cuda.get_device_properties(device).multi_processor_count"))
    return problems


def _check_workspace(workspace: torch.Tensor, rows: int, num_q_heads: int, head_size: int,
                     device: torch.device) -> Problem | None:
    """The problem with a given workspace for ``rows`` partials, or None."""
    if workspace.dtype == torch.float32 and workspace.dim() == 3 and workspace.shape[0] >= rows \
            and workspace.shape[1] == num_q_heads and workspace.shape[2] >= head_size + 2 \
            and workspace.stride(2) == 1 and workspace.device == device:
        return None
    return Problem(field="workspace", value=(tuple(workspace.shape), str(workspace.dtype), str(workspace.device)),
                   limit=f"must be float32 [>= {rows} (num_seqs * num_splits), {num_q_heads}, >= {head_size + 2}] "
                         f"with contiguous rows on {device}",
                   fix="allocate it once with decode_workspace(max_num_seqs, ...) for the largest batch and the same "
                       "num_sms, or pass num_splits=1")
