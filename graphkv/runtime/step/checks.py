"""A batch checked whole before a step changes anything: :class:`BatchChecker` -> :class:`CheckedBatch`.

Everything a step needs to know about its batch is derived and checked here, with no state
change: sizes, integer lengths (floats, NaN and ints beyond int64 are refused, not truncated),
hashable unique request ids, free rows for joining requests, page ids, capacity, pages covering
every sequence, and page ownership (:class:`~graphkv.runtime.step.ownership.PageOwnership`). A
step that repeats the last step's requests skips the request-id work (a tuple comparison). Small
batches are checked with Python builtins on the tuples, large ones with numpy.
"""

from __future__ import annotations

import operator
from typing import Any, Hashable, NamedTuple, Sequence

import numpy as np
import torch

from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.plan.plan import Plan
from graphkv.runtime.buffers import LedgerBuffers
from graphkv.runtime.capture.keys import Dispatcher, StepDispatch
from graphkv.runtime.step.batch import Batch
from graphkv.runtime.step.ownership import PageOwnership
from graphkv.runtime.step.rows import RequestRows
from graphkv.runtime.tables.block_tables import BlockTables
from graphkv.runtime.tables.page_ids import PageEntries, flatten_new_pages, has_bool, int_array
from graphkv.runtime.vocab import check_token_ids
from graphkv.spec._checks import is_bool

__all__ = ["BatchChecker", "CheckedBatch", "bool_length", "check_input_ids", "input_ids_field"]

_SMALL = 32  # batches up to this size are range-checked with Python builtins (cheaper than numpy calls)


class CheckedBatch(NamedTuple):
    """A batch that passed every check, with what the step derives from it (host-side numpy)."""

    req_ids: tuple
    rows: np.ndarray  # [n] int64: table row of each request (0 for joining ones, which get one when applied)
    new: np.ndarray  # [n] bool: the request joins in this step
    num_new: int
    qlens: np.ndarray  # [n] int64
    slens: np.ndarray  # [n] int64
    ctx: np.ndarray  # [n] int64: seq_len - query_len
    query_lens: tuple  # as the batch gave them
    num_tokens: int
    num_reqs: int
    uniform: bool
    dispatch: StepDispatch
    entries: PageEntries | None  # the pages the step appends
    columns: np.ndarray | None  # each appended page's column in its request's table
    shared: bool  # an appended page is held already, or given twice
    held: np.ndarray  # [num_groups, n] pages held before the step


def bool_length(values: Sequence[Any], field: str, what: str, req_ids: Sequence[Hashable]) -> SpecError:
    """The error for a bool among a batch's lengths (``True`` and a 0-d bool tensor pack as 1 and would be
    taken as one)."""
    i = next(i for i, v in enumerate(values) if is_bool(v))
    return SpecError(Problem(field=f"{field}[{i}] ({req_ids[i]!r})", value=values[i],
                             limit=f"{what} must be integers (not bool, float, str or None)",
                             fix=f"pass {what} as Python or numpy ints, e.g. {int(values[i])}"))


def _sizes_problem(batch: Batch, n: int, max_num_seqs: int) -> list[Problem]:
    problems = []
    if not 1 <= n <= max_num_seqs:
        problems.append(Problem(field="batch.req_ids", value=n, limit=f"1..max_num_seqs={max_num_seqs} requests per "
                                "step", fix="schedule fewer requests in this step" if n else
                                "schedule at least one request (a step with nothing to run is no step)"))
    if len(batch.query_lens) != n or len(batch.seq_lens) != n or (batch.new_pages and len(batch.new_pages) != n):
        problems.append(Problem(field="batch", value=(n, len(batch.query_lens), len(batch.seq_lens),
                                                      len(batch.new_pages)),
                                limit="req_ids, query_lens, seq_lens (and new_pages if given) need one entry per "
                                      "request", fix="build the Batch from one list of scheduled requests"))
    return problems


class BatchChecker:
    """Checks batches for one step: ``plan``'s limits, ``tables`` (pages held), ``ownership``,
    ``requests`` (rows) and ``dispatch`` (the plan's graph keys). Reads them, never changes them."""

    def __init__(self, plan: Plan, tables: BlockTables, ownership: PageOwnership, requests: RequestRows,
                 dispatch: Dispatcher, buffers: LedgerBuffers) -> None:
        self.plan, self.tables, self.ownership, self.requests, self.dispatch = plan, tables, ownership, requests, dispatch
        limits = plan.limits
        self.max_num_seqs, self.max_num_tokens = limits.max_num_seqs, limits.max_num_batched_tokens
        self.decode_query_len = 1 + limits.num_speculative_tokens
        # Per group, [G, 1] views of the constants page ownership and the tables' mirror hold (whether it
        # is a state group, tokens per page, pages per request), and the step.tokens_per_page ledger
        # entry: tokens one page holds (a state group's one page holds any length).
        self.state_group = ownership.state_group[:, None]
        self.page_tokens = ownership.block_sizes[:, None]
        self.max_pages = tables.mirror.host_pages[:, None]
        self.tokens_per_page = buffers.array("step.tokens_per_page")
        self.tokens_per_page[:] = np.where(self.state_group, plan.max_model_len, self.page_tokens)

    def check(self, batch: Batch) -> CheckedBatch:
        """Check ``batch`` and derive what applying it needs; raises :class:`SpecError` /
        :class:`CapacityError` naming the request, and changes nothing."""
        if not isinstance(batch, Batch):
            raise SpecError(Problem(field="batch", value=type(batch).__name__, limit="must be a graphkv Batch",
                                    fix="build it with Batch(req_ids=..., query_lens=..., seq_lens=..., "
                                        "new_pages=...)"))
        req_ids, q_t, s_t = batch.req_ids, batch.query_lens, batch.seq_lens
        n = len(req_ids)
        problems = _sizes_problem(batch, n, self.max_num_seqs)
        if problems:
            raise SpecError(*problems)
        qlens = int_array(q_t, "batch.query_lens", "query lengths", bools=True)
        slens = int_array(s_t, "batch.seq_lens", "sequence lengths", bools=True)
        max_len = self.plan.max_model_len
        small = n <= _SMALL
        if small:
            try:
                q_min, s_min = min(q_t), min(s_t)
                bad = q_min < 1 or max(s_t) > max_len or any(map(operator.lt, s_t, q_t))
                num_tokens = int(sum(q_t))
            except TypeError:  # integers struct converts (their __index__) that do not compare: the arrays do
                small = False
        if not small:
            q_min, s_min = int(qlens.min()), int(slens.min())
            bad = bool(((qlens < 1) | (slens < qlens) | (slens > max_len)).any())
            num_tokens = int(qlens.sum())
        # struct packs True as 1: a bool can only be among lengths whose smallest is <= 1 (a decode step's
        # query lengths: has_bool proves plain ints in one C pass, ~10 ns a request)
        if q_min <= 1 and has_bool(q_t):
            raise bool_length(q_t, "batch.query_lens", "query lengths", req_ids)
        if s_min <= 1 and has_bool(s_t):
            raise bool_length(s_t, "batch.seq_lens", "sequence lengths", req_ids)
        if bad:
            i = int(np.flatnonzero((qlens < 1) | (slens < qlens) | (slens > max_len))[0])
            raise SpecError(Problem(field=f"batch[{i}] ({req_ids[i]!r})",
                                    value=f"query_len={int(qlens[i])}, seq_len={int(slens[i])}",
                                    limit=f"need 1 <= query_len <= seq_len <= max_model_len={max_len}",
                                    fix="seq_len counts every token of the request after this step"))
        if num_tokens > self.max_num_tokens:
            raise SpecError(Problem(field="batch.query_lens", value=num_tokens,
                                    limit=f"at most max_num_batched_tokens={self.max_num_tokens} tokens per step",
                                    fix="split the prefill into chunks across steps"))
        ctx = slens - qlens
        rows, new, num_new = self.requests.lookup(req_ids)
        own = self.ownership
        own.check_context(req_ids, rows, new, ctx)
        q = self.decode_query_len
        uniform = num_tokens == n * q and (q == 1 or bool((qlens == q).all()))
        dispatch: StepDispatch = self.dispatch(num_tokens, n, uniform)
        tables = self.tables
        held = tables.num_pages_np[:, rows]  # [G, n] (a copy)
        if num_new:
            held[:, new] = 0
        entries = flatten_new_pages(batch.new_pages, tables.num_groups, req_ids) if batch.new_pages else None
        columns, shared, held_after = None, False, held
        if entries is not None:
            columns, shared = own.check_new_pages(entries, req_ids, rows, new, ctx, held)
            held_after = held.copy()
            held_after[entries.group, entries.request_of_segment()] += entries.count
            self._check_capacity(req_ids, held, held_after)
        self._check_pages_cover(req_ids, held_after, slens)
        if entries is not None and num_new:
            own.check_claims(entries, columns, req_ids, new, ctx, held_after)
        return CheckedBatch(req_ids=req_ids, rows=rows, new=new, num_new=num_new, qlens=qlens, slens=slens, ctx=ctx,
                            query_lens=q_t, num_tokens=num_tokens, num_reqs=n, uniform=uniform, dispatch=dispatch,
                            entries=entries, columns=columns, shared=shared, held=held)

    def _check_capacity(self, req_ids: Sequence[Hashable], held: np.ndarray, held_after: np.ndarray) -> None:
        if not (held_after > self.max_pages).any():
            return
        g, i = (int(x) for x in np.argwhere(held_after > self.max_pages)[0])
        raise self.tables.capacity_error(g, int(held[g, i]), int(held_after[g, i] - held[g, i]),
                                         field=f"batch.new_pages[{i}][{g}] ({req_ids[i]!r})")

    def _check_pages_cover(self, req_ids: Sequence[Hashable], held: np.ndarray, slens: np.ndarray) -> None:
        """Raise :class:`CapacityError` when a request holds too few pages for this step (after its
        appends): a state group needs its state page, an attention group ``cdiv(seq_len,
        block_size)`` pages (fewer would write K/V into the null page)."""
        if not (held * self.tokens_per_page < slens).any():
            return
        state, page_tokens = self.state_group, self.page_tokens
        need = np.where(state, 1, -(-slens[None, :] // page_tokens))
        g, i = (int(x) for x in np.argwhere(held < need)[0])
        what = "its state page" if state[g, 0] else f"block_size {int(page_tokens[g, 0])}"
        over = int(need[g, i]) > int(self.max_pages[g, 0])  # more than the group's table holds: no page can help
        raise CapacityError(Problem(
            field=f"batch.new_pages[{i}][{g}] ({req_ids[i]!r})", value=f"{int(held[g, i])} page(s) held",
            limit=f"group {g} needs {int(need[g, i])} page(s) for seq_len={int(slens[i])} ({what})"
                  + (f", more than its table's {int(self.max_pages[g, 0])} pages per request" if over else ""),
            fix=self.tables.capacity_fix(g) if over else "give the request its new pages in this step's "
                                                         "Batch.new_pages"))


def check_input_ids(input_ids: Any, num_tokens: int, device: torch.device, *, vocab_size: int | None = None,
                    batch: Batch | None = None) -> "torch.Tensor | np.ndarray":
    """``input_ids`` as a ``[num_tokens]`` integer tensor on the CPU or ``device`` (a tensor given) or
    int64 numpy array (a sequence given); raises :class:`SpecError` for another shape, a float /
    bool / complex dtype (a bool in a list too), an unordered container (a dict, a set), another
    device, and with ``vocab_size`` a token id outside ``[0, vocab_size)`` (naming its request and
    position in ``batch``: :func:`input_ids_field`)."""
    if isinstance(input_ids, torch.Tensor):
        dtype = input_ids.dtype
        if dtype == torch.bool or dtype.is_floating_point or dtype.is_complex:
            raise SpecError(Problem(field="input_ids", value=str(dtype), limit="token ids must be an integer tensor",
                                    fix="pass int64 (or int32) token ids"))
        where = input_ids.device
        if where.type != "cpu" and not (where.type == device.type and device.index in (None, where.index)):
            raise SpecError(Problem(field="input_ids", value=str(where),
                                    limit=f"must be on the CPU or on the step's device {device}",
                                    fix=f"move the token ids with .to('{device}') or keep them on the CPU"))
        ids = input_ids
    else:
        ids = int_array(input_ids, "input_ids", "token ids")
    if ids.shape != (num_tokens,):
        raise SpecError(Problem(field="input_ids", value=tuple(ids.shape),
                                limit=f"must be [{num_tokens}] (the batch's query lengths summed)",
                                fix="pack each request's new tokens in batch order"))
    if vocab_size is not None:
        check_token_ids(ids, vocab_size, lambda i: input_ids_field(i, batch))
    return ids


def input_ids_field(i: int, batch: Batch | None) -> str:
    """``input_ids[i]`` with its batch row, request and position in the request (when ``batch`` says)."""
    if batch is None:
        return f"input_ids[{i}]"
    ends = np.cumsum(np.asarray(batch.query_lens, dtype=np.int64))
    row = int(np.searchsorted(ends, i, side="right"))
    where = f"batch row {row}, request {batch.req_ids[row]!r}"
    try:
        where += f", position {int(batch.seq_lens[row]) - int(ends[row]) + i}"
    except (TypeError, ValueError, IndexError):
        pass
    return f"input_ids[{i}] ({where})"
