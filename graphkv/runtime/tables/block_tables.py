"""Per-group block tables: a host mirror in pages (the single source of truth) and its device copies.

The host holds, per KV-cache group, every request row's page ids ``pages_np[g]`` ``[max_num_seqs,
pages_per_request_g] int32`` and how many it holds, ``num_pages_np`` ``[num_groups,
max_num_seqs]``. Edits (:meth:`BlockTables.append_pages` for a whole step at once,
:meth:`~BlockTables.append`, :meth:`~BlockTables.truncate`, :meth:`~BlockTables.remove`,
:meth:`~BlockTables.move`, :meth:`~BlockTables.overwrite`) change only the host, in pages, and
remember per row the first column the device no longer matches. The device holds the same tables
in kernel blocks (page ``b`` is kernel blocks ``b*bpk .. b*bpk + bpk - 1``), twice: persistent rows
and the step's rows in batch order (:mod:`graphkv.runtime.tables.device`). :meth:`commit` and
:meth:`sync` write only the stale columns, expanded to kernel blocks on the device side, as one
batch of page entries (one copy and one launch on a GPU, numpy straight into host memory on a
CPU); :meth:`sync` also writes them into the step's rows when the batch keeps its rows, and
gathers (one launch) only when the batch's rows changed.

Invariant: entries past a row's pages are 0 (the null page), on host and device alike.

Example (one step)::

    tables = BlockTables(plan, device="cuda")
    tables.append(0, [[5, 9], [3]])                 # request row 0: pages 5, 9 in group 0, 3 in group 1
    tables.sync(np.array([0]), num_reqs_padded=2)   # batch row 0 shows row 0, batch row 1 the null page
    tables.input_tables[0][:2]                      # what attention reads
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.kernels.block_tables import PackedTables
from graphkv.plan.plan import Plan
from graphkv.runtime.device import resolve_device
from graphkv.runtime.ops.choice import resolve_kernels
from graphkv.runtime.tables.device import DeviceTables
from graphkv.runtime.tables.expansion import page_first_blocks
from graphkv.runtime.tables.page_ids import PageEntries, int_array

__all__ = ["BlockTables"]

_CLEAN = np.iinfo(np.int32).max  # stale-from column of a row whose device copy matches the host


class BlockTables:
    """Block tables of every group of ``plan`` on ``device``.

    Persistent tensors (allocated once, same ``data_ptr()`` every step): :attr:`tables` and
    :attr:`input_tables`, ``[max_num_seqs, width_g] int32`` per group in kernel blocks. Host state
    (numpy): ``pages_np[g]`` ``[max_num_seqs, pages_per_request_g] int32`` page ids and
    ``num_pages_np`` ``[num_groups, max_num_seqs] int32`` pages held per row.

    ``kernels``: ``"triton"``, ``"torch"`` or ``"auto"`` (Triton on CUDA devices; on a CPU the
    device tables are host memory and are written with numpy). Triton on a CPU runs in its
    interpreter, which is only a correctness checker.
    """

    def __init__(self, plan: Plan, device: "str | torch.device" = "cpu", *, kernels: str = "auto") -> None:
        if not isinstance(plan, Plan):
            raise SpecError(Problem(field="plan", value=type(plan).__name__, limit="must be a graphkv Plan",
                                    fix="build it with graphkv.compile(model, limits, budget)"))
        self.plan = plan
        self.device = resolve_device(device)
        self._kernels = resolve_kernels(kernels, self.device)
        groups = plan.groups
        self.max_num_seqs = seqs = plan.limits.max_num_seqs
        self.num_blocks = plan.num_blocks
        self.bpks = tuple(g.bpk for g in groups)
        self.widths = tuple(g.block_table_width for g in groups)
        self.max_pages = tuple(g.pages_per_request for g in groups)
        self.block_sizes = tuple(g.block_size for g in groups)
        num_groups = len(groups)
        # Host truth: page ids per (group, row), all groups packed in one flat array.
        host_starts = np.concatenate([[0], np.cumsum([seqs * p for p in self.max_pages])])
        self._pages_flat = np.zeros(int(host_starts[-1]), dtype=np.int32)
        self.pages_np = tuple(self._pages_flat[s:s + seqs * p].reshape(seqs, p)
                              for s, p in zip(host_starts[:-1].tolist(), self.max_pages))
        self.num_pages_np = np.zeros((num_groups, seqs), dtype=np.int32)
        # Per group: where a row starts on the host and on the device, its pages, its bpk.
        self._host_start = host_starts[:-1].astype(np.int64)
        self._host_pages = np.array(self.max_pages, dtype=np.int64)
        self._bpk = np.array(self.bpks, dtype=np.int64)
        self._dev_start = np.concatenate([[0], np.cumsum([seqs * w for w in self.widths])[:-1]]).astype(np.int64)
        self._dev_width = np.array(self.widths, dtype=np.int64)
        self._max_pages_np = np.array(self.max_pages, dtype=np.int64)
        # What the device shows: per (group, row) the pages its persistent row holds and the first
        # column that may differ from the host (_CLEAN: none); which row each batch row shows.
        self._device_pages = np.zeros((num_groups, seqs), dtype=np.int32)
        self._stale_from = np.full((num_groups, seqs), _CLEAN, dtype=np.int32)
        self._any_stale = False
        self._shown_rows = np.zeros(0, dtype=np.int64)  # persistent row of each live batch row
        self._batch_row_of = np.full(seqs, -1, dtype=np.int64)  # batch row showing each persistent row
        self._null_until = 0  # batch rows [len(_shown_rows), _null_until) hold the null page
        self._shown_valid = True  # False: the per-step rows are unknown, the next sync gathers
        self._device_tables = DeviceTables(seqs, self.widths, self.device, self._kernels)

    # ---- properties ----------------------------------------------------------------------------

    @property
    def num_groups(self) -> int:
        """Number of KV-cache groups."""
        return len(self.widths)

    @property
    def kernels(self) -> str:
        """The kernel implementation in use, ``"triton"`` or ``"torch"`` (``"auto"`` resolved)."""
        return self._kernels

    @property
    def tables(self) -> tuple[torch.Tensor, ...]:
        """Persistent device tables (row = request row), ``[max_num_seqs, width_g] int32`` per group,
        kernel blocks; current after :meth:`commit` / :meth:`sync`."""
        return self._device_tables.persistent.tables

    @property
    def input_tables(self) -> tuple[torch.Tensor, ...]:
        """Persistent per-step tables (row = batch row), ``[max_num_seqs, width_g] int32``; rows
        ``[0, num_reqs_padded)`` are current after :meth:`sync`."""
        return self._device_tables.inputs.tables

    @property
    def packed_input_tables(self) -> PackedTables:
        """The per-step tables packed for kernels that take all groups at once."""
        return self._device_tables.inputs

    # ---- host-side row edits -------------------------------------------------------------------

    def append_pages(self, rows: np.ndarray, entries: PageEntries) -> None:
        """Append ``entries`` (segment ``s``: ``entries.count[s]`` pages of ``entries.ids`` to row
        ``rows[entries.req[s]]`` in group ``entries.group[s]``) in one vectorized pass. Each (row,
        group) appears at most once. Raises :class:`CapacityError` when a row would exceed its
        group's pages per request (nothing is changed then). Page ids are not checked here:
        :meth:`append` checks them, :class:`~graphkv.runtime.step.step.Step` checks ownership."""
        seg_row = rows[entries.req]
        group, count = entries.group, entries.count
        held = self.num_pages_np[group, seg_row].astype(np.int64)  # [segments]
        over = held + count > self._max_pages_np[group]
        if over.any():
            s = int(np.flatnonzero(over)[0])
            raise self._capacity_error(int(seg_row[s]), int(group[s]), int(held[s]), int(count[s]))
        # Page p of segment s goes to host column held[s] + (p - first page of s).
        seg_first = np.cumsum(count) - count
        base = self._host_start[group] + seg_row * self._host_pages[group] + held - seg_first
        self._pages_flat[np.repeat(base, count) + np.arange(entries.num_pages)] = entries.ids
        self.num_pages_np[group, seg_row] = held + count
        self._mark_stale(group, seg_row, held)

    def append(self, req_index: int, page_ids_per_group: Sequence[Optional[Sequence[int]]]) -> None:
        """Append pages (scheduler page ids) to row ``req_index`` of each group; ``None`` or an empty
        entry leaves a group unchanged. Raises :class:`SpecError` for ids that are not integers in
        ``[0, num_blocks)`` and :class:`CapacityError` when a group's row would exceed its pages per
        request (nothing is changed then)."""
        row = self._check_row("req_index", req_index)
        entries = self._entries(page_ids_per_group)
        if entries is not None:
            self.append_pages(np.array([row], dtype=np.int64), entries)

    def overwrite(self, req_index: int, page_ids_per_group: Sequence[Optional[Sequence[int]]]) -> None:
        """Replace row ``req_index`` of each group with exactly the given pages (``None`` leaves a
        group unchanged; an empty entry clears it). Checks as :meth:`append` (nothing changed on error)."""
        row = self._check_row("req_index", req_index)
        entries = self._entries(page_ids_per_group, keep_empty=True)
        if entries is None:
            return
        too_many = entries.count > self._max_pages_np[entries.group]
        if too_many.any():
            s = int(np.flatnonzero(too_many)[0])
            raise self._capacity_error(row, int(entries.group[s]), 0, int(entries.count[s]))
        keep = self.num_pages_np[:, row].copy()
        keep[entries.group] = 0
        self.truncate(row, keep)
        filled = entries.count > 0
        if filled.any():
            self.append_pages(np.array([row], dtype=np.int64),
                              PageEntries(req=entries.req[filled], group=entries.group[filled],
                                          count=entries.count[filled], ids=entries.ids, id_range=entries.id_range))

    def truncate(self, req_index: int, num_pages_per_group: Sequence[int]) -> None:
        """Keep only the first ``num_pages_per_group[g]`` pages of row ``req_index`` in each group (the
        rest return to the null page), e.g. to undo an append or roll back rejected drafts' pages.
        Raises :class:`SpecError` for a count above the pages the row holds (nothing changed then)."""
        row = self._check_row("req_index", req_index)
        held = self.num_pages_np[:, row].copy()
        keep = int_array(num_pages_per_group, "num_pages_per_group", "page counts") \
            if not isinstance(num_pages_per_group, np.ndarray) else num_pages_per_group.astype(np.int64)
        if keep.shape != (self.num_groups,) or (keep < 0).any() or (keep > held).any():
            raise SpecError(Problem(field="num_pages_per_group", value=keep.tolist(),
                                    limit=f"needs one count per group ({self.num_groups}), each in 0..pages held "
                                          f"({held.tolist()} for row {row})",
                                    fix="pass how many of the row's pages to keep in each group"))
        for g in np.flatnonzero(keep < held).tolist():
            self.pages_np[g][row, keep[g]:held[g]] = 0
        self.num_pages_np[:, row] = keep
        groups = np.arange(self.num_groups)
        self._mark_stale(groups, np.full(self.num_groups, row), keep)

    def remove(self, req_index: int) -> None:
        """Free row ``req_index`` in every group (its entries return to the null page)."""
        self.truncate(req_index, np.zeros(self.num_groups, dtype=np.int64))

    def move(self, src: int, dst: int) -> None:
        """Move row ``src`` to row ``dst`` in every group (``dst``'s old pages are dropped, ``src``
        becomes empty), e.g. to condense the batch after a request finishes."""
        src = self._check_row("src", src)
        dst = self._check_row("dst", dst)
        if src == dst:
            return
        held = self.num_pages_np[:, src].copy()
        self.remove(dst)
        for g, n in enumerate(held.tolist()):
            self.pages_np[g][dst, :n] = self.pages_np[g][src, :n]
        self.num_pages_np[:, dst] = held
        self._mark_stale(np.arange(self.num_groups), np.full(self.num_groups, dst), np.zeros(self.num_groups))
        self.remove(src)

    # ---- device side ----------------------------------------------------------------------------

    def commit(self) -> int:
        """Write every stale column of the persistent device rows (expanded to kernel blocks), and of
        the per-step rows showing them: one copy and one launch on a GPU, numpy on a CPU. Returns the
        number of page entries written. Not capture-safe (reads host state)."""
        return self._write_stale(mirror=True)

    def sync(self, rows: np.ndarray, num_reqs_padded: int, *, same_rows: bool | None = None) -> int:
        """Make the device tables current for a step whose batch row ``i`` is request row
        ``rows[i]``: commit stale columns, then the per-step rows ``[0, len(rows))`` show those rows
        and ``[len(rows), num_reqs_padded)`` the null page. When the batch shows the same rows as the
        last sync (``same_rows``; compared when ``None``), the stale columns are written into the
        per-step rows by the same launch and nothing is gathered; otherwise one gather follows.
        Returns the page entries written. Not capture-safe."""
        n = rows.shape[0]
        if not self._shown_valid:
            same_rows = False
        elif same_rows is None:
            same_rows = n == self._shown_rows.shape[0] and bool(np.array_equal(rows, self._shown_rows))
        written = self._write_stale(mirror=same_rows) if self._any_stale else 0
        if not same_rows:
            self._device_tables.gather(rows, num_reqs_padded)
            self._show(rows.copy(), num_reqs_padded)
        elif num_reqs_padded > self._null_until:
            self._device_tables.zero_inputs(max(self._null_until, n), num_reqs_padded)
            self._null_until = num_reqs_padded
        return written

    def show_null_rows(self, num_reqs_padded: int) -> None:
        """Per-step rows ``[0, num_reqs_padded)`` := the null page (a dummy step, e.g. for capture)."""
        self._device_tables.zero_inputs(0, num_reqs_padded)
        self._show(np.zeros(0, dtype=np.int64), num_reqs_padded)

    def forget_shown_rows(self) -> None:
        """Make the next :meth:`sync` gather (e.g. after something else wrote the per-step rows)."""
        self._show(np.zeros(0, dtype=np.int64), 0)
        self._shown_valid = False

    def _show(self, rows: np.ndarray, num_reqs_padded: int) -> None:
        self._batch_row_of[self._shown_rows] = -1
        self._batch_row_of[rows] = np.arange(rows.shape[0])
        self._shown_rows = rows
        self._null_until = num_reqs_padded
        self._shown_valid = True

    def state_pages(self, group: int, rows: np.ndarray) -> np.ndarray:
        """The state page of each of ``rows`` in a Mamba group: the row's first page (page 0, the
        null page, for a row that holds none). Host-side (numpy), no device work."""
        return self.pages_np[group][rows, 0]

    # ---- helpers --------------------------------------------------------------------------------

    def _mark_stale(self, groups: np.ndarray, rows: np.ndarray, from_column: np.ndarray) -> None:
        """The device copy of each (group, row) may differ from the host from ``from_column`` on
        (pairs are distinct)."""
        self._stale_from[groups, rows] = np.minimum(self._stale_from[groups, rows], from_column)
        self._any_stale = True

    def _write_stale(self, mirror: bool) -> int:
        """Write the stale columns of every (group, row) to the device (and, with ``mirror``, to the
        per-step row showing that row); returns the page entries written."""
        if not self._any_stale:
            return 0
        group, row = np.nonzero(self._stale_from != _CLEAN)  # stale segments
        lo = self._stale_from[group, row].astype(np.int64)
        hi = np.maximum(self.num_pages_np[group, row], self._device_pages[group, row]).astype(np.int64)
        count = np.maximum(hi - lo, 0)
        self._device_pages[group, row] = self.num_pages_np[group, row]
        self._stale_from[group, row] = _CLEAN
        self._any_stale = False
        total = int(count.sum())
        if total == 0:
            return 0
        # Entry p of segment s is column lo[s] + (p - first entry of s).
        column_shift = np.repeat(lo - (np.cumsum(count) - count), count)
        column = column_shift + np.arange(total)
        seg = np.repeat(np.arange(group.shape[0]), count)
        g, r = group[seg], row[seg]
        pages = self._pages_flat[self._host_start[g] + r * self._host_pages[g] + column]
        bpk = self._bpk[g]
        first = page_first_blocks(pages, bpk)
        dst = self._dev_start[g] + r * self._dev_width[g] + column * bpk
        if mirror:
            batch_row = self._batch_row_of[r]
            shown = batch_row >= 0
            if shown.any():
                mirror_dst = (self._device_tables.inputs_offset + self._dev_start[g] + batch_row * self._dev_width[g]
                              + column * bpk)[shown]
                dst = np.concatenate([dst, mirror_dst])
                first = np.concatenate([first, first[shown]])
                bpk = np.concatenate([bpk, bpk[shown]])
        self._device_tables.write(dst, first, bpk)
        return total

    def _check_row(self, name: str, row: object) -> int:
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= row < self.max_num_seqs:
            raise SpecError(Problem(field=name, value=row,
                                    limit=f"must be a row in [0, max_num_seqs={self.max_num_seqs})",
                                    fix="use the request's persistent row index"))
        return int(row)

    def _entries(self, page_ids_per_group: Sequence[Optional[Sequence[int]]],
                 keep_empty: bool = False) -> PageEntries | None:
        """One row's page ids per group as :class:`PageEntries` (request 0), checked: integers in
        ``[0, num_blocks)``."""
        if isinstance(page_ids_per_group, (str, bytes)) or not hasattr(page_ids_per_group, "__len__") \
                or len(page_ids_per_group) != self.num_groups:
            raise SpecError(Problem(field="page_ids_per_group", value=page_ids_per_group,
                                    limit=f"needs one entry per KV-cache group ({self.num_groups})",
                                    fix="pass a list with one page-ID list (or None) per group"))
        groups, counts, ids = [], [], []
        for g, one in enumerate(page_ids_per_group):
            if one is None:
                continue
            converted = int_array(one, f"page_ids_per_group[{g}]", "page ids")
            if converted.size == 0 and not keep_empty:
                continue
            if converted.size and (int(converted.min()) < 0 or int(converted.max()) >= self.num_blocks):
                raise SpecError(Problem(field=f"page_ids_per_group[{g}]",
                                        value=(int(converted.min()), int(converted.max())),
                                        limit=f"page IDs must be in [0, num_blocks={self.num_blocks})",
                                        fix="pass page IDs from this plan's pool"))
            groups.append(g)
            counts.append(converted.size)
            ids.append(converted)
        if not groups:
            return None
        flat = np.concatenate(ids)
        return PageEntries(req=np.zeros(len(groups), dtype=np.int64), group=np.array(groups, dtype=np.int64),
                           count=np.array(counts, dtype=np.int64), ids=flat,
                           id_range=(int(flat.min()), int(flat.max())) if flat.size else (1, 1))

    def _capacity_error(self, req_index: int, g: int, held: int, adding: int) -> CapacityError:
        group = self.plan.groups[g]
        return CapacityError(Problem(
            field=f"page_ids_per_group[{g}]", value=adding,
            limit=(f"request row {req_index}: group {g} ({group.spec.describe()}) holds {held} pages and cannot take "
                   f"{adding} more; its capacity is {self.max_pages[g]} pages per request (block table width "
                   f"{self.widths[g]} = {self.max_pages[g]} pages x bpk {self.bpks[g]})"),
            fix=("free pages that left the window first, or " if group.kind.value == "sliding_window" else "")
                + f"keep requests within max_model_len={self.plan.max_model_len}, or raise max_model_len when "
                  "compiling the plan"))
