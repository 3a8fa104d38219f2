"""Device tables on a GPU: stale columns staged as page entries, written by one launch per step.

Two packings of every group's ``[max_num_seqs, width_g] int32`` table (kernel blocks) share one
device buffer: the *persistent* rows (row = a request's table row) and the *per-step* rows (row =
batch row, what attention reads). Edits only mark, per (group, row), the first page column the
device no longer matches; :meth:`StagedSync.commit` turns the stale columns into page entries
(destination, first kernel block, kernel blocks per page), copies them in one transfer from
pinned memory and writes them with one :func:`~graphkv.kernels.block_tables.write_pages` launch —
into the persistent row and, in the same launch, into the per-step row showing it, so a step
whose batch keeps its rows needs no gather. A batch whose rows changed costs one gather launch.
The staging buffers have a fixed size, the plan's ``tables.staged`` ledger entry (every page one
full step can append, twice); a larger commit (rows truncated or moved) takes several launches.
"""

from __future__ import annotations

import numpy as np
import torch

from graphkv.kernels.block_tables import PackedTables, gather_rows, write_pages
from graphkv.runtime.buffers import LedgerBuffers
from graphkv.runtime.ops import torch_ops
from graphkv.runtime.tables.mirror import PageMirror

__all__ = ["StagedSync", "page_first_blocks"]

_CLEAN = np.iinfo(np.int32).max  # stale-from column of a row whose device copy matches the host


def page_first_blocks(pages: np.ndarray, bpk: "np.ndarray | int") -> np.ndarray:
    """``[n] int64`` first kernel block of each page (``page * bpk``), ``-1`` for the null page 0."""
    return np.where(pages > 0, pages * bpk, -1)


class StagedSync:
    """The device tables of ``mirror`` on ``device`` (a CUDA device, or any with Triton kernels);
    ``kernels`` is ``"triton"`` or ``"torch"``."""

    def __init__(self, mirror: PageMirror, device: torch.device, kernels: str, buffers: LedgerBuffers) -> None:
        self._mirror = mirror
        seqs, widths = mirror.max_num_seqs, mirror.widths
        total = seqs * sum(widths)
        self.device = device
        self.storage = buffers.tensor("tables.device")
        index = (buffers.tensor("tables.group_offsets"), buffers.tensor("tables.group_widths"))
        self.persistent = PackedTables.view_of(self.storage[:total], seqs, widths, index=index)
        self.inputs = PackedTables.view_of(self.storage[total:], seqs, widths, index=index)
        self._kernels = kernels
        ints = buffers.array("tables.staged_group_ints")
        self._dev_start, self._in_start, self._dev_width, self._bpk = ints
        self._dev_start[1:] = np.cumsum([seqs * w for w in widths])[:-1]
        self._in_start[:] = self._dev_start + total
        self._dev_width[:] = widths
        self._bpk[:] = mirror.bpks
        # Per (group, row): pages the device's persistent row holds, and the first stale column.
        self._device_pages = buffers.array("tables.device_pages")
        self._stale_from = buffers.array("tables.stale_from")
        self._stale_from.fill(_CLEAN)
        self._any_stale = False
        self._staged = buffers.tensor("tables.staged")  # [3 * capacity] int64: dst | first | bpk of one launch
        self._staged_host = buffers.tensor("tables.staged_host")
        self._staged_host_np = self._staged_host.numpy()
        self._capacity = self._staged.numel() // 3
        self._idx = buffers.tensor("tables.idx_mapping")
        self._idx_host = buffers.tensor("tables.idx_mapping_host")
        self._copied: torch.cuda.Event | None = None
        if device.type == "cuda":
            with torch.cuda.device(device):
                self._copied = torch.cuda.Event()

    def persistent_tables(self) -> tuple[torch.Tensor, ...]:
        """Persistent device tables (current after :meth:`commit`)."""
        return self.persistent.tables

    # ---- edits (host only) -------------------------------------------------------------------------

    def write_through(self, rows: np.ndarray, dst: np.ndarray, ids: np.ndarray) -> bool:
        """Never here: the device is written from stale columns by :meth:`commit`."""
        return False

    def step_view(self) -> None:
        """Never here: the step tables live on the device."""
        return None

    def write_rows(self, rows: np.ndarray, start: int, block: np.ndarray) -> bool:
        """Never here: the device is written from stale columns by :meth:`commit`."""
        return False

    def appended_one_group(self, rows: np.ndarray, held: np.ndarray, top: int) -> None:
        """Rows ``rows`` of the only group gained pages: stale from ``held`` (their first new column) on."""
        self.edited(np.zeros(rows.shape[0], dtype=np.int64), rows, held)

    def appended(self, group: np.ndarray, seg_row: np.ndarray, held: np.ndarray, held_after: np.ndarray) -> None:
        """Rows ``seg_row`` of groups ``group`` gained pages: columns from ``held`` on are stale."""
        self.edited(group, seg_row, held)

    def edited(self, groups: np.ndarray, rows: np.ndarray, from_column: np.ndarray) -> None:
        """The device copy of each (group, row) may differ from the mirror from ``from_column`` on
        (pairs are distinct)."""
        self._stale_from[groups, rows] = np.minimum(self._stale_from[groups, rows], from_column)
        self._any_stale = True

    def wrote_pages(self, g: int, row: int, column: int, pages: list[int]) -> None:
        """Row ``row`` of group ``g`` gained ``pages`` at page columns ``column ..`` (mirror only): stale from
        ``column`` on."""
        if column < self._stale_from[g, row]:
            self._stale_from[g, row] = column
        self._any_stale = True

    def cleared(self, g: int, row: int) -> None:
        """Row ``row`` of group ``g`` was cleared: its device copy is stale from column 0 on."""
        self._stale_from[g, row] = 0
        self._any_stale = True

    # ---- the step -------------------------------------------------------------------------------------

    def commit(self, mirror: bool = True) -> None:
        """Write every stale column (and, with ``mirror``, the per-step rows showing it) in one copy
        and one launch."""
        if not self._any_stale:
            return
        bt = self._mirror
        group, row = np.nonzero(self._stale_from != _CLEAN)
        lo = self._stale_from[group, row].astype(np.int64)
        hi = np.maximum(bt.num_pages_np[group, row], self._device_pages[group, row]).astype(np.int64)
        count = np.maximum(hi - lo, 0)
        self._device_pages[group, row] = bt.num_pages_np[group, row]
        self._stale_from[group, row] = _CLEAN
        self._any_stale = False
        total = int(count.sum())
        if total == 0:
            return
        # Entry p of segment s is column lo[s] + (p - first entry of s).
        column = np.repeat(lo - (np.cumsum(count) - count), count) + np.arange(total)
        seg = np.repeat(np.arange(group.shape[0]), count)
        g, r = group[seg], row[seg]
        pages = bt.pages_flat[bt.host_start[g] + r * bt.host_pages[g] + column]
        bpk = self._bpk[g]
        first = page_first_blocks(pages, bpk)
        dst = self._dev_start[g] + r * self._dev_width[g] + column * bpk
        if mirror:
            batch_row = bt.batch_row_of[r]
            shown = batch_row >= 0
            if shown.any():
                in_dst = (self._in_start[g] + batch_row * self._dev_width[g] + column * bpk)[shown]
                dst = np.concatenate([dst, in_dst])
                first = np.concatenate([first, first[shown]])
                bpk = np.concatenate([bpk, bpk[shown]])
        self._write(dst, first, bpk)

    def sync(self, rows: np.ndarray, num_reqs_padded: int, same_rows: bool, null_until: int) -> None:
        """Commit, then per-step rows ``[0, len(rows))`` show ``rows`` and ``[len(rows),
        num_reqs_padded)`` the null page (one gather unless the batch kept its rows)."""
        self.commit(mirror=same_rows)
        n = rows.shape[0]
        assert n <= num_reqs_padded <= self._mirror.max_num_seqs, (n, num_reqs_padded)  # BlockTables.sync checks
        if not same_rows:
            self._wait_for_last_copy()
            self._idx_host[:n].copy_(torch.from_numpy(rows.astype(np.int32, copy=False)))
            self._idx[:n].copy_(self._idx_host[:n], non_blocking=True)
            self._record_copy()
            gather = gather_rows if self._kernels == "triton" else torch_ops.gather_rows
            gather(self.persistent, self.inputs, self._idx[:n], num_reqs_padded)
        elif num_reqs_padded > null_until:
            for table in self.inputs.tables:
                table[max(null_until, n):num_reqs_padded].zero_()

    def show_null(self, num_reqs_padded: int) -> None:
        """Per-step rows ``[0, num_reqs_padded)`` := the null page."""
        for table in self.inputs.tables:
            table[:num_reqs_padded].zero_()

    def _write(self, dst: np.ndarray, first: np.ndarray, bpk: np.ndarray) -> None:
        """Write page entries through the fixed staging buffers: one copy and one launch per
        ``capacity`` entries (one for any step's appends)."""
        write = write_pages if self._kernels == "triton" else torch_ops.write_pages
        host, cap, num = self._staged_host_np, self._capacity, dst.shape[0]
        for lo in range(0, num, cap):
            hi = min(lo + cap, num)
            e = hi - lo
            self._wait_for_last_copy()  # the last transfer has read the pinned buffer
            host[:e] = dst[lo:hi]
            host[e:2 * e] = first[lo:hi]
            host[2 * e:3 * e] = bpk[lo:hi]
            self._staged[:3 * e].copy_(self._staged_host[:3 * e], non_blocking=True)
            self._record_copy()
            write(self.storage, self._staged, e, int(bpk[lo:hi].max()))

    def _wait_for_last_copy(self) -> None:
        if self._copied is not None:
            self._copied.synchronize()  # the last transfer has read the pinned staging buffers

    def _record_copy(self) -> None:
        if self._copied is not None:
            self._copied.record()
