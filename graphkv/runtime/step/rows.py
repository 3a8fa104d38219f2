"""Which block-table row each live request holds, the free rows, and what the last step was.

A request gets a row when it first appears in a batch (the lowest free row first) and gives it
back when it finishes. The last step's requests are remembered too: a batch with the same request
ids needs no lookup (their rows are the last step's), and a step that repeats the last one
entirely takes the cheap path (:mod:`~graphkv.runtime.step.repeat`).
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import attrs
import numpy as np

from graphkv.errors import Problem, SpecError
from graphkv.spec._checks import is_hashable

__all__ = ["LastStep", "RequestRows"]


@attrs.frozen(kw_only=True, eq=False)
class LastStep:
    """The last full step: its requests and query lengths as the batch gave them, their table rows,
    the :class:`~graphkv.runtime.capture.shape.StepShape` the staging arrays were filled for, and
    the plan's dispatch of it (what a repeat of the step reuses)."""

    req_ids: tuple
    query_lens: tuple
    rows: np.ndarray
    shape: Any  # StepShape
    dispatch: Any  # StepDispatch


class RequestRows:
    """Request id -> table row for ``max_num_seqs`` rows, and the last step's requests."""

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.rows: dict[Hashable, int] = {}
        self.free = list(range(max_num_seqs - 1, -1, -1))  # pop() hands out row 0 first
        self.last: LastStep | None = None  # the last full step, whose shape the staging arrays hold
        self.last_rows = np.zeros(0, dtype=np.int64)  # the rows of the last step's requests

    def forget_last(self) -> None:
        """The staging arrays or the rows changed outside a step: no shortcut for the next one."""
        self.last = None

    def row_of(self, req_id: Hashable) -> int:
        """The row of ``req_id``; :class:`SpecError` when it is not a live request."""
        try:
            return self.rows[req_id]
        except (KeyError, TypeError):
            raise SpecError(Problem(field="req_id", value=req_id, limit="is not an active request",
                                    fix="pass a request id that appeared in a Batch and was not finished")) from None

    def lookup(self, req_ids: tuple) -> tuple[np.ndarray, np.ndarray, int]:
        """Row of each request (0 for a joining one), which ones join, and how many. Raises
        :class:`SpecError` for unhashable or repeated ids, a joining id not equal to itself (a NaN), and for
        more joining requests than free rows. Changes nothing."""
        n = len(req_ids)
        if self.last is not None and self.last.req_ids == req_ids:  # the last step's requests: no hashing
            return self.last_rows, np.zeros(n, dtype=bool), 0
        try:
            found = list(map(self.rows.get, req_ids))
        except TypeError:
            i = next(i for i, r in enumerate(req_ids) if not is_hashable(r))
            raise SpecError(Problem(field=f"batch.req_ids[{i}]", value=req_ids[i], limit="request ids must be hashable",
                                    fix="use str or int request ids")) from None
        if len(set(req_ids)) != n:
            raise SpecError(Problem(field="batch.req_ids", value=req_ids, limit="must be unique",
                                    fix="give each request one row of the batch"))
        num_new = found.count(None)
        if num_new > len(self.free):
            raise SpecError(Problem(field="batch.req_ids", value=f"{num_new} new requests",
                                    limit=f"{len(self.rows)} of max_num_seqs={self.max_num_seqs} rows are taken",
                                    fix="finish requests (Step.finish) before admitting new ones"))
        if not num_new:
            return np.array(found, dtype=np.int64), np.zeros(n, dtype=bool), 0
        new = np.array([r is None for r in found])
        for i in np.flatnonzero(new).tolist():  # a joining id must find its row again (a NaN is equal to nothing)
            r = req_ids[i]
            if isinstance(r, (float, np.floating)) and r != r:
                raise SpecError(Problem(field=f"batch.req_ids[{i}]", value=req_ids[i],
                                        limit="a request id must equal itself (a NaN does not: finish(nan) or the "
                                              "next step's nan would never find this request's row)",
                                        fix="use str or int request ids"))
        return np.array([0 if r is None else r for r in found], dtype=np.int64), new, num_new

    def admit(self, req_ids: Sequence[Hashable], rows: np.ndarray, new: np.ndarray) -> list[tuple[Hashable, int]]:
        """Give each joining request (``new``) a free row, written into ``rows`` (a copy is returned in
        its place by the caller); returns ``(req_id, row)`` per joining request, in order."""
        joined = []
        for i in np.flatnonzero(new).tolist():
            row = self.free.pop()
            rows[i] = row
            self.rows[req_ids[i]] = row
            joined.append((req_ids[i], row))
        return joined

    def release(self, req_id: Any) -> int:
        """``req_id`` leaves; its row is free again. Returns the row."""
        row = self.rows.pop(req_id)
        self.free.append(row)
        return row
