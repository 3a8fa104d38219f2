"""A batch checked whole before a step changes anything: :func:`check_batch` -> :class:`CheckedBatch`.

Everything a step needs to know about its batch is derived and checked here, with no state
change: sizes, integer lengths (floats, NaN and ints beyond int64 are refused, not truncated),
hashable unique request ids, free rows for joining requests, page ids, capacity, pages covering
every sequence, and page ownership (:class:`~graphkv.runtime.step.ownership.PageOwnership`). A
step that repeats the last step's requests skips the request-id work (a tuple comparison). Small
batches are checked with Python builtins on the tuples, large ones with numpy.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Hashable, Sequence

import numpy as np
import torch

from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.runtime.capture.keys import StepDispatch
from graphkv.runtime.step.batch import Batch
from graphkv.runtime.tables.page_ids import PageEntries, flatten_new_pages, int_array

if TYPE_CHECKING:
    from graphkv.runtime.step.step import Step

__all__ = ["CheckedBatch", "check_batch", "check_input_ids"]

_SMALL = 32  # batches up to this size are range-checked with Python builtins (cheaper than numpy calls)


class CheckedBatch:
    """A batch that passed every check, with what the step derives from it (host-side numpy):
    ``rows`` (``[n] int64`` table row of each request, 0 for joining ones, which get a row when the
    step applies), ``new`` (``[n] bool``), ``ctx`` (context = ``seq_len - query_len``), ``held``
    (``[num_groups, n]`` pages held before the step), the page ``entries`` with each page's
    ``columns`` and whether one is ``shared``, and the step's graph ``dispatch``."""

    __slots__ = ("columns", "ctx", "dispatch", "entries", "held", "new", "num_new", "num_reqs", "num_tokens",
                 "qlens", "query_lens", "req_ids", "rows", "shared", "slens", "uniform")

    def __init__(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self, name, value)


def _sizes_problem(batch: Batch, n: int, max_num_seqs: int) -> list[Problem]:
    problems = []
    if not 1 <= n <= max_num_seqs:
        problems.append(Problem(field="batch.req_ids", value=n, limit=f"1..max_num_seqs={max_num_seqs} requests per "
                                "step", fix="schedule fewer requests in this step"))
    if len(batch.query_lens) != n or len(batch.seq_lens) != n or (batch.new_pages and len(batch.new_pages) != n):
        problems.append(Problem(field="batch", value=(n, len(batch.query_lens), len(batch.seq_lens),
                                                      len(batch.new_pages)),
                                limit="req_ids, query_lens, seq_lens (and new_pages if given) need one entry per "
                                      "request", fix="build the Batch from one list of scheduled requests"))
    return problems


def check_batch(step: "Step", batch: Batch) -> CheckedBatch:
    """Check ``batch`` for ``step`` and derive what applying it needs; raises :class:`SpecError` /
    :class:`CapacityError` naming the request, and changes nothing."""
    if not isinstance(batch, Batch):
        raise SpecError(Problem(field="batch", value=type(batch).__name__, limit="must be a graphkv Batch",
                                fix="build it with Batch(req_ids=..., query_lens=..., seq_lens=..., new_pages=...)"))
    req_ids, q_t, s_t = batch.req_ids, batch.query_lens, batch.seq_lens
    n = len(req_ids)
    problems = _sizes_problem(batch, n, step.max_num_seqs)
    if problems:
        raise SpecError(*problems)
    qlens = int_array(q_t, "batch.query_lens", "query lengths", bools=True)
    slens = int_array(s_t, "batch.seq_lens", "sequence lengths", bools=True)
    max_len = step.plan.max_model_len
    if n <= _SMALL:
        bad = min(q_t) < 1 or max(s_t) > max_len or any(map(operator.lt, s_t, q_t))
        num_tokens = int(sum(q_t))
    else:
        bad = bool(((qlens < 1) | (slens < qlens) | (slens > max_len)).any())
        num_tokens = int(qlens.sum())
    if bad:
        i = int(np.flatnonzero((qlens < 1) | (slens < qlens) | (slens > max_len))[0])
        raise SpecError(Problem(field=f"batch[{i}] ({req_ids[i]!r})",
                                value=f"query_len={int(qlens[i])}, seq_len={int(slens[i])}",
                                limit=f"need 1 <= query_len <= seq_len <= max_model_len={max_len}",
                                fix="seq_len counts every token of the request after this step"))
    if num_tokens > step.max_num_tokens:
        raise SpecError(Problem(field="batch.query_lens", value=num_tokens,
                                limit=f"at most max_num_batched_tokens={step.max_num_tokens} tokens per step",
                                fix="split the prefill into chunks across steps"))
    ctx = slens - qlens
    rows, new, num_new = _rows_of(step, req_ids)
    own = step.ownership
    own.check_context(req_ids, rows, new, ctx)
    q = step.decode_query_len
    uniform = num_tokens == n * q and (q == 1 or bool((qlens == q).all()))
    dispatch: StepDispatch = step._dispatch(num_tokens, n, uniform)
    tables = step.tables
    held = tables.num_pages_np[:, rows]  # [G, n] (a copy)
    if num_new:
        held[:, new] = 0
    entries = flatten_new_pages(batch.new_pages, tables.num_groups, req_ids) if batch.new_pages else None
    columns, shared, held_after = None, False, held
    if entries is not None:
        columns, shared = own.check_new_pages(entries, req_ids, rows, new, ctx, held)
        held_after = held.copy()
        held_after[entries.group, entries.request_of_segment()] += entries.count
        _check_capacity(step, req_ids, held, held_after)
    _check_pages_cover(step, req_ids, held_after, slens)
    if entries is not None and num_new:
        own.check_claims(entries, columns, req_ids, new, ctx, held_after)
    return CheckedBatch(req_ids=req_ids, rows=rows, new=new, num_new=num_new, qlens=qlens, slens=slens, ctx=ctx,
                        query_lens=q_t, num_tokens=num_tokens, num_reqs=n, uniform=uniform, dispatch=dispatch,
                        entries=entries, columns=columns, shared=shared, held=held)


def _rows_of(step: "Step", req_ids: tuple) -> tuple[np.ndarray, np.ndarray, int]:
    """Table row of each request (0 for joining ones), which ones join, and how many."""
    n = len(req_ids)
    last = step._last
    if last is not None and last[0] == req_ids:  # the last step's requests: their rows (no hashing)
        return step._last_rows, np.zeros(n, dtype=bool), 0
    try:
        found = list(map(step._rows.get, req_ids))
    except TypeError:
        i = next(i for i, r in enumerate(req_ids) if not isinstance(r, Hashable) or _unhashable(r))
        raise SpecError(Problem(field=f"batch.req_ids[{i}]", value=req_ids[i], limit="request ids must be hashable",
                                fix="use str or int request ids")) from None
    if len(set(req_ids)) != n:
        raise SpecError(Problem(field="batch.req_ids", value=req_ids, limit="must be unique",
                                fix="give each request one row of the batch"))
    num_new = found.count(None)
    if num_new > len(step._free_rows):
        raise SpecError(Problem(field="batch.req_ids", value=f"{num_new} new requests",
                                limit=f"{len(step._rows)} of max_num_seqs={step.max_num_seqs} rows are taken",
                                fix="finish requests (Step.finish) before admitting new ones"))
    if not num_new:
        return np.array(found, dtype=np.int64), np.zeros(n, dtype=bool), 0
    new = np.array([r is None for r in found])
    return np.array([0 if r is None else r for r in found], dtype=np.int64), new, num_new


def _unhashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return True
    return False


def _check_capacity(step: "Step", req_ids: Sequence[Hashable], held: np.ndarray, held_after: np.ndarray) -> None:
    tables = step.tables
    limit = np.array(tables.max_pages)[:, None]
    if not (held_after > limit).any():
        return
    g, i = (int(x) for x in np.argwhere(held_after > limit)[0])
    group = step.plan.groups[g]
    adding = int(held_after[g, i] - held[g, i])
    raise CapacityError(Problem(
        field=f"batch.new_pages[{i}][{g}] ({req_ids[i]!r})", value=adding,
        limit=(f"group {g} ({group.spec.describe()}) holds {int(held[g, i])} pages and cannot take {adding} more; "
               f"its capacity is {tables.max_pages[g]} pages per request (block table width {tables.widths[g]} = "
               f"{tables.max_pages[g]} pages x bpk {tables.bpks[g]})"),
        fix=("free pages that left the window first, or " if group.kind.value == "sliding_window" else "")
            + f"keep requests within max_model_len={step.plan.max_model_len}, or raise max_model_len when compiling "
              "the plan"))


def _check_pages_cover(step: "Step", req_ids: Sequence[Hashable], held: np.ndarray, slens: np.ndarray) -> None:
    """Raise :class:`CapacityError` when a request holds too few pages for this step (after its
    appends): a state group needs its state page, an attention group ``cdiv(seq_len, block_size)``
    pages (fewer would write K/V into the null page)."""
    tokens_per_page = step._tokens_per_page  # [G, 1]: block_size, or max_model_len for a state group
    if not (held * tokens_per_page < slens).any():
        return
    state = step._state_group
    page_tokens = step._page_tokens
    need = np.where(state, 1, -(-slens[None, :] // page_tokens))
    g, i = (int(x) for x in np.argwhere(held < need)[0])
    what = "its state page" if state[g, 0] else f"block_size {int(page_tokens[g, 0])}"
    raise CapacityError(Problem(
        field=f"batch.new_pages[{i}][{g}] ({req_ids[i]!r})", value=f"{int(held[g, i])} page(s) held",
        limit=f"group {g} needs {int(need[g, i])} page(s) for seq_len={int(slens[i])} ({what})",
        fix="give the request its new pages in this step's Batch.new_pages"))


def check_input_ids(input_ids: Any, num_tokens: int, device: torch.device) -> "torch.Tensor | np.ndarray":
    """``input_ids`` as a ``[num_tokens]`` integer tensor on the CPU or ``device`` (a tensor given) or
    int64 numpy array (a sequence given); raises :class:`SpecError` for another shape, a float /
    bool / complex dtype, or another device."""
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
        ids = int_array(input_ids, "input_ids", "token ids", bools=True)
    if ids.shape != (num_tokens,):
        raise SpecError(Problem(field="input_ids", value=tuple(ids.shape),
                                limit=f"must be [{num_tokens}] (the batch's query lengths summed)",
                                fix="pack each request's new tokens in batch order"))
    return ids
