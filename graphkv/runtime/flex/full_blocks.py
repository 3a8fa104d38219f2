"""Full blocks of a flex mask: kernel blocks every query of a tile sees whole, so flex skips the mask_mod.

A ``BlockMask`` lists two kinds of kv blocks per query tile: *partial* ones (``kv_indices``), on
which flex evaluates the mask_mod, and *full* ones (``full_kv_indices``), which it attends
unmasked. :class:`FullBlockMarker` finds the full ones of a step after
:class:`~graphkv.runtime.flex.mask.FlexMaskBuilder` has counted, per (query tile, kernel block),
the table entries that need it: it writes them to the full lists and clears their counts, so the
partial lists the builder writes next hold the rest and no block is in both.

The rule, read off :func:`~graphkv.runtime.flex.mask.paged_mask_mod`: query ``q`` (row ``r``,
position ``p``) keeps every key of kernel block ``b`` iff ``L = kernel_block_logical[b] >= 0``,
``table[r, L] == b``, ``L * kbs + kbs - 1 <= p`` (the whole block is causal) and, with a window
``W``, ``p - L * kbs < W`` (the whole block is inside it). Over a query tile this holds for every
query only when the tile's queries all belong to one request ``r`` and are real (a padding query
attends nothing, so a tile holding one has no full blocks; rows at or past the step's
``num_tokens_padded`` are not part of the attention call and do not count: a region pads a
one-token query to two rows and drops the second's output). Positions grow by one along a
request's packed tokens, so with ``p0`` and ``p1 = p0 + (e - s)`` the positions of the tile's first
and last query (tokens ``s`` and ``e``), the full blocks are ``table[r, L]`` for ``L`` in ``[Lmin,
Lmax]``, ``Lmax = (p0 + 1) // kbs - 1`` and ``Lmin = ceil((p1 - W + 1) / kbs)`` (0 without a
window), provided the inverse map reads each of them back at its own ``L``. A served table always
does (the null page and stale indices of reused pages lie before any window); where one does not,
the tile gets no full blocks at all, which is still exact, just slower. Tiles spanning several
requests (decode batches, the seams between prefills) get none either, even where prefix sharing
would allow some, and a window narrower than a kernel block has none (the builder skips the search).

The work is a few ops per query tile and per (tile, column) of the full lists, nothing per table
entry or pool block. Everything runs in place on persistent buffers (capture-safe, no host sync,
no allocation); 0-d constants stand in for Python scalars (each of which a CPU op wraps in a new
tensor) and each step size's views are made once (outside ``torch.compile``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from graphkv.plan.allocations.flex import FULL_SCALARS, TILE_CONSTS, TILE_INTS

__all__ = ["FullBlockMarker"]


class _StepViews(NamedTuple):
    """Views of the marker's buffers cut to a step's ``tiles`` query tiles."""

    ranks: torch.Tensor  # [tiles, F] int32: 1, 2, ...
    first_m1: torch.Tensor  # [tiles, 1] int32: flat table entry before the tile's range
    last: torch.Tensor  # [tiles, 1] int32: the range's last flat table entry
    rowbase: torch.Tensor  # [tiles, 1] int32: the row's first flat table entry
    count: torch.Tensor  # [tiles] int32: entries in the range
    offsets: torch.Tensor  # [tiles, 1] int32: t * N, or the unused row's for a tile without full blocks
    entry: torch.Tensor  # [tiles, F] int32: flat table entry of column j
    block: torch.Tensor  # [tiles, F] int32: its kernel block
    logical: torch.Tensor  # [tiles, F] int32: where the inverse map reads that block
    read_back: torch.Tensor  # [tiles, F] bool
    entry_flat: torch.Tensor  # [tiles * F] int32 views of the same
    block_flat: torch.Tensor
    logical_flat: torch.Tensor
    whole: torch.Tensor  # [tiles] bool: every entry of the range read back
    no_full: torch.Tensor  # [tiles] bool
    no_full_col: torch.Tensor  # [tiles, 1] bool
    index: torch.Tensor  # [tiles, F] int64: (tile, kernel block) index to clear
    index_flat: torch.Tensor  # [tiles * F] int64
    full_num: torch.Tensor  # [tiles] views of the builder's outputs
    full_indices: torch.Tensor  # [tiles, F]
    tile_offsets: torch.Tensor  # [tiles, 1]: t * N
    unused_row: torch.Tensor  # 0-d: tiles * N


class FullBlockMarker:
    """Writes one step's full block lists and clears their counts (:meth:`mark`).

    Writes the builder's ``full_kv_num_blocks [Q] int32`` / ``full_kv_indices [Q, K] int32`` (flex
    kv blocks, as ``kv_indices``) and clears entries of its ``tile_counts [Q + 2, N]``; reads its
    ``token_row`` / ``token_pos [T]``, ``row_last [S]``, ``kernel_block_logical [N]`` and
    ``block_table [S, W]`` (all int32). Takes its own buffers from the builder's ``flex.{g}.*`` ledger
    entries (``take(name)`` / ``part(name, view)``): ``tile_ints [7, Q]``, ``tile_consts [2, Q]``,
    ``full_scalars [9]`` int32, ``tile_flags [2, Q]`` bool, and per (tile, column of the full lists)
    ``full_ints [3, Q, F]`` int32, ``full_read_back [Q, F]`` bool and ``full_index [Q, F]`` int64,
    ``F = min(W, searched columns)``.
    """

    def __init__(self, *, take: Callable[[str], torch.Tensor], part: Callable[[str, str], torch.Tensor],
                 kernel_block_size: int, q_tile_tokens: int, window: int | None, kv_block_stride: int,
                 full_kv_num_blocks: torch.Tensor, full_kv_indices: torch.Tensor, token_row: torch.Tensor,
                 token_pos: torch.Tensor, row_last: torch.Tensor, kernel_block_logical: torch.Tensor,
                 block_table: torch.Tensor, ranks: torch.Tensor, tile_offsets: torch.Tensor,
                 tile_counts: torch.Tensor) -> None:
        kbs, tile = kernel_block_size, q_tile_tokens
        num_tiles = full_kv_num_blocks.shape[0]
        seqs, width = block_table.shape
        nkb = kernel_block_logical.shape[0]
        self.window, self.kv_block_stride = window, kv_block_stride
        self.kernel_block_logical, self.row_last, self.table_flat = kernel_block_logical, row_last, block_table.view(-1)
        self.first_row, self.first_pos = token_row[0::tile], token_pos[0::tile]  # [Q] views: each tile's first query
        # Per query tile, over all Q tiles (those past a step's hold stale tokens; only the step's are read).
        take("tile_ints")
        self.row, self.rowbase, self.last, self.lmax, self.lmin, self.first, self.count = (
            part("tile_ints", n) for n in TILE_INTS)
        flags = take("tile_flags")
        self.dead, self.whole = flags[0], flags[1]
        take("tile_consts")
        self.tile_last, self.tile_window = (part("tile_consts", n) for n in TILE_CONSTS)
        starts = torch.arange(num_tiles, dtype=torch.int32) * tile
        self.tile_last.copy_(starts + tile - 1)
        self.tile_window.copy_(starts.neg() - (window or 0))  # Lmin - 1 = (p0 + e - s - W) // kbs
        self.ints, self.read_back, self.index = take("full_ints"), take("full_read_back"), take("full_index")
        take("full_scalars")
        values = (0, -1, 1 - kbs, kbs, width, seqs * width - 1, nkb - 1, kv_block_stride, self.index.shape[1])
        self.c = {name: part("full_scalars", name) for name in FULL_SCALARS}  # 0-d int32 constants
        for name, value in zip(FULL_SCALARS, values, strict=True):
            self.c[name].fill_(value)
        self.ranks, self.full_kv_num_blocks = ranks[:, :self.index.shape[1]], full_kv_num_blocks
        self.full_indices = full_kv_indices[:, :self.index.shape[1]]
        self.tile_offsets = tile_offsets  # [Q + 2] int32: t * N
        self.counts_flat = tile_counts.view(-1)  # [(Q + 2) * N] int32: the builder's (tile, kernel block) counts
        self.lmin.fill_(-1)  # Lmin - 1 without a window (kept); with one, rewritten per step
        self._views: dict[int, _StepViews] = {}

    def named_buffers(self) -> dict[str, torch.Tensor]:
        """The marker's own persistent tensors (per-tile values, constants, the marking workspace)."""
        out = {name: getattr(self, name) for name in (*TILE_INTS, *TILE_CONSTS, "dead", "whole", "ints",
                                                      "read_back", "index")}
        out.update({f"scalar.{name}": t for name, t in self.c.items()})
        return out

    def _step_views(self, tiles: int) -> _StepViews:
        found = None if torch.compiler.is_compiling() else self._views.get(tiles)
        if found is not None:
            return found
        entry, block, logical = self.ints[0, :tiles], self.ints[1, :tiles], self.ints[2, :tiles]
        views = _StepViews(
            ranks=self.ranks[:tiles], first_m1=self.first[:tiles, None], last=self.lmax[:tiles, None],
            rowbase=self.rowbase[:tiles, None], count=self.count[:tiles], offsets=self.row[:tiles, None],
            entry=entry, block=block, logical=logical, read_back=self.read_back[:tiles], entry_flat=entry.view(-1),
            block_flat=block.view(-1), logical_flat=logical.view(-1), whole=self.whole[:tiles],
            no_full=self.dead[:tiles], no_full_col=self.dead[:tiles, None], index=self.index[:tiles],
            index_flat=self.index[:tiles].view(-1),
            full_num=self.full_kv_num_blocks[:tiles], full_indices=self.full_indices[:tiles],
            tile_offsets=self.tile_offsets[:tiles, None], unused_row=self.tile_offsets[tiles])
        if not torch.compiler.is_compiling():
            self._views[tiles] = views
        return views

    def mark(self, *, tiles: int, num_tokens_padded: int) -> None:
        """Write ``full_kv_num_blocks[:tiles]`` / ``full_kv_indices[:tiles]`` for this step and zero
        ``tile_counts[t, b]`` (``[Q + 2, N] int32``: entries needing kernel block ``b`` in tile ``t``,
        summed over tiles; rows ``>= tiles`` are not read) for each full ``(t, b)``. Needs this step's
        token rows and positions, ``row_last`` and inverse map. Capture-safe."""
        c, v = self.c, self._step_views(tiles)
        row, rowbase, last, lmax, lmin, dead = self.row, self.rowbase, self.last, self.lmax, self.lmin, self.dead
        # 1. One real request per tile: its last query (token e) is at most the last of its first query's row.
        row.copy_(self.first_row)
        torch.index_select(self.row_last, 0, row, out=rowbase)
        torch.clamp(self.tile_last, max=num_tokens_padded - 1, out=last)
        torch.gt(last, rowbase, out=dead)

        # 2. The tile's logical range [Lmin, Lmax] (empty for a dead tile: Lmax = Lmin - 1), as flat table entries.
        torch.add(self.first_pos, c["one_minus_kbs"], out=lmax).div_(c["kernel_block_size"], rounding_mode="floor")
        if self.window is not None:
            torch.add(self.first_pos, last, out=lmin).add_(self.tile_window).div_(c["kernel_block_size"],
                                                                                 rounding_mode="floor")
            torch.maximum(lmax, lmin.clamp_(min=c["minus_one"]), out=lmax)  # Lmin - 1 here
        torch.where(dead, lmin, lmax, out=lmax)
        torch.sub(lmax, lmin, out=self.count).clamp_(max=c["full_width"])  # <= F unless a position exceeds the table
        torch.mul(row, c["table_width"], out=rowbase)
        torch.add(lmin, rowbase, out=self.first)
        lmax.add_(rowbase)

        # 3. Column j of tile t: entry first + j, or the range's last entry past it (repeats, never read).
        torch.add(v.ranks, v.first_m1, out=v.entry)
        torch.minimum(v.entry, v.last, out=v.entry).clamp_(min=c["zero"], max=c["last_entry"])
        torch.index_select(self.table_flat, 0, v.entry_flat, out=v.block_flat)
        v.block.clamp_(min=c["zero"], max=c["last_kernel_block"])
        torch.index_select(self.kernel_block_logical, 0, v.block_flat, out=v.logical_flat)
        torch.eq(v.logical.add_(v.rowbase), v.entry, out=v.read_back)  # the inverse map reads it at this entry's L
        torch.all(v.read_back, dim=1, out=v.whole)
        torch.where(v.whole, v.count, c["zero"], out=v.full_num)
        v.full_indices.copy_(v.block)
        if self.kv_block_stride != 1:
            v.full_indices.mul_(c["kv_block_stride"])

        # 4. Clear the full blocks' counts so the partial lists skip them. A tile without full blocks
        # clears entries of row `tiles` instead (unused; its columns point at arbitrary blocks).
        torch.eq(v.full_num, c["zero"], out=v.no_full)
        torch.where(v.no_full_col, v.unused_row, v.tile_offsets, out=v.offsets)
        v.index.copy_(v.block.add_(v.offsets))
        self.counts_flat.scatter_(0, v.index_flat, 0)
