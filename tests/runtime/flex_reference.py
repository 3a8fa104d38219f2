"""Shared test data and dense reference for the flex backend (one reference for every flex test).

``make_paged_batch`` lays requests out on shuffled physical pages of a kv-first cache and fills
every slot (null page and unowned pages included) with random values, so attending a wrong
block changes the result. ``dense_reference`` rebuilds each request's contiguous K/V from its
logical pages and runs torch SDPA with a causal (optionally sliding-window) mask.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import torch
import torch.nn.functional as F

__all__ = ["BlockLists", "PagedBatch", "block_lists", "block_sparse_reference", "builder_for", "dense_reference",
           "listed_blocks", "make_paged_batch", "needed_blocks", "wholly_visible_blocks"]


@attrs.frozen(kw_only=True)
class PagedBatch:
    """One step's inputs, shaped like the persistent buffers (rows past ``num_reqs`` hold junk)."""

    query: torch.Tensor  # [num_tokens_padded, Hq, D]
    kv_cache: torch.Tensor  # (2, num_kernel_blocks, kbs, Hkv, D)
    block_table: torch.Tensor  # [max_num_seqs, width] int32, kernel blocks
    query_start_loc: torch.Tensor  # [max_num_seqs + 1] int32
    seq_lens: torch.Tensor  # [max_num_seqs] int32
    num_reqs: int
    kernel_block_size: int

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) query tokens of the step."""
        return int(self.query_start_loc[self.num_reqs])


def make_paged_batch(*, query_lens: Sequence[int], seq_lens: Sequence[int], kernel_block_size: int, bpk: int = 1,
                     num_pages: int | None = None, max_num_seqs: int, width: int | None = None,
                     num_tokens_padded: int, hq: int = 4,
                     hkv: int = 2, head_size: int = 16, seed: int = 0, junk_rows: bool = True,
                     shared_prefix_pages: int = 0, null_pages_before: Sequence[int] = (),
                     reuse: Sequence[tuple[int, int, int]] = (), kv_cache: torch.Tensor | None = None) -> PagedBatch:
    """Random step: row ``r`` has ``query_lens[r]`` new tokens ending at ``seq_lens[r]``.

    Pages are ``kernel_block_size * bpk`` tokens; page ``P`` is kernel blocks ``P*bpk ..
    P*bpk+bpk-1`` and page 0 is the null page. ``shared_prefix_pages``: rows 0 and 1 share their
    first pages (prefix caching). ``null_pages_before[r]``: row ``r``'s first pages are replaced
    by the null page (freed out-of-window pages). ``reuse``: ``(row, dst_page_idx, src_page_idx)``
    puts the physical page of ``src`` also at ``dst`` (a stale entry; ``dst`` must be out of the
    window). ``kv_cache``: reuse a persistent cache tensor (refilled in place)."""
    page = kernel_block_size * bpk
    if width is None:  # the longest request's kernel blocks, plus one spare page
        width = max(-(-n // page) for n in seq_lens) * bpk + bpk
    if num_pages is None:  # every request's pages, plus 8 unowned ones
        num_pages = sum(-(-n // page) for n in seq_lens) + 8
    gen = torch.Generator().manual_seed(seed)
    page = kernel_block_size * bpk
    num_reqs = len(query_lens)
    assert len(seq_lens) == num_reqs <= max_num_seqs and all(0 < q <= s for q, s in zip(query_lens, seq_lens))
    pages_needed = [-(-s // page) for s in seq_lens]
    assert max(pages_needed) * bpk <= width, "table too narrow"
    free = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    assert sum(pages_needed) <= len(free), "pool too small"
    rows: list[list[int]] = []
    for r, n in enumerate(pages_needed):
        if r == 1 and shared_prefix_pages:
            rows.append(rows[0][:shared_prefix_pages] + [free.pop() for _ in range(n - shared_prefix_pages)])
        else:
            rows.append([free.pop() for _ in range(n)])
    for r, n in enumerate(null_pages_before):
        rows[r][:n] = [0] * n
    for r, dst, src in reuse:
        rows[r][dst] = rows[r][src]

    table = torch.randint(0, num_pages * bpk, (max_num_seqs, width), generator=gen, dtype=torch.int32)
    if not junk_rows:
        table.zero_()
    for r, pages in enumerate(rows):
        table[r].zero_()
        for i, p in enumerate(pages):
            table[r, i * bpk:(i + 1) * bpk] = torch.arange(p * bpk, (p + 1) * bpk, dtype=torch.int32)
    qsl = torch.randint(0, 50, (max_num_seqs + 1,), generator=gen, dtype=torch.int32) if junk_rows else \
        torch.zeros(max_num_seqs + 1, dtype=torch.int32)
    qsl[:num_reqs + 1] = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.randint(1, 50, (max_num_seqs,), generator=gen, dtype=torch.int32) if junk_rows else \
        torch.zeros(max_num_seqs, dtype=torch.int32)
    lens[:num_reqs] = torch.tensor(seq_lens, dtype=torch.int32)
    assert int(qsl[num_reqs]) <= num_tokens_padded
    shape = (2, num_pages * bpk, kernel_block_size, hkv, head_size)
    values = torch.randn(shape, generator=gen)
    if kv_cache is None:
        kv_cache = values
    else:
        kv_cache.copy_(values)
    query = torch.randn(num_tokens_padded, hq, head_size, generator=gen)
    return PagedBatch(query=query, kv_cache=kv_cache, block_table=table, query_start_loc=qsl, seq_lens=lens,
                      num_reqs=num_reqs, kernel_block_size=kernel_block_size)


def dense_reference(batch: PagedBatch, *, window: int | None = None, scale: float | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """``[num_tokens_padded, Hq, D]`` float64: per request, gather K/V of positions ``0 ..
    seq_len-1`` through the table (``slot = table[r, x // kbs] * kbs + x % kbs``) and run SDPA
    with a causal / sliding-window mask; padding rows are zero. ``softcap``: the scores (after ``scale``)
    become ``softcap * tanh(score / softcap)`` before the softmax (written out, SDPA has no such option)."""
    kbs = batch.kernel_block_size
    k_all = batch.kv_cache[0].reshape(-1, *batch.kv_cache.shape[-2:]).double()
    v_all = batch.kv_cache[1].reshape(-1, *batch.kv_cache.shape[-2:]).double()
    out = torch.zeros(batch.query.shape, dtype=torch.float64)
    for r in range(batch.num_reqs):
        qs, qe, n = int(batch.query_start_loc[r]), int(batch.query_start_loc[r + 1]), int(batch.seq_lens[r])
        x = torch.arange(n)
        slots = batch.block_table[r, x // kbs].long() * kbs + x % kbs
        k, v = k_all[slots].transpose(0, 1), v_all[slots].transpose(0, 1)  # [Hkv, n, D]
        q = batch.query[qs:qe].double().transpose(0, 1)  # [Hq, q_len, D]
        p = torch.arange(n - (qe - qs), n)[:, None]
        allowed = x[None, :] <= p
        if window is not None:
            allowed &= p - x[None, :] < window
        if softcap is None:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=True)
        else:
            group = q.shape[0] // k.shape[0]
            k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
            scores = q @ k.transpose(1, 2) * (q.shape[-1] ** -0.5 if scale is None else scale)
            scores = softcap * torch.tanh(scores / softcap)
            o = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1) @ v
        out[qs:qe] = o.transpose(0, 1)
    return out


def needed_blocks(mask_mod, *, num_tokens_padded: int, kv_tokens: int, q_tile: int, kernel_block_size: int,
                  num_kernel_blocks: int) -> torch.Tensor:
    """``[num_q_tiles, num_kernel_blocks]`` bool: (tile, kernel block) pairs where ``mask_mod``
    allows at least one (query, key) pair, computed the slow way with ``create_block_mask``."""
    from torch.nn.attention.flex_attention import create_block_mask

    ref = create_block_mask(mask_mod, None, None, num_tokens_padded, kv_tokens, device="cpu",
                            BLOCK_SIZE=(q_tile, kernel_block_size))
    tiles = ref.kv_num_blocks.shape[-1]
    used = torch.zeros(tiles, num_kernel_blocks, dtype=torch.bool)
    for num, idx in ((ref.kv_num_blocks, ref.kv_indices), (ref.full_kv_num_blocks, ref.full_kv_indices)):
        if num is None:
            continue
        for t in range(tiles):
            used[t, idx[0, 0, t, :int(num[0, 0, t])].long()] = True
    return used


def builder_for(batch: PagedBatch, *, bpk: int = 1, window: int | None = None, q_tile: int = 128,
                budget: int | None = None, mark_full_blocks: bool = True):
    """A :class:`FlexMaskBuilder` bound to ``batch``'s tensors, sized like a plan would size it
    (``max_num_batched_tokens`` = ``budget``, by default the padded query length; the pool = the cache)."""
    from graphkv.runtime.flex.geometry import FlexMaskGeometry
    from graphkv.runtime.flex.mask import FlexMaskBuilder

    seqs, width = batch.block_table.shape
    nkb = batch.kv_cache.shape[1]
    geometry = FlexMaskGeometry(group_index=0, q_tile_tokens=q_tile, kernel_block_size=batch.kernel_block_size,
                                bpk=bpk, num_kernel_blocks=nkb, max_num_seqs=seqs,
                                max_num_batched_tokens=budget or batch.query.shape[0], block_table_width=width,
                                kv_indices_width=min(min(q_tile, seqs) * width, nkb), window=window)
    return FlexMaskBuilder(geometry, block_table=batch.block_table, query_start_loc=batch.query_start_loc,
                           seq_lens=batch.seq_lens, mark_full_blocks=mark_full_blocks)


def listed_blocks(builder, num_tokens_padded: int) -> torch.Tensor:
    """``[num_q_tiles, num_kernel_blocks]`` bool: the blocks ``builder``'s buffers list per tile, partial or full."""
    lists = block_lists(builder, num_tokens_padded)
    return lists.partial | lists.full


@attrs.frozen(kw_only=True)
class BlockLists:
    """A built mask's block lists as ``[num_q_tiles, num_kernel_blocks]`` bool tensors, and how many
    list entries repeat a block already in the same list."""

    partial: torch.Tensor
    full: torch.Tensor
    repeats: int


def block_lists(builder, num_tokens_padded: int) -> BlockLists:
    """The partial (``kv_indices``) and full (``full_kv_indices``) kernel blocks of each query tile."""
    g = builder.geometry
    tiles = -(-num_tokens_padded // g.q_tile_tokens)
    out, repeats = [], 0
    lists = ((builder.kv_num_blocks, builder.kv_indices), (builder.full_kv_num_blocks, builder.full_kv_indices))
    for num, idx in lists:
        listed = torch.zeros(tiles, g.num_kernel_blocks, dtype=torch.bool)
        for t in range(tiles):
            flex_blocks = idx[t, :int(num[t])].long()
            assert (flex_blocks % g.kv_block_stride == 0).all()
            kernel_blocks = flex_blocks // g.kv_block_stride
            repeats += kernel_blocks.numel() - kernel_blocks.unique().numel()
            listed[t, kernel_blocks] = True
        out.append(listed)
    return BlockLists(partial=out[0], full=out[1], repeats=repeats)


def _dense_mask(builder, num_tokens_padded: int) -> torch.Tensor:
    """``[num_tokens_padded, kv_tokens]`` bool: ``builder.mask_mod`` evaluated for every (query, key) pair."""
    q = torch.arange(num_tokens_padded)[:, None]
    kv = torch.arange(builder.geometry.kv_tokens)[None, :]
    return builder.mask_mod(torch.zeros(()), torch.zeros(()), q, kv)


def wholly_visible_blocks(builder, num_tokens_padded: int) -> torch.Tensor:
    """``[num_q_tiles, num_kernel_blocks]`` bool, by brute force: the kernel blocks whose every key every
    query of the tile keeps (queries below ``num_tokens_padded``), for tiles whose queries all belong
    to one request (what full blocks must be). Padding queries keep nothing, so a tile holding one has none."""
    g = builder.geometry
    tile, kbs, span = g.q_tile_tokens, g.kernel_block_size, g.kernel_block_size * g.kv_block_stride
    keep = _dense_mask(builder, num_tokens_padded)
    tiles = -(-num_tokens_padded // tile)
    out = torch.zeros(tiles, g.num_kernel_blocks, dtype=torch.bool)
    for t in range(tiles):
        rows = slice(t * tile, min((t + 1) * tile, num_tokens_padded))
        if builder.token_row[rows].unique().numel() != 1:
            continue
        per_key = torch.ones(g.num_kernel_blocks * span, dtype=torch.bool)  # padded to whole strides
        per_key[:g.kv_tokens] = keep[rows].all(dim=0)
        out[t] = per_key.view(-1, span)[:, :kbs].all(dim=1)
    return out


def block_sparse_reference(batch: PagedBatch, builder, *, num_tokens_padded: int,
                           scale: float | None = None) -> torch.Tensor:
    """``[num_tokens_padded, Hq, D]`` float64: attention over the flat K/V view with ``BlockMask``
    semantics, as flex kernels compute it (eager flex evaluates the mask_mod everywhere instead): a key
    counts iff its block is listed full for the query's tile, or listed partial and the mask_mod keeps
    it. Queries keeping no key give zeros."""
    from graphkv.runtime.flex.views import paged_kv_views

    g = builder.geometry
    lists = block_lists(builder, num_tokens_padded)
    kv = torch.arange(g.kv_tokens)
    kernel_block = kv // (g.kernel_block_size * g.kv_block_stride)
    at_block = kv % (g.kernel_block_size * g.kv_block_stride) < g.kernel_block_size  # keys between kernel blocks: none
    tile_of = torch.arange(num_tokens_padded) // g.q_tile_tokens
    partial = lists.partial[tile_of][:, kernel_block] & at_block
    full = lists.full[tile_of][:, kernel_block] & at_block
    keep = (partial & _dense_mask(builder, num_tokens_padded)) | full
    k, v = (x[0].double() for x in paged_kv_views(batch.kv_cache))  # [Hkv, kv_tokens, D]
    q = batch.query[:num_tokens_padded].double().transpose(0, 1)  # [Hq, T, D]
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    scores = (q @ k.transpose(1, 2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    weights = torch.where(keep.any(dim=-1, keepdim=True), weights, 0.0)
    return (weights @ v).transpose(0, 1)
