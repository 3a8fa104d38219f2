"""Per-group block tables: a host mirror in pages (the single source of truth) and its device copies.

The host holds, per KV-cache group, every request row's page ids ``pages_np[g]`` ``[max_num_seqs,
pages_per_request_g] int32`` and how many it holds, ``num_pages_np`` ``[num_groups,
max_num_seqs]``. Edits (:meth:`BlockTables.append_batch` / :meth:`~BlockTables.append_pages` for a
whole step at once, :meth:`~BlockTables.append`, :meth:`~BlockTables.append_few`, :meth:`~BlockTables.truncate`,
:meth:`~BlockTables.remove`, :meth:`~BlockTables.move`, :meth:`~BlockTables.overwrite`) change
the mirror in pages and tell the device side what changed. The device holds the same tables in
kernel blocks (page ``b`` is kernel blocks ``b*bpk .. b*bpk + bpk - 1``): persistent rows, and
the step's rows in batch order (what attention reads). Two strategies keep them current:

- on a CUDA device (or ``kernels="triton"``), :class:`~graphkv.runtime.tables.staged_sync.StagedSync`:
  stale columns become page entries written by one launch per step, into the persistent and the
  step's rows at once; a gather runs only when the batch's rows changed;
- on a CPU, :class:`~graphkv.runtime.tables.host_sync.HostSync`: the device *is* the host, so
  edits write the step's rows straight away (numpy), and pages split into kernel blocks are
  expanded by one broadcast add over the columns that changed.

Invariant: entries past a row's pages are 0 (the null page), on host and device alike.

Example (one step)::

    tables = BlockTables(plan, device="cuda")
    tables.append_batch([0, 1], [([5, 9], [3]), None])  # row 0: pages 5, 9 in group 0, 3 in group 1
    tables.sync(np.array([0, 1]), num_reqs_padded=4)    # batch rows 0, 1 show rows 0, 1; 2, 3 the null page
    tables.input_tables[0][:4]                          # what attention reads
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch

from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.kernels.block_tables import PackedTables
from graphkv.plan.plan import Plan
from graphkv.runtime.buffers import LedgerBuffers
from graphkv.runtime.device import resolve_device
from graphkv.runtime.ops.choice import resolve_kernels
from graphkv.runtime.tables.host_sync import HostSync
from graphkv.runtime.tables.mirror import PageMirror
from graphkv.runtime.tables.page_ids import PageEntries, flatten_new_pages, int_array
from graphkv.runtime.tables.refusals import capacity_error, capacity_fix, checked_rows
from graphkv.runtime.tables.staged_sync import StagedSync
from graphkv.runtime.tables.lean_append import append_one_group

__all__ = ["FEW_PAGES", "BlockTables"]

FEW_PAGES = 32  # up to this many pages of a group, a row's pages are read and cleared item by item

_ROWS_AT_ONCE = 1024  # from this many pages on, uniform appends are written row slice by row slice


class BlockTables:
    """Block tables of every group of ``plan`` on ``device``.

    Persistent tensors (allocated once, same ``data_ptr()`` every step): :attr:`input_tables` and
    (except on a CPU with several kernel blocks per page) :attr:`tables`, ``[max_num_seqs,
    width_g] int32`` per group in kernel blocks. Host state (numpy): ``pages_np[g]``
    ``[max_num_seqs, pages_per_request_g] int32`` page ids and ``num_pages_np`` ``[num_groups,
    max_num_seqs] int32`` pages held per row. Every tensor and array is one of the plan's
    ``tables.*`` ledger entries, allocated from it. ``edits`` (int) grows with every edit but
    :meth:`append_few`: what a cache of the tables' contents compares to see that it is current.

    ``kernels``: ``"triton"``, ``"torch"`` or ``"auto"`` (Triton on CUDA devices; on a CPU the
    device tables are host memory written with numpy and torch). Triton on a CPU runs in its
    interpreter, which is only a correctness checker.
    """

    def __init__(self, plan: Plan, device: "str | torch.device" = "cpu", *, kernels: str = "auto") -> None:
        if not isinstance(plan, Plan):
            raise SpecError(Problem(field="plan", value=type(plan).__name__, limit="must be a graphkv Plan",
                                    fix="build it with graphkv.compile(model, limits, budget)"))
        self.plan = plan
        self.device = resolve_device(device)
        self._kernels = resolve_kernels(kernels, self.device)
        host = self.device.type == "cpu" and self._kernels == "torch"
        # The plan's ledger entries of this layout: a CPU's host sync, or the staged sync (CUDA, or Triton's
        # interpreter on a CPU).
        buffers = LedgerBuffers.of_plan(plan, self.device, ("tables.",), layout="cpu" if host else "cuda")
        if host:
            aliased = HostSync.aliases_mirror(tuple(g.bpk for g in plan.groups))
            storage = buffers.tensor("tables.device" if aliased else "tables.step_rows")
            mirror_pages = storage.numpy()[:PageMirror.buffer_size(plan)] if aliased else None
            self.mirror = m = PageMirror(plan, buffers, mirror_pages)
            self._sync: HostSync | StagedSync = HostSync(m, storage, buffers)
        else:
            self.mirror = m = PageMirror(plan, buffers)
            self._sync = StagedSync(m, self.device, self._kernels, buffers)
        assert not buffers.untaken(), f"ledger entries the block tables did not allocate: {buffers.untaken()}"
        # The mirror's arrays, under the names the rest of the runtime reads.
        self.max_num_seqs, self.num_blocks, self.num_groups = m.max_num_seqs, m.num_blocks, m.num_groups
        self.bpks, self.widths, self.max_pages, self.block_sizes = m.bpks, m.widths, m.max_pages, m.block_sizes
        self.pages_flat, self.pages_np, self.num_pages_np = m.pages_flat, m.pages_np, m.num_pages_np
        self._num_pages0 = m.num_pages_np[0]
        self._host_start, self._host_pages, self._max_pages_np = m.host_start, m.host_pages, m.host_pages
        self._state_groups = frozenset(g.index for g in plan.groups if g.is_ssm)  # what state_pages accepts
        # Bumped by every edit but append_few: whoever caches what the tables held (a repeated step's capacities)
        # compares it to see that nothing else edited them since.
        self.edits = 0
        self._foreign_sync = False  # the step rows were last shown by a call from outside a Step (sync, show_null_rows)

    # ---- properties ----------------------------------------------------------------------------

    @property
    def kernels(self) -> str:
        """The kernel implementation in use, ``"triton"`` or ``"torch"`` (``"auto"`` resolved)."""
        return self._kernels

    @property
    def tables(self) -> tuple[torch.Tensor, ...]:
        """Persistent device tables (row = request row), ``[max_num_seqs, width_g] int32`` per group,
        kernel blocks; current after :meth:`commit` (nothing on the step path reads them). On a CPU
        with more than one kernel block per page none are kept (the mirror is the persistent copy):
        each access expands the mirror into new tensors."""
        return self._sync.persistent_tables()

    @property
    def input_tables(self) -> tuple[torch.Tensor, ...]:
        """Persistent per-step tables (row = batch row), ``[max_num_seqs, width_g] int32``; rows
        ``[0, num_reqs_padded)`` are current after :meth:`sync`."""
        return self._sync.inputs.tables

    @property
    def packed_input_tables(self) -> PackedTables:
        """The per-step tables packed for kernels that take all groups at once."""
        return self._sync.inputs

    # ---- host-side row edits -------------------------------------------------------------------

    def append_pages(self, rows: np.ndarray, entries: PageEntries) -> None:
        """Append ``entries`` (segment ``s``: ``entries.count[s]`` pages of ``entries.ids`` to row
        ``rows[entries.req[s]]`` in group ``entries.group[s]``) in one vectorized pass. Each (row,
        group) appears at most once. Raises :class:`CapacityError` when a row would exceed its
        group's pages per request (nothing is changed then). Page ids are not checked here:
        :meth:`append_batch` checks them, :class:`~graphkv.runtime.step.step.Step` checks ownership."""
        group, count = entries.group, entries.count
        seg_row = rows if entries.req is None else rows[entries.req]
        if self.num_groups == 1:
            held = self._num_pages0[seg_row]
            held_after = held + count
            top = int(held_after.max())
            if top > self.max_pages[0]:
                s = int(np.flatnonzero(held_after > self.max_pages[0])[0])
                raise self._capacity_error(int(seg_row[s]), 0, int(held[s]), int(count[s]))
            base = seg_row * self._host_pages[0]
        else:
            held = self.num_pages_np[group, seg_row]
            held_after = held + count
            over = held_after > self._host_pages[group]
            if over.any():
                s = int(np.flatnonzero(over)[0])
                raise self._capacity_error(int(seg_row[s]), int(group[s]), int(held[s]), int(count[s]))
            base = self._host_start[group] + seg_row * self._host_pages[group]
        self.edits += 1
        num = entries.num_pages
        dst = None  # the mirror index of each page, when the write used one
        if entries.uniform_count == 1:  # one page per segment (e.g. a decode step crossing a page)
            dst = base + held
            if not self._sync.write_through(seg_row, dst, entries.ids):  # mirror and step rows in one write
                self.pages_flat[dst] = entries.ids
                dst = None
        elif num >= _ROWS_AT_ONCE and self.num_groups == 1 and entries.uniform_count and held.min() == held.max():
            # Every row holds the same pages and gains the same number: one row-slice write.
            start = int(held[0])
            self.pages_np[0][seg_row, start:start + entries.uniform_count] = entries.ids.reshape(seg_row.shape[0], -1)
        elif num:  # page p of segment s goes to column held[s] + (p - first page of s)
            shift = held - (np.cumsum(count) - count)
            dst = np.repeat(base + shift, count) + self.mirror.index_range(num)
            if not self._sync.write_through(seg_row, dst, entries.ids):
                self.pages_flat[dst] = entries.ids
                dst = None
        if self.num_groups == 1:
            self._num_pages0[seg_row] = held_after
            if dst is None:
                self._sync.appended_one_group(seg_row, held, top)
        else:
            self.num_pages_np[group, seg_row] = held_after
            if dst is None:
                self._sync.appended(group, seg_row, held, held_after)

    def append_few(self, g: int, row: int, pages: list[int]) -> None:
        """Append ``pages`` (a few plain ints in ``[1, num_blocks)``, room for them in the row: the caller checked) to
        row ``row`` of group ``g``, item by item, the step row showing it too (a repeated decode step whose requests
        cross into new pages: cheaper than any numpy call)."""
        m = self.mirror
        k = g * m.max_num_seqs + row
        held = m.all_num_pages_mv[k]
        assert held + len(pages) <= m.max_pages[g], (g, row, held, pages)
        at, mirror = m.starts[g] + row * m.max_pages[g] + held, m.pages_mv
        for page in pages:
            mirror[at] = page
            at += 1
        m.all_num_pages_mv[k] = held + len(pages)
        self._sync.wrote_pages(g, row, held, pages)

    def append_batch(self, rows: "Sequence[int] | np.ndarray", new_pages: Sequence[Any]) -> None:
        """Append a whole step's pages at once: row ``rows[i]`` gains ``new_pages[i][g]`` in group ``g``
        (``new_pages[i]`` is ``None`` for a row that gains none), in one vectorized pass. Raises
        :class:`SpecError` for rows that are not distinct rows in ``[0, max_num_seqs)`` or page ids that
        are not integers in ``[0, num_blocks)``, and :class:`CapacityError` when a row would exceed its
        group's pages per request; nothing is changed then. (:class:`~graphkv.runtime.step.step.Step`
        adds page ownership checks on top.)"""
        typed = isinstance(rows, np.ndarray) and rows.ndim == 1 and rows.dtype.kind in "iu"  # ints already
        row_list = rows.tolist() if typed else list(rows) if hasattr(rows, "__iter__") else [rows]
        top_row = -1
        if len(row_list) != len(new_pages) or len(set(row_list)) != len(row_list) or (row_list and (
                (not typed and set(map(type, row_list)) != {int}) or min(row_list) < 0
                or (top_row := max(row_list)) >= self.max_num_seqs)):
            raise SpecError(Problem(field="rows", value=row_list,
                                    limit=f"need one distinct row in [0, max_num_seqs={self.max_num_seqs}) per entry "
                                          f"of new_pages ({len(new_pages)})",
                                    fix="pass the persistent rows of the requests, once each"))
        self.edits += 1
        if self.num_groups == 1 and append_one_group(self.mirror, self._sync, rows if typed else None, row_list,
                                                     top_row, new_pages):
            return
        entries = flatten_new_pages(new_pages, self.num_groups, row_list)
        if entries is None:
            return
        lo, hi = entries.id_range
        if lo < 0 or hi >= self.num_blocks:
            raise SpecError(Problem(field="new_pages", value=(lo, hi),
                                    limit=f"page IDs must be in [0, num_blocks={self.num_blocks})",
                                    fix="pass page IDs from this plan's pool"))
        self.append_pages(rows.astype(np.int64, copy=False) if typed else np.array(row_list, dtype=np.int64), entries)

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
                              PageEntries(req=entries.request_of_segment()[filled], group=entries.group[filled],
                                          count=entries.count[filled], ids=entries.ids, id_range=entries.id_range))

    def truncate(self, req_index: int, num_pages_per_group: Sequence[int]) -> None:
        """Keep only the first ``num_pages_per_group[g]`` pages of row ``req_index`` in each group (the
        rest return to the null page), e.g. to undo an append or roll back rejected drafts' pages.
        Raises :class:`SpecError` for a count above the pages the row holds (nothing changed then).

        Tables you keep yourself only: the tables of a :class:`~graphkv.runtime.step.step.Step`
        (``step.tables``) are edited through :meth:`Step.truncate <graphkv.runtime.step.step.Step.truncate>`
        and :meth:`Step.finish <graphkv.runtime.step.step.Step.finish>`, which keep its page ownership (holder
        counts, written tokens) in step; truncated here, the dropped pages stay held by the request in the
        Step's ownership, and the Step's next step takes its full path (which refuses what the pages no longer
        cover)."""
        row = self._check_row("req_index", req_index)
        held = self.num_pages_np[:, row].copy()
        keep = int_array(num_pages_per_group, "num_pages_per_group", "page counts") \
            if not isinstance(num_pages_per_group, np.ndarray) else num_pages_per_group.astype(np.int64)
        if keep.shape != (self.num_groups,) or (keep < 0).any() or (keep > held).any():
            raise SpecError(Problem(field="num_pages_per_group", value=keep.tolist(),
                                    limit=f"needs one count per group ({self.num_groups}), each in 0..pages held "
                                          f"({held.tolist()} for row {row})",
                                    fix="pass how many of the row's pages to keep in each group"))
        self.edits += 1
        shrunk = np.flatnonzero(keep < held)
        for g in shrunk.tolist():
            self.pages_np[g][row, keep[g]:held[g]] = 0
        self.num_pages_np[:, row] = keep
        if shrunk.size:
            self._sync.edited(shrunk, np.full(shrunk.size, row), keep[shrunk])

    def held_pages(self, req_index: int) -> list["list[int] | np.ndarray"]:
        """The pages row ``req_index`` holds in each group, in page order: a list of ints where it holds at
        most :data:`FEW_PAGES` (read item by item: cheaper than a numpy view), else a view of the mirror."""
        row = self._check_row("req_index", req_index)
        m = self.mirror
        seqs, num_pages, pages = m.max_num_seqs, m.all_num_pages_mv, m.pages_mv
        out: list[list[int] | np.ndarray] = []
        for g, (start, width) in enumerate(zip(m.starts, m.max_pages)):
            n = num_pages[g * seqs + row]
            if n <= FEW_PAGES:
                first = start + row * width
                out.append(pages[first:first + n].tolist())
            else:
                out.append(self.pages_np[g][row, :n])
        return out

    def remove(self, req_index: int) -> None:
        """Free row ``req_index`` in every group (its entries return to the null page). A few element
        writes per group that held pages (a finished request's row: it runs once per request)."""
        row = self._check_row("req_index", req_index)
        self.edits += 1
        m = self.mirror
        seqs, num_pages, pages = m.max_num_seqs, m.all_num_pages_mv, m.pages_mv
        for g, (start, width) in enumerate(zip(m.starts, m.max_pages)):
            n = num_pages[g * seqs + row]
            if not n:
                continue
            if n <= FEW_PAGES:
                first = start + row * width
                for i in range(first, first + n):
                    pages[i] = 0
            else:
                self.pages_np[g][row, :n] = 0
            num_pages[g * seqs + row] = 0
            self._sync.cleared(g, row)

    def move(self, src: int, dst: int) -> None:
        """Move row ``src`` to row ``dst`` in every group (``dst``'s old pages are dropped, ``src``
        becomes empty), e.g. to condense the batch after a request finishes."""
        src = self._check_row("src", src)
        dst = self._check_row("dst", dst)
        if src == dst:
            return
        self.edits += 1
        held = self.num_pages_np[:, src].copy()
        self.remove(dst)
        for g, n in enumerate(held.tolist()):
            self.pages_np[g][dst, :n] = self.pages_np[g][src, :n]
        self.num_pages_np[:, dst] = held
        self._sync.edited(np.arange(self.num_groups), np.full(self.num_groups, dst), np.zeros(self.num_groups))
        self.remove(src)

    # ---- device side ----------------------------------------------------------------------------

    def commit(self) -> None:
        """Make the persistent device tables current (and the step rows showing changed rows): on a
        GPU one copy and one launch for every stale column; on a CPU, where edits already wrote the
        step rows, the persistent kernel-block tables (the mirror itself with one kernel block per
        page). Not capture-safe (reads host state)."""
        self._sync.commit()

    def sync(self, rows: "np.ndarray | Sequence[int]", num_reqs_padded: int, *, same_rows: bool | None = None,
             rows_checked: bool = False) -> None:
        """Make the device tables current for a step whose batch row ``i`` is request row
        ``rows[i]``: per-step rows ``[0, len(rows))`` show those rows and ``[len(rows),
        num_reqs_padded)`` the null page. When the batch shows the same rows as the last sync
        (``same_rows``; compared when ``None``), only what changed is written (on a GPU in the same
        launch as the persistent rows); otherwise the step's rows are copied again (one gather on a
        GPU). Not capture-safe (reads host state).

        ``rows``: a 1-D integer array of distinct rows in ``[0, max_num_seqs)``, or a list or tuple of
        such plain ints (converted to int64). Raises :class:`SpecError` for other rows (a negative row
        would show another request's pages, numpy wrapping it) and unless ``len(rows) <= num_reqs_padded
        <= max_num_seqs`` (the same checks for the host and the staged sync: a padded token count passed
        as a request count is refused on a CPU as on a GPU); nothing has changed then (the checks come
        before any write). With ``same_rows=True`` they must be the rows of the last sync (checked then:
        one comparison), else :class:`SpecError` (the step's rows would go on showing the old ones).
        ``rows_checked=True`` skips the checks of ``rows`` (a few numpy calls): for a caller that built
        them as such an int64 array itself, as :class:`~graphkv.runtime.step.step.Step` does; its
        ``same_rows=True`` is compared all the same when another call (``rows_checked=False``, or
        :meth:`show_null_rows`) showed rows since."""
        if not rows_checked:
            rows = checked_rows(self.mirror, rows, same_rows)
            self._foreign_sync = True
        elif self._foreign_sync:  # another caller showed rows since the Step's last sync: its promise is compared
            self._foreign_sync = False
            if same_rows:
                same_rows = None
        m = self.mirror
        n = rows.shape[0]
        if not ((type(num_reqs_padded) is int or isinstance(num_reqs_padded, np.integer))
                and n <= num_reqs_padded <= self.max_num_seqs):
            raise SpecError(Problem(field="num_reqs_padded", value=num_reqs_padded,
                                    limit=f"must be an int with num_reqs={n} <= num_reqs_padded <= "
                                          f"max_num_seqs={self.max_num_seqs}",
                                    fix="pass the step's StepShape.num_reqs_padded (a request count, never a token "
                                        "count)"))
        if not m.shown_valid:
            same_rows = False
        elif same_rows is None:
            same_rows = n == m.shown_rows.shape[0] and bool(np.array_equal(rows, m.shown_rows))
        self._sync.sync(rows, num_reqs_padded, same_rows, m.null_until)
        if not same_rows:
            m.show(rows, num_reqs_padded)
        elif num_reqs_padded > m.null_until:
            m.null_until = num_reqs_padded

    def show_null_rows(self, num_reqs_padded: int) -> None:
        """Per-step rows ``[0, num_reqs_padded)`` := the null page (a dummy step, e.g. for capture)."""
        assert 0 <= num_reqs_padded <= self.max_num_seqs, (num_reqs_padded, self.max_num_seqs)
        self._foreign_sync = True
        self._sync.show_null(num_reqs_padded)
        self.mirror.show(self.mirror.shown_rows[:0], num_reqs_padded)

    def forget_shown_rows(self) -> None:
        """Make the next :meth:`sync` copy the step's rows again (e.g. after something else wrote them)."""
        self.mirror.forget_shown()

    def state_pages(self, group: int, rows: np.ndarray) -> np.ndarray:
        """The state page of each of ``rows`` in a Mamba group: the row's first page (page 0, the
        null page, for a row that holds none). Host-side (numpy), no device work. Raises
        :class:`SpecError` when ``group`` is not the index of one of the plan's state groups."""
        if (group.__class__ is not int and not isinstance(group, np.integer)) or group not in self._state_groups:
            kinds = [g.kind.value for g in self.plan.groups]
            raise SpecError(Problem(field="group", value=group,
                                    limit=f"must be the index of a state (Mamba) group of the plan: its groups are "
                                          f"{kinds}, the state groups {sorted(self._state_groups)}",
                                    fix="pass the index of a state group (plan.groups[g].is_ssm)"))
        return self.pages_np[group][rows, 0]

    # ---- helpers --------------------------------------------------------------------------------

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
        return self.capacity_error(g, held, adding, field=f"page_ids_per_group[{g}]", who=f"request row {req_index}: ")

    def capacity_error(self, g: int, held: int, adding: int, *, field: str, who: str = "") -> CapacityError:
        """The :class:`CapacityError` for group ``g`` of a request holding ``held`` pages that cannot take
        ``adding`` more (``field`` names the input at fault; ``who`` prefixes the limit, e.g. the row)."""
        return capacity_error(self.plan, self.mirror, g, held, adding, field=field, who=who)

    def capacity_fix(self, g: int) -> str:
        """What to do when a request outgrows group ``g``'s table
        (:func:`~graphkv.runtime.tables.refusals.capacity_fix`)."""
        return capacity_fix(self.plan, self.mirror, g)
