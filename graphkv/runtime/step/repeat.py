"""The step that repeats the last one: the same requests with the same query lengths, and at most a few new pages.

That is a serving loop's commonest step (decode: every request one token longer, now and then one crossing into a
new page). Everything but the lengths and those pages is unchanged: rows, query layout, state pages, the step's
shape (padded sizes, graph key). A few plain new pages are appended item by item
(:mod:`~graphkv.runtime.step.appends`); others send the step to the full path. :class:`RepeatStep` keeps what
the last full step derived, and :meth:`RepeatStep.prepare`
checks and writes only what changes, with the same checks as the full path: one integer sequence
length per request, ``query_len <= seq_len <= max_model_len``, pages that cover every sequence, and
a context (``seq_len - query_len``) never beyond a request's written tokens, nor below the cached
tokens it joined with, nor (in a plan with state layers) below its written tokens. Up to :data:`PYTHON_TOKENS`
tokens the work is a plain Python loop over memoryviews (a numpy call costs more than a token's
whole update, and the loop visits every token once per attention group); above that, a constant
number of numpy calls. Anything unusual — a
length that is not a plain int, a check that fails, a page another request shares — returns
``None`` with nothing changed, and the full path checks (and raises) as usual.

A bool equals 1, so "the same query lengths" is decided by type too, at no cost a numpy pass would
add: the Python loop looks at each length's type anyway; above it, a fresh tuple of plain ints (what
a serving loop builds each step) is compared with the last step's as :mod:`marshal` bytes, one
C-level pass that tells ``True`` from ``1``, and anything else (numpy ints) is compared by value and
looked at for bools of every kind. A bool (a seq_len too) goes to the full path, which refuses it.
"""

from __future__ import annotations

import marshal
import struct
from typing import Callable

import numpy as np

from graphkv.plan.plan import Plan
from graphkv.runtime.capture.shape import StepShape
from graphkv.runtime.step.appends import apply_appends, few_appends
from graphkv.runtime.step.batch import Batch
from graphkv.runtime.step.ownership import HoldUndo, PageOwnership
from graphkv.runtime.step.rows import LastStep
from graphkv.runtime.step.staging import StepStaging
from graphkv.runtime.tables.block_tables import BlockTables
from graphkv.runtime.tables.page_ids import plain_int_bytes
from graphkv.spec._checks import is_bool

__all__ = ["PYTHON_TOKENS", "Parts", "RepeatStep"]

PYTHON_TOKENS = 8  # up to this many tokens a repeated step is updated in plain Python


class Parts:
    """The parts of a step a repeat touches: its plan, tables, page ownership, staging arrays, the
    tokens one page of each group holds (``[G, 1]``, the batch checker's), and
    ``remember_undo(rows, written, appended)`` (what :meth:`Step.undo` restores; ``appended``: ``None``, or the
    step's appends, ``(group, row, pages held before, page ids)`` each, and their holds' undo)."""

    __slots__ = ("ownership", "plan", "remember_undo", "staging", "tables", "tokens_per_page")

    def __init__(self, plan: Plan, tables: BlockTables, ownership: PageOwnership, staging: StepStaging,
                 tokens_per_page: np.ndarray,
                 remember_undo: Callable[[np.ndarray, "np.ndarray | list[int]",
                                          "tuple[list[tuple[int, int, int, list[int]]], HoldUndo] | None"], None]
                 ) -> None:
        self.plan, self.tables, self.ownership, self.staging = plan, tables, ownership, staging
        self.tokens_per_page = tokens_per_page
        self.remember_undo = remember_undo


class RepeatStep:
    """What the last full step derived (``last``: its requests, rows, shape and dispatch), to repeat
    it cheaply on ``parts`` (see the module docstring)."""

    def __init__(self, parts: Parts, last: LastStep) -> None:
        self.parts = parts
        self.req_ids, self.query_lens, self.shape, self.dispatch = last.req_ids, last.query_lens, last.shape, \
            last.dispatch
        rows = self.rows = last.rows
        self.row_list = rows.tolist()
        self.qlens = np.asarray(last.query_lens, dtype=np.int64)
        self.query_bytes = plain_int_bytes(last.query_lens)  # None: not all plain ints (numpy ints)
        tables = parts.tables
        self.edits = tables.edits  # the tables' edit count the capacities below were read at
        held = tables.num_pages_np[:, rows].astype(np.int64)
        self.capacity = (held * parts.tokens_per_page).min(0)  # tokens each request's pages hold, [n]
        self.capacity_list = self.capacity.tolist()
        self.max_slens = np.minimum(self.capacity, parts.plan.max_model_len)  # the longest seq_len each may have, [n]
        self.exact_context = parts.ownership.has_state  # state layers: the context is exactly the written tokens
        claimed = parts.ownership.claimed[rows]
        self.claimed = claimed if claimed.any() else None  # the context may not shrink below a join's cached tokens
        self.claimed_list = claimed.tolist()
        self.tokens_per_page = parts.tokens_per_page[:, 0].tolist()
        self.is_state = parts.ownership.state_group.tolist()
        self.pack = struct.Struct(f"{rows.shape[0]}q").pack
        self.num_tokens = last.shape.num_tokens
        st = parts.staging
        self.python = self.num_tokens <= PYTHON_TOKENS  # the per-token loop (else numpy)
        if self.python:
            self.views = (memoryview(st.seq_lens), memoryview(st.context_lens), memoryview(st.positions),
                          memoryview(parts.ownership.written))
            self.slot_views = [(memoryview(st.slot_mappings[g.index]), memoryview(tables.pages_np[g.index].reshape(-1)),
                                g.block_size, tables.max_pages[g.index]) for g in parts.plan.groups if not g.is_ssm]

    def matches(self, batch: Batch) -> bool:
        """Whether ``batch`` repeats the last step: the same requests and the same query lengths, none of them a
        bool (see the module docstring); :meth:`prepare` looks at its new pages."""
        q = batch.query_lens
        if batch.req_ids != self.req_ids:
            return False
        if q is self.query_lens:
            return True
        if self.python:  # a few requests: equal values here, and _python hands a bool to the full path
            return q == self.query_lens
        if self.query_bytes is not None:
            try:
                if marshal.dumps(q, 2) == self.query_bytes:
                    return True
            except ValueError:
                pass
        # other lengths, or other types (numpy ints): compare values, and let the full path refuse a bool or a float
        return q == self.query_lens and all(isinstance(x, (int, np.integer)) and not is_bool(x) for x in q)

    def prepare(self, batch: Batch, shape: StepShape) -> bool:
        """Fill the buffers for ``batch`` (which :meth:`matches`) of ``shape`` and return True, or
        return False with nothing changed (another shape than the last step's, a shared page, tables edited since
        this repeat was built (``BlockTables.edits``: the capacities it keeps are stale), new pages that are not
        few and plain, a length the full path must check)."""
        parts = self.parts
        if parts.ownership.num_shared or parts.tables.edits != self.edits \
                or not (shape is self.shape or shape == self.shape):
            return False  # (a shared page: the full path checks writes; tables edited since: it reads them afresh)
        appends = None
        if batch.new_pages:
            appends = few_appends(batch.new_pages, self.row_list, parts.tables, parts.ownership, self.tokens_per_page,
                                  self.is_state)
            if appends is None:
                return False
        parts.staging.wait_until_read()
        before = self._set_capacity(appends.capacity) if appends else None  # the lengths are checked against them
        checked = self._check_python(batch.query_lens, batch.seq_lens) if self.python else \
            self._check_numpy(batch.seq_lens)
        if checked is None:
            if before:
                self._set_capacity(before)
            return False
        appended = None
        if appends is not None and appends.items:
            appended = (appends.items, apply_appends(appends, parts.tables, parts.ownership))
            self.edits = parts.tables.edits  # (append_few leaves it as it was: no edit but our own)
        if self.python:
            self._write_python(batch.seq_lens)
        else:
            self._write_numpy(*checked)
        parts.remember_undo(self.rows, checked if self.python else checked[2], appended)
        parts.tables.sync(self.rows, shape.num_reqs_padded, same_rows=True, rows_checked=True)
        parts.staging.copy_to_device()
        return True

    def _set_capacity(self, capacity: dict[int, int]) -> dict[int, int]:
        """Set the tokens batch rows' pages hold (``capacity``: batch row -> tokens); returns what they were."""
        before = {i: self.capacity_list[i] for i in capacity}
        max_len = self.parts.plan.max_model_len
        for i, tokens in capacity.items():
            self.capacity_list[i] = tokens
            self.capacity[i] = tokens
            self.max_slens[i] = min(tokens, max_len)
        return before

    def _check_python(self, query_lens: tuple, seq_lens: tuple) -> list[int] | None:
        """The few-token check (``query_lens`` equal the last step's by value; a bool among them goes to the
        full path); returns the requests' written tokens before the step (for an undo), or ``None``."""
        written = self.views[3]
        max_len = self.parts.plan.max_model_len
        if len(seq_lens) != len(self.row_list):  # zip would pair what there is: the full path refuses it
            return None
        old = []
        for row, q, s, cap, given, claimed in zip(self.row_list, self.query_lens, seq_lens, self.capacity_list,
                                                  query_lens, self.claimed_list):
            # a query length of another type than an int or a numpy int (a bool, a float equal to an int): the full
            # path checks it
            if (type(given) is not int and not isinstance(given, np.integer)) or type(s) is not int \
                    or not q <= s <= max_len or s > cap or s - q > written[row] or s - q < claimed \
                    or (self.exact_context and s - q < written[row]):
                return None
            old.append(written[row])
        return old

    def _write_python(self, seq_lens: tuple) -> None:
        """The few-token update of checked ``seq_lens``: lengths, positions and slots item by item."""
        seq_mv, ctx_mv, pos_mv, written = self.views
        t = 0
        for i, (row, q, s) in enumerate(zip(self.row_list, self.query_lens, seq_lens)):
            ctx = s - q
            seq_mv[i] = s
            ctx_mv[i] = ctx
            for pos in range(ctx, s):
                pos_mv[t] = pos
                for slot_mv, pages_mv, bs, pages in self.slot_views:
                    slot_mv[t] = pages_mv[row * pages + pos // bs] * bs + pos % bs
                t += 1
            written[row] = s

    def _check_numpy(self, seq_lens: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The many-token check: a constant number of numpy calls; returns the lengths, contexts and the written
        tokens before the step, or ``None``."""
        try:
            slens = np.frombuffer(self.pack(*seq_lens), dtype=np.int64)
        except (struct.error, TypeError):
            return None
        ctx = slens - self.qlens
        old = self.parts.ownership.written[self.rows]
        # ctx < 1, not ctx < 0: a seq_len struct packed from a bool (0 or 1) is at most its query_len; a
        # repeat with no context (the same prefill again) is rare, and the full path takes it
        if ((ctx < 1) | (slens > self.max_slens) | (ctx > old)).any() or (self.exact_context and (ctx < old).any()) \
                or (self.claimed is not None and (ctx < self.claimed).any()):
            return None
        return slens, ctx, old

    def _write_numpy(self, slens: np.ndarray, ctx: np.ndarray, _old: np.ndarray) -> None:
        """The many-token update of checked lengths."""
        parts = self.parts
        parts.staging.write_lengths(parts.tables, self.rows.shape[0], self.num_tokens, slens, ctx, self.rows)
        parts.ownership.written[self.rows] = slens
