"""The host mirror of the block tables: every request row's pages per group, the single source of truth.

Everything here is numpy on the host: ``pages_np[g]`` ``[max_num_seqs, pages_per_request_g]
int32`` page ids (0 past a row's pages), ``num_pages_np`` ``[num_groups, max_num_seqs]`` pages
held, all groups packed in one flat array (so a whole step's appends are one scatter), plus which
request row each step (batch) row shows. The device copies are kept by
:mod:`~graphkv.runtime.tables.host_sync` (CPU) or :mod:`~graphkv.runtime.tables.staged_sync` (GPU),
which read this mirror and never the other way round.
"""

from __future__ import annotations

import numpy as np

from graphkv.plan.plan import Plan

__all__ = ["PageMirror"]


class PageMirror:
    """Pages per (group, request row) of ``plan``'s block tables, in ``buffer`` when given (``[sum_g
    max_num_seqs * pages_per_request_g] int32``, e.g. device tables that hold pages as they are)."""

    def __init__(self, plan: Plan, buffer: np.ndarray | None = None) -> None:
        groups = plan.groups
        self.max_num_seqs = seqs = plan.limits.max_num_seqs
        self.num_blocks = plan.num_blocks
        self.num_groups = len(groups)
        self.bpks = tuple(g.bpk for g in groups)
        self.widths = tuple(g.block_table_width for g in groups)
        self.max_pages = tuple(g.pages_per_request for g in groups)
        self.block_sizes = tuple(g.block_size for g in groups)
        starts = np.concatenate([[0], np.cumsum([seqs * p for p in self.max_pages])])
        self.size = int(starts[-1])
        self.pages_flat = buffer if buffer is not None else np.zeros(self.size, dtype=np.int32)
        self.pages_np = tuple(self.pages_flat[a:a + seqs * p].reshape(seqs, p)
                              for a, p in zip(starts[:-1].tolist(), self.max_pages))
        self.num_pages_np = np.zeros((self.num_groups, seqs), dtype=np.int32)
        self.pages_mv = memoryview(self.pages_flat)  # item access from Python, for small steps
        self.num_pages_mv = memoryview(self.num_pages_np[0])
        self.host_start = starts[:-1].astype(np.int64)  # per group: where its rows start in pages_flat
        self.host_pages = np.array(self.max_pages, dtype=np.int64)  # per group: pages per row
        # Indexes up to every page of every row of every group at once (one step may fill them all).
        self.arange = np.arange(max(self.size, seqs), dtype=np.int64)
        # Which request row each step (batch) row shows, and the inverse.
        self.shown_rows = np.zeros(0, dtype=np.int64)
        self.batch_row_of = np.full(seqs, -1, dtype=np.int64)
        self.null_until = 0  # step rows [len(shown_rows), null_until) hold the null page
        self.shown_valid = True  # False: the step rows are unknown, the next sync copies them
        self.identity_rows = 0  # n when step rows 0 .. n-1 show request rows 0 .. n-1

    @staticmethod
    def buffer_size(plan: Plan) -> int:
        """Entries of the flat page buffer of ``plan`` (to allocate one the mirror will use)."""
        return plan.limits.max_num_seqs * sum(g.pages_per_request for g in plan.groups)

    def show(self, rows: np.ndarray, num_reqs_padded: int) -> None:
        """Step rows ``[0, len(rows))`` now show request rows ``rows``, ``[len(rows), num_reqs_padded)``
        the null page."""
        self.batch_row_of[self.shown_rows] = -1
        n = rows.shape[0]
        self.batch_row_of[rows] = self.arange[:n]
        self.shown_rows = rows
        self.null_until = num_reqs_padded
        self.shown_valid = True
        self.identity_rows = n if n and int(rows[0]) == 0 and int(rows[-1]) == n - 1 and \
            bool((rows == self.arange[:n]).all()) else 0

    def forget_shown(self) -> None:
        """The step rows are unknown (something else wrote them): the next sync copies them."""
        self.show(np.zeros(0, dtype=np.int64), 0)
        self.shown_valid = False
