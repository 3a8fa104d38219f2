"""Device tables on a CPU, where the device is the host: no staging, no kernels, few numpy calls.

Edits only write the host mirror and note, per group, which request rows changed and the band of
page columns they changed. :meth:`HostSync.sync` then brings the step's rows (what attention
reads) up to date: a batch that keeps its rows copies just the changed band of the changed rows
from the mirror (two numpy calls per group); a batch whose rows changed copies its rows whole
(``np.take``). With one kernel block per page in every group the step's page rows *are* the
kernel-block tables and the persistent device tables *are* the mirror (no copy at all). With
more kernel blocks per page, the copied band is expanded by one broadcast add (the dense add vLLM
does over the whole table every step, here only over what changed), and the persistent
kernel-block tables, which nothing on the step path reads, are written by :meth:`HostSync.commit`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from graphkv.kernels.block_tables import PackedTables

if TYPE_CHECKING:
    from graphkv.runtime.tables.block_tables import BlockTables

__all__ = ["HostSync"]

_SMALL_BAND = 1024  # pages; a band this small is expanded with numpy


class HostSync:
    """The device tables of ``tables`` (a :class:`BlockTables` on a CPU with the default kernels)."""

    def __init__(self, tables: "BlockTables") -> None:
        self._bt = tables
        seqs, widths, pages = tables.max_num_seqs, tables.widths, tables.max_pages
        total = seqs * sum(widths)
        self.storage = torch.zeros(2 * total, dtype=torch.int32)
        self.persistent = PackedTables.view_of(self.storage[:total], seqs, widths)
        self.inputs = PackedTables.view_of(self.storage[total:], seqs, widths)
        self.aliased = all(b == 1 for b in tables.bpks)
        self._both = self.storage.numpy().reshape(2, total)  # [persistent | per-step], page = kernel block
        self._step_view = (memoryview(self.storage.numpy()[total:]), tables.bpks[0]) if tables.num_groups == 1 else None
        # Per-step page ids per group; with bpk 1 everywhere, the per-step tables themselves.
        self.step_pages = (tuple(t.numpy() for t in self.inputs.tables) if self.aliased
                           else tuple(np.zeros((seqs, p), dtype=np.int32) for p in pages))
        self._inputs3 = tuple(t.view(seqs, p, b) for t, p, b in zip(self.inputs.tables, pages, tables.bpks))
        self._persistent3 = tuple(t.view(seqs, p, b) for t, p, b in zip(self.persistent.tables, pages, tables.bpks))
        self._offsets = tuple(torch.arange(b, dtype=torch.int32) for b in tables.bpks)
        self._offsets_np = tuple(t.numpy() for t in self._offsets)
        num_groups = tables.num_groups
        self._touched: list[list[np.ndarray]] = [[] for _ in range(num_groups)]  # changed rows per group
        self._band = [[tables.max_pages[g], 0] for g in range(num_groups)]  # their changed columns [lo, hi)

    def mirror_buffer(self, size: int) -> np.ndarray | None:
        """The host mirror's storage when the persistent tables can be it (bpk 1 everywhere)."""
        return self.storage.numpy()[:size] if self.aliased else None

    def persistent_tables(self) -> tuple[torch.Tensor, ...]:
        """Persistent kernel-block tables (current after :meth:`commit` unless they are the mirror)."""
        return self.persistent.tables

    # ---- edits -----------------------------------------------------------------------------------

    def write_through(self, rows: np.ndarray, dst: np.ndarray, ids: np.ndarray) -> bool:
        """Write pages ``ids`` at mirror indices ``dst`` (of request rows ``rows``) into the mirror and
        the step tables in one scatter, when it can: bpk 1 everywhere (the step page rows are the
        tables, packed like the mirror) and the batch showing request row i at step row i for every
        row here. Returns False (nothing written) otherwise."""
        shown = self._bt.identity_rows
        if not (self.aliased and shown and int(rows.max()) < shown):
            return False
        self._both[:, dst] = ids  # [mirror | step tables] viewed as two rows of one buffer
        return True

    def step_view(self) -> tuple[memoryview, int] | None:
        """The one group's step tables as a flat memoryview of kernel blocks, and its bpk (for the
        page-by-page path of :mod:`~graphkv.runtime.tables.uniform_append`)."""
        return self._step_view

    def write_rows(self, rows: np.ndarray, start: int, block: np.ndarray) -> bool:
        """Step rows ``rows`` (showing the same request rows) := pages ``block`` (``[len(rows), c]``)
        at page columns ``start ..``, expanded to kernel blocks; the one-group case."""
        self.step_pages[0][rows, start:start + block.shape[1]] = block
        if self.aliased:
            return True
        first, last = int(rows[0]), int(rows[-1])
        contiguous = last - first + 1 == rows.shape[0] and bool((rows[1:] > rows[:-1]).all())
        self._expand(0, slice(first, last + 1) if contiguous else rows, start, start + block.shape[1])
        return True

    def write_lines(self, lines: list[int], pages: list[int]) -> None:
        """The one group's step table: page column lines (``row * pages_per_request + column``) :=
        ``pages``, in pages and in kernel blocks (two numpy writes)."""
        self.step_pages[0].reshape(-1)[lines] = pages
        bpk = self._bt.bpks[0]
        values = np.array(pages, dtype=np.int32)[:, None] * np.int32(bpk) + self._offsets_np[0]
        self._inputs3[0].numpy().reshape(-1, bpk)[lines] = values

    def appended_one_group(self, rows: np.ndarray, held: np.ndarray, top: int) -> None:
        """Rows ``rows`` of the only group gained pages in columns ``[held, top)``, mirror only."""
        self._note(0, rows, int(held.min()), top)

    def appended(self, group: np.ndarray, seg_row: np.ndarray, held: np.ndarray, held_after: np.ndarray) -> None:
        """Rows ``seg_row`` of groups ``group`` gained pages in columns ``[held, held_after)``, mirror only."""
        for g in np.unique(group).tolist():
            mine = group == g
            self._note(g, seg_row[mine], int(held[mine].min()), int(held_after[mine].max()))

    def edited(self, groups: np.ndarray, rows: np.ndarray, from_column: np.ndarray) -> None:
        """Rows edited in place (truncated, moved, cleared) from ``from_column`` on."""
        for g, r, lo in zip(groups.tolist(), rows.tolist(), from_column.tolist()):
            self._note(g, np.array([r]), int(lo), self._bt.max_pages[g])

    def _note(self, g: int, rows: np.ndarray, lo: int, hi: int) -> None:
        self._touched[g].append(rows)
        band = self._band[g]
        band[0], band[1] = min(band[0], lo), max(band[1], hi)

    # ---- the step ---------------------------------------------------------------------------------

    def sync(self, rows: np.ndarray, num_reqs_padded: int, same_rows: bool, null_until: int) -> None:
        """Step rows ``[0, len(rows))`` show ``rows``, ``[len(rows), num_reqs_padded)`` the null page."""
        n = rows.shape[0]
        bt = self._bt
        if not same_rows:
            for g, step in enumerate(self.step_pages):
                np.take(bt.pages_np[g], rows, axis=0, out=step[:n])
                step[n:num_reqs_padded] = 0
                self._expand(g, slice(0, num_reqs_padded), 0, bt.max_pages[g])
            self._forget()
            return
        for g, touched in enumerate(self._touched):
            if touched:
                self._copy_band(g, touched[0] if len(touched) == 1 else np.concatenate(touched))
        self._forget()
        if num_reqs_padded > null_until:
            start = max(null_until, n)
            for g, step in enumerate(self.step_pages):
                step[start:num_reqs_padded] = 0
                self._expand(g, slice(start, num_reqs_padded), 0, bt.max_pages[g])

    def _copy_band(self, g: int, rows: np.ndarray) -> None:
        """The changed band of ``rows`` (request rows) into the step rows showing them."""
        lo, hi = self._band[g]
        if hi <= lo:
            return
        pos = self._bt._batch_row_of[rows]
        first, last = int(pos.min()), int(pos.max())
        if first < 0:
            keep = pos >= 0
            pos, rows = pos[keep], rows[keep]
            if not pos.shape[0]:
                return
            first = int(pos.min())
        self.step_pages[g][pos, lo:hi] = self._bt.pages_np[g][rows, lo:hi]
        # Step rows are distinct: consecutive ones are a slice (one dense expansion, no index).
        self._expand(g, slice(first, last + 1) if last - first + 1 == pos.shape[0] else pos, lo, hi)

    def _forget(self) -> None:
        for g in range(len(self._touched)):
            self._touched[g] = []
            self._band[g] = [self._bt.max_pages[g], 0]

    def show_null(self, num_reqs_padded: int) -> None:
        """Step rows ``[0, num_reqs_padded)`` := the null page."""
        for g, step in enumerate(self.step_pages):
            step[:num_reqs_padded] = 0
            self._expand(g, slice(0, num_reqs_padded), 0, self._bt.max_pages[g])

    def commit(self) -> None:
        """Make the persistent kernel-block tables current (they are the mirror with bpk 1 everywhere;
        else one broadcast add per group over the whole mirror)."""
        if self.aliased:
            return
        bt = self._bt
        for g in range(bt.num_groups):
            self._expand_into(self._persistent3[g], torch.from_numpy(bt.pages_np[g]), g)

    def _expand(self, g: int, rows: "slice | np.ndarray", lo: int, hi: int) -> None:
        """Kernel blocks of step rows ``rows``, page columns ``[lo, hi)`` (nothing when the step pages
        are the tables)."""
        if self.aliased or hi <= lo:
            return
        pages = torch.from_numpy(self.step_pages[g][rows, lo:hi])
        if isinstance(rows, slice):
            self._expand_into(self._inputs3[g][rows, lo:hi], pages, g)
            return
        out = torch.empty(pages.shape + (self._bt.bpks[g],), dtype=torch.int32)
        self._expand_into(out, pages, g)
        self._inputs3[g][torch.from_numpy(rows), lo:hi] = out

    def _expand_into(self, out: torch.Tensor, pages: torch.Tensor, g: int) -> None:
        """``out[r, c, k] = pages[r, c] * bpk + k`` (0 for the null page): one broadcast add (numpy for
        a small band, where torch's per-call cost dominates)."""
        bpk = self._bt.bpks[g]
        if bpk == 1:
            out[..., 0].copy_(pages)
            return
        if pages.numel() <= _SMALL_BAND:
            values = pages.numpy()[..., None] * np.int32(bpk) + self._offsets_np[g]
            values[pages.numpy() == 0] = 0
            out.numpy()[...] = values
            return
        torch.add(self._offsets[g], pages.unsqueeze(-1), alpha=bpk, out=out)
        if int(pages.numpy().min()) == 0:  # null pages (past a row's pages) are zeros, not page 0's kernel blocks
            out.masked_fill_((pages == 0).unsqueeze(-1), 0)
