"""Device tables on a CPU, where the device is the host: no staging, no kernels, few numpy calls.

Edits write the host mirror and, where they can, the step's rows (what attention reads) in the same
breath; otherwise they note, per group, which request rows changed and the band of page columns.
:meth:`HostSync.sync` then brings the step's rows up to date: a batch that keeps its rows rewrites
just the noted band of the noted rows; a batch whose rows changed rewrites its rows whole. With one
kernel block per page in every group the step tables hold pages as they are and the persistent
device tables *are* the mirror (nothing to copy). With more kernel blocks per page, rows are
expanded straight from the mirror by one broadcast add (the dense add vLLM does over the whole
table every step, here only over what changed), and no persistent kernel-block tables are kept:
nothing on the step path reads them, so :meth:`HostSync.persistent_tables` expands the mirror
when asked. Two copies of the tables either way (the plan's ledger, ``tables.*``).
"""

from __future__ import annotations

import numpy as np
import torch

from graphkv.kernels.block_tables import PackedTables
from graphkv.runtime.buffers import LedgerBuffers
from graphkv.runtime.tables.mirror import PageMirror

__all__ = ["HostSync", "as_slice"]


class HostSync:
    """The device tables of ``mirror`` on a CPU, in ``storage``: ``[2 * max_num_seqs * sum_g width_g]
    int32`` (the mirror's pages, which are the persistent tables, then the step's rows) with bpk 1
    everywhere, else ``[max_num_seqs * sum_g width_g]`` (the step's rows in kernel blocks).
    ``buffers`` holds the ledger's ``tables.group_offsets`` / ``group_widths`` / ``kernel_block_offsets``."""

    @staticmethod
    def aliases_mirror(mirror_bpks: tuple[int, ...]) -> bool:
        """Whether the persistent tables can be the mirror's own buffer (one kernel block per page)."""
        return all(b == 1 for b in mirror_bpks)

    def __init__(self, mirror: PageMirror, storage: torch.Tensor, buffers: LedgerBuffers) -> None:
        self._mirror = mirror
        seqs, widths, pages, bpks = mirror.max_num_seqs, mirror.widths, mirror.max_pages, mirror.bpks
        total = seqs * sum(widths)
        self.aliased = self.aliases_mirror(bpks)  # kernel blocks are pages: the step tables hold pages
        assert storage.numel() == (2 if self.aliased else 1) * total, "storage holds the tables exactly"
        self.storage = storage
        index = (buffers.tensor("tables.group_offsets"), buffers.tensor("tables.group_widths"))
        self.inputs = PackedTables.view_of(storage[storage.numel() - total:], seqs, widths, index=index)
        self._persistent = PackedTables.view_of(storage[:total], seqs, widths, index=index).tables \
            if self.aliased else None
        flat = storage.numpy()
        self._both = flat.reshape(2, total) if self.aliased else None  # [mirror | step tables]
        self._both3 = self._both.reshape(2, seqs, -1) if self._both is not None and mirror.num_groups == 1 else None
        self._step_view = (memoryview(flat[flat.shape[0] - total:]), bpks[0]) if mirror.num_groups == 1 else None
        self._inputs3 = tuple(t.view(seqs, p, b) for t, p, b in zip(self.inputs.tables, pages, bpks))
        self._inputs3_np = tuple(t.numpy() for t in self._inputs3)
        buffers.tensor("tables.kernel_block_offsets")
        self._offsets = tuple(buffers.part("tables.kernel_block_offsets", str(g)) for g in range(mirror.num_groups))
        for t in self._offsets:
            t.copy_(torch.arange(t.shape[0], dtype=torch.int32))  # 0 .. bpk - 1
        self._offsets_np = tuple(t.numpy() for t in self._offsets)
        assert all(t.flags.c_contiguous for t in self._inputs3_np), "flat views of the step tables are views"
        self._step_mvs = tuple(memoryview(t.reshape(-1)) for t in self._inputs3_np)  # item access, per group
        self._batch_row_mv = memoryview(mirror.batch_row_of)
        self._touched: list[list[np.ndarray]] = [[] for _ in range(mirror.num_groups)]  # changed rows
        self._band = [[pages[g], 0] for g in range(mirror.num_groups)]  # their changed columns [lo, hi)

    def persistent_tables(self) -> tuple[torch.Tensor, ...]:
        """Persistent kernel-block tables: the mirror itself with bpk 1 everywhere; otherwise none are
        kept, and each call expands the mirror into new ``[max_num_seqs, width_g] int32`` tensors."""
        if self._persistent is not None:
            return self._persistent
        out = []
        for g, mirror in enumerate(self._mirror.pages_np):
            seqs, pages = mirror.shape
            t = torch.zeros(seqs, pages, self._mirror.bpks[g], dtype=torch.int32)
            self._expand_into(t, t.numpy(), mirror, g)
            out.append(t.view(seqs, -1))
        return tuple(out)

    # ---- edits that write the step rows too --------------------------------------------------------

    def write_through(self, rows: np.ndarray, dst: np.ndarray, ids: np.ndarray) -> bool:
        """Write pages ``ids`` at mirror indices ``dst`` (of request rows ``rows``) into the mirror and
        the step tables in one scatter, when it can: bpk 1 everywhere (the step tables hold pages,
        packed like the mirror) and the batch showing request row i at step row i for every row
        here. Returns False (nothing written) otherwise."""
        shown = self._mirror.identity_rows
        if not (self.aliased and shown and int(rows.max()) < shown):
            return False
        self._both[:, dst] = ids
        return True

    def step_view(self) -> tuple[memoryview, int] | None:
        """The one group's step tables as a flat memoryview of kernel blocks, and its bpk (for the
        page-by-page path of :mod:`~graphkv.runtime.tables.lean_append`)."""
        return self._step_view

    def write_rows(self, rows: "np.ndarray | slice", start: int, block: np.ndarray) -> bool:
        """Mirror rows ``rows`` and the step rows showing them (at the same index) := pages ``block``
        (``[len(rows), c]`` int32 or uint32, no null page) at page columns ``start ..``, in kernel blocks on the
        step side; the one-group case."""
        stop = start + block.shape[1]
        if self.aliased:  # [mirror | step tables] as two rows of one buffer: one write for both
            self._both3[:, rows, start:stop] = block
            return True
        self._mirror.pages_np[0][rows, start:stop] = block
        self.expand_rows(rows, start, stop)
        return True

    def expand_rows(self, rows: "slice | np.ndarray", start: int, stop: int) -> None:
        """The one group's step rows ``rows`` (showing the same request rows) := the mirror's pages in
        columns ``[start, stop)``, pages just appended, in kernel blocks (as :meth:`write_rows`): one
        broadcast add."""
        self._expand(0, self._mirror.pages_np[0][rows, start:stop], rows, start, nulls=False)

    def write_lines(self, lines: list[int], pages: list[int]) -> None:
        """The one group's step table: page column lines (``row * pages_per_request + column``) :=
        ``pages`` in kernel blocks (one numpy write; the mirror is already written)."""
        bpk = self._mirror.bpks[0]
        values = np.array(pages, dtype=np.int32)[:, None] * np.int32(bpk) + self._offsets_np[0]
        self._inputs3_np[0].reshape(-1, bpk)[lines] = values

    def wrote_pages(self, g: int, row: int, column: int, pages: list[int]) -> None:
        """Row ``row`` of group ``g`` gained ``pages`` (a few) at page columns ``column ..``, mirror written: the step
        row showing it is written item by item (kernel blocks ``page * bpk + k``), or the edit noted when no step row
        shows it."""
        b = self._batch_row_mv[row]
        if b < 0:
            self._note(g, np.array((row,)), column, column + len(pages))
            return
        bt = self._mirror
        out, bpk = self._step_mvs[g], bt.bpks[g]
        at = b * bt.widths[g] + column * bpk
        if bpk == 1:
            for page in pages:
                out[at] = page
                at += 1
            return
        for page in pages:
            first = page * bpk
            for k in range(bpk):
                out[at + k] = first + k
            at += bpk

    # ---- edits noted for the sync --------------------------------------------------------------------

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
            self._note(g, np.array([r]), int(lo), self._mirror.max_pages[g])

    def cleared(self, g: int, row: int) -> None:
        """Row ``row`` of group ``g`` was cleared (every column back to the null page)."""
        self._note(g, np.array((row,)), 0, self._mirror.max_pages[g])

    def _note(self, g: int, rows: np.ndarray, lo: int, hi: int) -> None:
        self._touched[g].append(rows)
        band = self._band[g]
        band[0], band[1] = min(band[0], lo), max(band[1], hi)

    # ---- the step ---------------------------------------------------------------------------------

    def sync(self, rows: np.ndarray, num_reqs_padded: int, same_rows: bool, null_until: int) -> None:
        """Step rows ``[0, len(rows))`` show ``rows``, ``[len(rows), num_reqs_padded)`` the null page."""
        n = rows.shape[0]
        bt = self._mirror
        assert n <= num_reqs_padded <= self._mirror.max_num_seqs, (n, num_reqs_padded)  # BlockTables.sync checks
        if not same_rows:
            for g, mirror in enumerate(bt.pages_np):
                if self.aliased:
                    np.take(mirror, rows, axis=0, out=self._inputs3_np[g][:n, :, 0])
                else:
                    self._expand(g, mirror[rows], slice(0, n), 0)
                self._inputs3_np[g][n:num_reqs_padded] = 0
            self._forget()
            return
        if any(self._touched):  # (a step whose edits all wrote the step rows too has nothing to copy)
            for g, touched in enumerate(self._touched):
                if touched:
                    self._copy_band(g, touched[0] if len(touched) == 1 else np.concatenate(touched))
            self._forget()
        if num_reqs_padded > null_until:
            for table in self._inputs3_np:
                table[max(null_until, n):num_reqs_padded] = 0

    def _copy_band(self, g: int, rows: np.ndarray) -> None:
        """The changed band of ``rows`` (request rows) into the step rows showing them."""
        lo, hi = self._band[g]
        if hi <= lo:
            return
        pos = self._mirror.batch_row_of[rows]
        if int(pos.min()) < 0:
            keep = pos >= 0
            pos, rows = pos[keep], rows[keep]
            if not pos.shape[0]:
                return
        self._expand(g, self._mirror.pages_np[g][rows, lo:hi], as_slice(pos), lo)

    def _forget(self) -> None:
        for g in range(len(self._touched)):
            self._touched[g] = []
            self._band[g] = [self._mirror.max_pages[g], 0]

    def show_null(self, num_reqs_padded: int) -> None:
        """Step rows ``[0, num_reqs_padded)`` := the null page."""
        for table in self._inputs3_np:
            table[:num_reqs_padded] = 0

    def commit(self) -> None:
        """Nothing to do: the persistent tables are the mirror (bpk 1 everywhere) or not kept."""

    def _expand(self, g: int, pages: np.ndarray, step_rows: "slice | np.ndarray", lo: int, *,
                nulls: bool = True) -> None:
        """Step rows ``step_rows`` of group ``g``, page columns ``lo ..`` := ``pages`` (``[rows, w]
        int32``; ``nulls``: may hold the null page 0) in kernel blocks."""
        cols = slice(lo, lo + pages.shape[1])
        if isinstance(step_rows, slice):
            out_np = self._inputs3_np[g][step_rows, cols]
            self._expand_into(torch.from_numpy(out_np), out_np, pages, g, nulls)  # (numpy slices cost less)
            return
        out = np.empty(pages.shape + (self._mirror.bpks[g],), dtype=np.int32)
        self._expand_into(torch.from_numpy(out), out, pages, g, nulls)
        self._inputs3_np[g][step_rows, cols] = out

    def _expand_into(self, out: torch.Tensor, out_np: np.ndarray, pages: np.ndarray, g: int,
                     nulls: bool = True) -> None:
        """``out[r, c, k] = pages[r, c] * bpk + k`` (0 for the null page): one broadcast add of int32
        (torch's is several times faster than numpy's into a strided band, at every size measured)."""
        bpk = self._mirror.bpks[g]
        if bpk == 1:
            out_np[..., 0] = pages
            return
        source = torch.from_numpy(pages if pages.flags.writeable else pages.copy())  # torch wants writable
        torch.add(self._offsets[g], source.unsqueeze(-1), alpha=bpk, out=out)
        if nulls and int(pages.min()) == 0:  # pages past a row's end are zeros, not page 0's kernel blocks
            out_np[pages == 0] = 0


def as_slice(rows: "np.ndarray | list[int]") -> "slice | np.ndarray":
    """Increasing consecutive rows as a slice (one dense write instead of an indexed one)."""
    first, last, n = int(rows[0]), int(rows[-1]), len(rows)
    if last - first + 1 == n:
        if isinstance(rows, list):
            if rows == list(range(first, last + 1)):
                return slice(first, last + 1)
        elif n < 3 or bool((rows[1:] > rows[:-1]).all()):
            return slice(first, last + 1)
    return rows if isinstance(rows, np.ndarray) else np.array(rows, dtype=np.int64)
