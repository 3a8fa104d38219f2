"""What the block tables refuse, and how they say it: a sync's rows, a row that outgrows its group's table."""

from __future__ import annotations

import numpy as np

from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.plan.plan import Plan
from graphkv.runtime.tables.mirror import PageMirror

__all__ = ["capacity_error", "capacity_fix", "checked_rows"]


def checked_rows(m: PageMirror, rows: object, same_rows: bool | None) -> np.ndarray:
    """``rows`` for :meth:`BlockTables.sync` of mirror ``m``: a 1-D int64 array of distinct rows in ``[0,
    max_num_seqs)`` (a list or tuple of plain ints converted), or :class:`SpecError`; with ``same_rows=True``, the
    rows of the last sync."""
    limit = f"must be distinct request rows in [0, max_num_seqs={m.max_num_seqs}), one per batch row"
    if isinstance(rows, (list, tuple)):
        if any(type(r) is not int or not -2**63 <= r < 2**63 for r in rows):  # (int64: the range check is below)
            raise SpecError(Problem(field="rows", value=list(rows), limit=limit + ", each a plain int",
                                    fix="pass a list of ints or a 1-D integer numpy array"))
        rows = np.array(rows, dtype=np.int64).reshape(-1)
    elif not isinstance(rows, np.ndarray) or rows.ndim != 1 or rows.dtype.kind not in "iu":
        shown = f"array of dtype {rows.dtype}, shape {rows.shape}" if isinstance(rows, np.ndarray) \
            else type(rows).__name__
        raise SpecError(Problem(field="rows", value=shown, limit=limit + ", as a 1-D integer array",
                                fix="pass a 1-D integer numpy array (or a list of ints)"))
    rows = rows.astype(np.int64, copy=False)
    shown = m.shown_rows
    if m.shown_valid and rows.shape == shown.shape and rows.tobytes() == shown.tobytes():
        return rows  # the last sync's rows, checked then (one C-level comparison)
    if same_rows and m.shown_valid:  # a promise the sync cannot keep
        raise SpecError(Problem(field="same_rows", value=True,
                                limit=f"rows {rows.tolist()} are not the rows of the last sync "
                                      f"({shown.tolist()}): the step's rows would go on showing those",
                                fix="pass same_rows=None (compared) or False when the batch's rows changed"))
    n = rows.shape[0]
    if n <= 64:  # Python's min / max / set on a short list beat numpy reductions
        items = rows.tolist()
        bad = bool(items) and (min(items) < 0 or max(items) >= m.max_num_seqs or len(set(items)) != n)
    else:
        bad = int(rows.min()) < 0 or int(rows.max()) >= m.max_num_seqs or np.unique(rows).size != n
    if bad:
        raise SpecError(Problem(field="rows", value=rows.tolist(), limit=limit,
                                fix="pass each request's persistent row once"))
    return rows


def capacity_error(plan: Plan, m: PageMirror, g: int, held: int, adding: int, *, field: str,
                   who: str = "") -> CapacityError:
    """The :class:`CapacityError` for group ``g`` of a request holding ``held`` pages that cannot take
    ``adding`` more (``field`` names the input at fault; ``who`` prefixes the limit, e.g. the row)."""
    group = plan.groups[g]
    return CapacityError(Problem(
        field=field, value=adding,
        limit=(f"{who}group {g} ({group.spec.describe()}) holds {held} pages and cannot take "
               f"{adding} more; its capacity is {m.max_pages[g]} pages per request (block table width "
               f"{m.widths[g]} = {m.max_pages[g]} pages x bpk {m.bpks[g]})"),
        fix=capacity_fix(plan, m, g)))


def capacity_fix(plan: Plan, m: PageMirror, g: int) -> str:
    """What to do when a request outgrows group ``g``'s table: a sliding-window table holds the worst case of
    the pages a window needs (what vLLM reserves), but graphkv keeps a request's pages to its end."""
    group, limits = plan.groups[g], plan.limits
    if group.kind.value != "sliding_window":
        return (f"keep requests within max_model_len={plan.max_model_len}, or raise max_model_len when "
                "compiling the plan")
    steps = -(-plan.max_model_len // limits.max_num_batched_tokens)
    return (f"graphkv keeps every page of a request to its end (pages that left the window are not freed), so this "
            f"table holds {m.max_pages[g] * group.block_size} tokens of a request: keep requests within that, "
            f"or plan the sliding tables for whole requests with Limits(max_concurrent_batches={steps}) "
            "(cdiv(max_model_len, max_num_batched_tokens); graphkv.hf.generation.sliding_tables_for(limits, "
            "model_kv) sets it)")
