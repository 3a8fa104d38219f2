"""The host mirror of the block tables: every request row's pages per group, the single source of truth.

Everything here is numpy on the host: ``pages_np[g]`` ``[max_num_seqs, pages_per_request_g]
int32`` page ids (0 past a row's pages), ``num_pages_np`` ``[num_groups, max_num_seqs]`` pages
held, all groups packed in one flat array (so a whole step's appends are one scatter), plus which
request row each step (batch) row shows. Every array is a ledger entry of the plan
(``tables.mirror``, ``tables.num_pages``, ``tables.arange``, ...), allocated from it. The device copies are kept by
:mod:`~graphkv.runtime.tables.host_sync` (CPU) or :mod:`~graphkv.runtime.tables.staged_sync` (GPU),
which read this mirror and never the other way round.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from graphkv.plan.plan import Plan
from graphkv.runtime.buffers import LedgerBuffers

__all__ = ["PageMirror"]


class PageMirror:
    """Pages per (group, request row) of ``plan``'s block tables, allocated from ``buffers`` (the
    plan's ``tables.*`` ledger entries); the pages live in ``pages`` when given (``[sum_g
    max_num_seqs * pages_per_request_g] int32``, e.g. device tables that hold pages as they are)."""

    def __init__(self, plan: Plan, buffers: LedgerBuffers, pages: np.ndarray | None = None) -> None:
        groups = plan.groups
        self.max_num_seqs = seqs = plan.limits.max_num_seqs
        self.num_blocks = plan.num_blocks
        self.num_groups = len(groups)
        self.bpks = tuple(g.bpk for g in groups)
        self.widths = tuple(g.block_table_width for g in groups)
        self.max_pages = tuple(g.pages_per_request for g in groups)
        self.block_sizes = tuple(g.block_size for g in groups)
        starts = [0]
        for p in self.max_pages:
            starts.append(starts[-1] + seqs * p)
        self.size = starts[-1]
        self.pages_flat = pages if pages is not None else buffers.array("tables.mirror")
        self.pages_np = tuple(self.pages_flat[a:a + seqs * p].reshape(seqs, p) for a, p in zip(starts, self.max_pages))
        self.num_pages_np = buffers.array("tables.num_pages")
        self.starts = tuple(starts[:-1])  # per group: where its rows start in pages_flat
        self.pages_mv = memoryview(self.pages_flat)  # item access from Python, for small steps
        self.num_pages_mv = memoryview(self.num_pages_np[0])
        self.all_num_pages_mv = memoryview(self.num_pages_np.reshape(-1))  # group g, row r at g * max_num_seqs + r
        self.packers: dict[int, Callable[..., bytes]] = {}  # struct packers of n int32 page ids, by n
        group_ints = buffers.array("tables.group_ints")
        self.host_start, self.host_pages = group_ints  # per group: where its rows start in pages_flat, pages per row
        self.host_start[:] = starts[:-1]
        self.host_pages[:] = self.max_pages
        self.arange = buffers.array("tables.arange")  # 0 .. max(max_num_seqs, max_num_batched_tokens) - 1
        self.arange[:] = np.arange(self.arange.shape[0])
        # Which request row each step (batch) row shows, and the inverse.
        self._shown = buffers.array("tables.shown_rows")
        self.shown_rows = self._shown[:0]
        self.batch_row_of = buffers.array("tables.batch_row_of")
        self.batch_row_of.fill(-1)
        self.null_until = 0  # step rows [len(shown_rows), null_until) hold the null page
        self.shown_valid = True  # False: the step rows are unknown, the next sync copies them
        self.identity_rows = 0  # n when step rows 0 .. n-1 show request rows 0 .. n-1

    def index_range(self, n: int) -> np.ndarray:
        """``0 .. n - 1`` (int64): a view of the shared arange, or a new array past its length (a step
        appending more pages than a step's tokens and rows — joins with long cached prefixes)."""
        return self.arange[:n] if n <= self.arange.shape[0] else np.arange(n, dtype=np.int64)

    @staticmethod
    def buffer_size(plan: Plan) -> int:
        """Entries of the flat page buffer of ``plan`` (to allocate one the mirror will use)."""
        return plan.limits.max_num_seqs * sum(g.pages_per_request for g in plan.groups)

    def show(self, rows: np.ndarray, num_reqs_padded: int) -> None:
        """Step rows ``[0, len(rows))`` now show request rows ``rows`` (copied), ``[len(rows),
        num_reqs_padded)`` the null page."""
        self.batch_row_of[self.shown_rows] = -1
        n = rows.shape[0]
        self.batch_row_of[rows] = self.arange[:n]
        self._shown[:n] = rows
        self.shown_rows = self._shown[:n]
        self.null_until = num_reqs_padded
        self.shown_valid = True
        self.identity_rows = n if n and int(rows[0]) == 0 and int(rows[-1]) == n - 1 and \
            bool((rows == self.arange[:n]).all()) else 0

    def forget_shown(self) -> None:
        """The step rows are unknown (something else wrote them): the next sync copies them."""
        self.show(self._shown[:0], 0)
        self.shown_valid = False
