"""Per-group block tables: host staging, one device scatter per step, per-step gathered inputs.

Each KV-cache group has a persistent device table ``[max_num_seqs, block_table_width] int32`` in
kernel blocks (each group its own width) and a host mirror (numpy). Request rows change on the
host (:meth:`BlockTables.append`, :meth:`~BlockTables.overwrite`, :meth:`~BlockTables.truncate`,
:meth:`~BlockTables.remove`, :meth:`~BlockTables.move`); the changed column ranges are remembered
and :meth:`commit` copies them to the device with ONE kernel launch. Per step, :meth:`gather` packs the step's rows into
persistent input tables and :meth:`compute_slot_mappings` fills the persistent slot mapping.
The kernels are the Triton ones on CUDA devices and the torch ones elsewhere (``kernels="auto"``,
see :mod:`graphkv.runtime.ops.choice`); both fill the same buffers the same way.

Invariant: entries past a row's pages are 0 (the null page), on host and device alike.

Example (one step)::

    tables = BlockTables(plan, device="cuda")
    tables.append(req_index=0, page_ids_per_group=[[5, 9], [3]])   # scheduler pages, per group
    tables.commit()                                                 # one launch
    tables.gather(idx_mapping[:num_reqs], num_reqs_padded)          # one launch
    slots = tables.compute_slot_mappings(query_start_loc, positions, num_reqs)  # one launch
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.kernels.block_tables import PackedTables, apply_row_writes, gather_rows
from graphkv.kernels.slot_mapping import compute_slot_mappings
from graphkv.plan.plan import Plan
from graphkv.runtime.ops import torch_ops as torch_kernels
from graphkv.runtime.ops.choice import resolve_kernels
from graphkv.runtime.tables.expansion import PageIds, write_expanded

__all__ = ["BlockTables"]

_SMALL_LIST_PAGES = 8  # longer page-ID lists are converted to numpy once, before checking and expanding


class BlockTables:
    """Block tables of every group of ``plan`` on ``device``.

    Persistent tensors (allocated once, same ``data_ptr()`` every step): ``tables[g]`` and
    ``input_tables[g]`` ``[max_num_seqs, width_g] int32``, ``slot_mappings`` ``[num_groups,
    max_num_batched_tokens] int64``. Host state: ``num_pages_np`` ``[num_groups, max_num_seqs]
    int32`` pages held per row, ``tables_np[g]`` the host mirror.

    ``kernels``: ``"triton"``, ``"torch"`` or ``"auto"`` (Triton on CUDA devices, torch on any
    other; Triton on a CPU runs in its interpreter, which is only a correctness checker).
    """

    def __init__(self, plan: Plan, device: "str | torch.device" = "cpu", *, kernels: str = "auto") -> None:
        self.plan = plan
        self.device = torch.device(device)
        self._kernels = resolve_kernels(kernels, self.device)
        groups = plan.groups
        self.max_num_seqs = plan.limits.max_num_seqs
        self.num_blocks = plan.num_blocks
        self.bpks = tuple(g.bpk for g in groups)
        self.widths = tuple(g.block_table_width for g in groups)
        self.max_pages = tuple(g.pages_per_request for g in groups)
        self._packed = PackedTables.zeros(self.max_num_seqs, self.widths, self.device)
        self._inputs = PackedTables.zeros(self.max_num_seqs, self.widths, self.device)
        self._offsets_np = np.concatenate([[0], np.cumsum([self.max_num_seqs * w for w in self.widths])[:-1]])
        self.slot_mappings = torch.full((len(groups), plan.limits.max_num_batched_tokens), -1, dtype=torch.int64,
                                        device=self.device)
        self.kernel_block_sizes = torch.tensor([g.kernel_block_size for g in groups], dtype=torch.int32,
                                               device=self.device)
        self.state_groups = torch.tensor([int(g.is_ssm) for g in groups], dtype=torch.int32, device=self.device)
        self.tables_np = tuple(np.zeros((self.max_num_seqs, w), dtype=np.int32) for w in self.widths)
        self.num_pages_np = np.zeros((len(groups), self.max_num_seqs), dtype=np.int32)
        self._dirty: dict[tuple[int, int], tuple[int, int]] = {}  # (group, row) -> columns [lo, hi)
        self._staged = torch.empty(0, dtype=torch.int64, device=self.device)  # grows, never shrinks
        self._staged_host = torch.empty(0, dtype=torch.int64)  # its pinned host twin (CUDA only)
        self._commit_copied: torch.cuda.Event | None = None
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):
                self._commit_copied = torch.cuda.Event()

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
        """Persistent device tables, ``[max_num_seqs, width_g] int32`` per group, kernel blocks."""
        return self._packed.tables

    @property
    def input_tables(self) -> tuple[torch.Tensor, ...]:
        """Persistent per-step gathered tables (row = batch row), ``[max_num_seqs, width_g] int32``."""
        return self._inputs.tables

    @property
    def packed_input_tables(self) -> PackedTables:
        """The per-step tables packed for kernels that take all groups at once."""
        return self._inputs

    # ---- host-side row edits (staged until commit) -------------------------------------------

    def append(self, req_index: int, page_ids_per_group: Sequence[Optional[PageIds]]) -> None:
        """Append pages (scheduler page IDs) to row ``req_index`` of each group; ``None`` or an
        empty entry leaves a group unchanged. Raises :class:`CapacityError` if a group's row
        would exceed its pages per request (nothing is changed then)."""
        self._check_row("req_index", req_index)
        entries = self._check_entries(page_ids_per_group)
        for g, ids in entries:
            held = int(self.num_pages_np[g, req_index])
            if held + len(ids) > self.max_pages[g]:
                raise self._capacity_error(req_index, g, held, len(ids))
        for g, ids in entries:
            held = int(self.num_pages_np[g, req_index])
            start = held * self.bpks[g]
            end = write_expanded(self.tables_np[g][req_index], start, ids, self.bpks[g])
            self.num_pages_np[g, req_index] = held + len(ids)
            self._mark(g, req_index, start, end)

    def overwrite(self, req_index: int, page_ids_per_group: Sequence[Optional[PageIds]]) -> None:
        """Replace row ``req_index`` of each group with exactly the given pages (``None`` leaves a
        group unchanged; an empty entry clears it)."""
        self._check_row("req_index", req_index)
        entries = self._check_entries(page_ids_per_group, keep_empty=True)
        for g, ids in entries:
            if len(ids) > self.max_pages[g]:
                raise self._capacity_error(req_index, g, 0, len(ids))
        for g, ids in entries:
            self._clear(g, req_index)
            self.num_pages_np[g, req_index] = len(ids)
            self._mark(g, req_index, 0, write_expanded(self.tables_np[g][req_index], 0, ids, self.bpks[g]))

    def truncate(self, req_index: int, num_pages_per_group: Sequence[int]) -> None:
        """Keep only the first ``num_pages_per_group[g]`` pages of row ``req_index`` in each group
        (the rest return to the null page), e.g. to undo an :meth:`append`. Raises
        :class:`SpecError` for a count above the pages the row holds (nothing is changed then)."""
        self._check_row("req_index", req_index)
        keep = [int(n) for n in num_pages_per_group]
        held = self.num_pages_np[:, req_index].copy()
        bad = [g for g, n in enumerate(keep) if not 0 <= n <= held[g]] if len(keep) == self.num_groups else [-1]
        if bad:
            raise SpecError(Problem(field="num_pages_per_group", value=keep,
                                    limit=f"needs one count per group ({self.num_groups}), each in 0..pages held "
                                          f"({held.tolist()} for row {req_index})",
                                    fix="pass how many of the row's pages to keep in each group"))
        for g, n in enumerate(keep):
            lo, hi = n * self.bpks[g], int(held[g]) * self.bpks[g]
            if hi > lo:
                self.tables_np[g][req_index, lo:hi] = 0
                self._mark(g, req_index, lo, hi)
            self.num_pages_np[g, req_index] = n

    def remove(self, req_index: int) -> None:
        """Free row ``req_index`` in every group (its entries return to the null page)."""
        self._check_row("req_index", req_index)
        for g in range(self.num_groups):
            self._clear(g, req_index)

    def move(self, src: int, dst: int) -> None:
        """Move row ``src`` to row ``dst`` in every group (``dst``'s old pages are dropped, ``src``
        becomes empty), e.g. to condense the batch after a request finishes."""
        self._check_row("src", src)
        self._check_row("dst", dst)
        if src == dst:
            return
        for g in range(self.num_groups):
            n = int(self.num_pages_np[g, src]) * self.bpks[g]
            self._clear(g, dst)
            self.tables_np[g][dst, :n] = self.tables_np[g][src, :n]
            self.num_pages_np[g, dst] = self.num_pages_np[g, src]
            self._mark(g, dst, 0, n)
            self._clear(g, src)

    # ---- device side -------------------------------------------------------------------------

    def commit(self) -> int:
        """Copy every row range changed since the last commit to the device tables: one host to
        device copy and ONE kernel launch for all groups. Returns the number of ranges written.
        Not capture-safe (reads host state); call it before replaying a step."""
        if not self._dirty:
            return 0
        segments = sorted(self._dirty.items())
        values = [self.tables_np[g][row, lo:hi] for (g, row), (lo, hi) in segments]
        dst = np.array([self._offsets_np[g] + row * self.widths[g] + lo for (g, row), (lo, _) in segments],
                       dtype=np.int64)
        starts = np.zeros(len(segments) + 1, dtype=np.int64)
        np.cumsum([len(v) for v in values], out=starts[1:])
        staged = np.concatenate([dst, starts, *[v.astype(np.int64) for v in values]])
        if self._staged.numel() < staged.size:
            size = max(staged.size, 2 * self._staged.numel())
            self._staged = torch.empty(size, dtype=torch.int64, device=self.device)
            if self.device.type == "cuda":  # pinned, so the copy below does not wait for the stream
                self._staged_host = torch.empty(size, dtype=torch.int64, pin_memory=True)
        if self._commit_copied is not None:
            self._commit_copied.synchronize()  # the last commit's copy has read the pinned buffer
            self._staged_host[:staged.size].copy_(torch.from_numpy(staged))
            self._staged[:staged.size].copy_(self._staged_host[:staged.size], non_blocking=True)
            self._commit_copied.record()
        else:
            self._staged[:staged.size].copy_(torch.from_numpy(staged))
        apply = apply_row_writes if self._kernels == "triton" else torch_kernels.apply_row_writes
        apply(self._packed, self._staged, len(segments))
        self._dirty.clear()
        return len(segments)

    def gather(self, idx_mapping: torch.Tensor, num_reqs_padded: int) -> tuple[torch.Tensor, ...]:
        """Fill the persistent :attr:`input_tables`: batch row ``i`` gets persistent row
        ``idx_mapping[i]`` (``idx_mapping``: ``[num_reqs] int32`` on the device); rows ``num_reqs
        .. num_reqs_padded - 1`` get the null page 0. One launch; capture-safe. Returns
        :attr:`input_tables` (full tensors; slice ``[:num_reqs_padded]``)."""
        gather = gather_rows if self._kernels == "triton" else torch_kernels.gather_rows
        gather(self._packed, self._inputs, idx_mapping, num_reqs_padded)
        return self._inputs.tables

    def compute_slot_mappings(self, query_start_loc: torch.Tensor, positions: torch.Tensor,
                              num_reqs: int) -> torch.Tensor:
        """Fill the persistent :attr:`slot_mappings` ``[num_groups, max_num_batched_tokens] int64``
        from the gathered tables (call :meth:`gather` first): ``query_start_loc`` ``[>= num_reqs +
        1] int32``, ``positions`` ``[max_num_batched_tokens] int64``. Tokens past the step and all
        tokens of state (Mamba) groups get ``PAD_SLOT_ID``. One launch; capture-safe."""
        compute = compute_slot_mappings if self._kernels == "triton" else torch_kernels.compute_slot_mappings
        return compute(query_start_loc, positions, self._inputs, self.kernel_block_sizes, self.state_groups, num_reqs,
                       self.slot_mappings)

    def state_indices(self, group: int) -> torch.Tensor:
        """The state page of each batch row of a Mamba group: column 0 of its gathered table,
        ``[max_num_seqs] int32`` (a view; valid after :meth:`gather`)."""
        return self._inputs.tables[group][:, 0]

    def state_pages(self, group: int, rows: np.ndarray) -> np.ndarray:
        """The state page of each of ``rows`` in a Mamba group: the row's first page (page 0, the
        null page, for a row that holds none). Host-side (numpy), no device work."""
        return self.tables_np[group][rows, 0] // self.bpks[group]

    # ---- helpers -----------------------------------------------------------------------------

    def _clear(self, g: int, row: int) -> None:
        n = int(self.num_pages_np[g, row]) * self.bpks[g]
        if n:
            self.tables_np[g][row, :n] = 0
            self._mark(g, row, 0, n)
        self.num_pages_np[g, row] = 0

    def _mark(self, g: int, row: int, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        old = self._dirty.get((g, row))
        self._dirty[(g, row)] = (lo, hi) if old is None else (min(lo, old[0]), max(hi, old[1]))

    def _check_row(self, name: str, row: object) -> None:
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= row < self.max_num_seqs:
            raise SpecError(Problem(field=name, value=row,
                                    limit=f"must be a row in [0, max_num_seqs={self.max_num_seqs})",
                                    fix="use the request's persistent row index"))

    def _check_entries(self, page_ids_per_group: Sequence[Optional[PageIds]],
                       keep_empty: bool = False) -> list[tuple[int, PageIds]]:
        if len(page_ids_per_group) != self.num_groups:
            raise SpecError(Problem(field="page_ids_per_group", value=len(page_ids_per_group),
                                    limit=f"needs one entry per KV-cache group ({self.num_groups})",
                                    fix="pass a list with one page-ID list (or None) per group"))
        entries = []
        for g, ids in enumerate(page_ids_per_group):
            if ids is None or (len(ids) == 0 and not keep_empty):
                continue
            if not isinstance(ids, np.ndarray) and len(ids) > _SMALL_LIST_PAGES:
                ids = np.asarray(ids, dtype=np.int64)  # converted once: bounds check and expansion both use it
            lo, hi = (int(ids.min()), int(ids.max())) if isinstance(ids, np.ndarray) and len(ids) else \
                (min(ids, default=0), max(ids, default=0))
            if lo < 0 or hi >= self.num_blocks:
                raise SpecError(Problem(field=f"page_ids_per_group[{g}]", value=(lo, hi),
                                        limit=f"page IDs must be in [0, num_blocks={self.num_blocks})",
                                        fix="pass page IDs from this plan's pool"))
            entries.append((g, ids))
        return entries

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
