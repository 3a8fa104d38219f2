"""Concurrency targets: how long N requests may be, and how many requests of a length fit at once.

Every request of ``max_model_len`` tokens may hold its worst-case pages in every group, so N of
them fit when ``N * pages(max_model_len) <= usable pages``, i.e. when
``pages(max_model_len) <= usable // N`` — the single-request fit against ``usable // N`` pages.
The same page counter answers the reverse questions for the JSON tables.
"""

from __future__ import annotations

from typing import Any, Sequence

from graphkv.errors import CapacityError, Problem
from graphkv.plan.capacity import PageCounter, check_one_token_fits, fit_max_model_len, longest_len, more_pages_fix
from graphkv.spec.limits import Limits

__all__ = ["capacity_tables", "check_concurrency", "fit_for_concurrency", "max_num_seqs_note"]

_TABLE_MIN_LEN = 1024


def fit_for_concurrency(counter: PageCounter, usable_pages: int, concurrency: int, cap: int | None, *,
                        pool_bytes_per_block: int, num_blocks_reason: str, from_override: bool) -> int:
    """The longest length at which ``concurrency`` requests fit at once (``max_model_len="auto"``)."""
    check_one_token_fits(counter, usable_pages, "auto", pool_bytes_per_block=pool_bytes_per_block,
                         num_blocks_reason=num_blocks_reason, from_override=from_override)
    one = counter.pages(1)
    if concurrency * one > usable_pages:  # one request fits: the fix below names at least 1
        raise CapacityError(Problem(
            field="concurrency", value=concurrency,
            limit=(f"even 1-token requests need {one} pages each, so {concurrency} of them need "
                   f"{concurrency * one} pages but the pool has {usable_pages} usable pages ({num_blocks_reason}; "
                   "page 0 is the null page)"),
            fix=(f"lower concurrency to <= {usable_pages // one}, or "
                 f"{more_pages_fix(from_override, concurrency * one, pool_bytes_per_block)}")))
    return fit_max_model_len(counter, usable_pages // concurrency, cap, pool_bytes_per_block=pool_bytes_per_block,
                             num_blocks_reason=num_blocks_reason, from_override=from_override)


def check_concurrency(counter: PageCounter, max_model_len: int, usable_pages: int, concurrency: int,
                      cap: int | None, *, pool_bytes_per_block: int, num_blocks_reason: str,
                      from_override: bool) -> None:
    """Raise :class:`CapacityError` unless ``concurrency`` requests of ``max_model_len`` fit at once,
    naming the largest count that fits and the largest length for ``concurrency`` requests."""
    need = counter.pages(max_model_len)
    fits = usable_pages // need
    if fits >= concurrency:
        return
    longest = longest_len(counter, usable_pages // concurrency, cap if cap is not None else max_model_len)
    for_n = (f"lower max_model_len to <= {longest} for {concurrency} requests at once" if longest
             else f"no max_model_len fits {concurrency} requests at once")
    raise CapacityError(Problem(
        field="concurrency", value=concurrency,
        limit=(f"only {fits} request(s) of max_model_len={max_model_len} ({need} pages each) fit the pool's "
               f"{usable_pages} usable pages ({num_blocks_reason}; page 0 is the null page)"),
        fix=(f"lower concurrency to <= {fits}, or {for_n}, or "
             f"{more_pages_fix(from_override, concurrency * need, pool_bytes_per_block)}")))


def max_num_seqs_note(limits: Limits, max_model_len: int, pages_per_request: int, usable_pages: int) -> str | None:
    """A note when ``max_num_seqs`` exceeds the requests of ``max_model_len`` that fit at once, or
    when ``concurrency`` exceeds ``max_num_seqs`` (the requests that can run at once)."""
    if limits.concurrency is not None and limits.concurrency > limits.max_num_seqs:
        return (f"concurrency={limits.concurrency} exceeds max_num_seqs={limits.max_num_seqs}: at most "
                f"{limits.max_num_seqs} requests run at once, so max_model_len={max_model_len} is planned for "
                f"{limits.concurrency - limits.max_num_seqs} request(s) that never run; raise max_num_seqs to >= "
                f"{limits.concurrency}, or lower concurrency to <= {limits.max_num_seqs} for a longer max_model_len")
    fits = usable_pages // pages_per_request
    if limits.max_num_seqs <= fits:
        return None
    return (f"max_num_seqs={limits.max_num_seqs} exceeds the {fits} request(s) of max_model_len={max_model_len} that "
            f"fit at once ({pages_per_request} pages each, {usable_pages} usable pages): beyond {fits}, requests run "
            f"only while shorter, else the scheduler waits or preempts; for full-length requests, max_num_seqs <= {fits}")


def capacity_tables(groups: Sequence[Any], limits: Limits, usable_pages: int, cap: int | None,
                    plan_len: int) -> dict[str, list[dict[str, Any]]]:
    """JSON-ready tables for the reverse questions.

    ``by_length``: at powers of two from 1024 up to the longest single request (plus the plan's
    length and that longest one), the pages one request needs (per group and in total) and how
    many such requests fit at once. ``by_concurrency``: for 1, 2, 4, … up to ``max_num_seqs``
    requests at once, the longest length that fits. ``groups`` are the plan's groups (anything
    with ``spec`` and ``block_size``).
    """
    counter = PageCounter.for_limits(groups, limits)  # type: ignore[arg-type]  # duck-typed: spec, block_size
    hi = cap if cap is not None else max(plan_len, 1)
    single = longest_len(counter, usable_pages, hi)
    lengths = {plan_len, single}
    n = _TABLE_MIN_LEN
    while n < single:
        lengths.add(n)
        n *= 2
    by_length = []
    for length in sorted(x for x in lengths if x > 0):
        per_group = [counter.group_pages(g, length) for g in groups]
        total = sum(per_group)
        by_length.append({"max_model_len": length, "pages_per_request": total, "pages_by_group": per_group,
                          "max_concurrency": usable_pages // total})
    by_concurrency = []
    count = 1
    while count <= limits.max_num_seqs:
        longest = longest_len(counter, usable_pages // count, hi)
        if not longest:
            break
        by_concurrency.append({"concurrency": count, "max_model_len": longest,
                               "pages_per_request": counter.pages(longest)})
        count = count * 2 if count * 2 <= limits.max_num_seqs or count == limits.max_num_seqs else limits.max_num_seqs
    return {"by_length": by_length, "by_concurrency": by_concurrency}
