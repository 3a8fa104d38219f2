"""Dropping a live request's trailing pages: :meth:`Step.truncate <graphkv.runtime.step.step.Step.truncate>`.

A serving stack drops pages a request no longer needs (the page of rejected speculative drafts, say). Dropped
from the tables alone, they would stay held in the step's page ownership for good, and a repeated step would
still count them; :func:`truncate_request` drops them from both. A dropped page loses the request's hold: one no
other request holds is free again (holders 0, group -1, no writer, no cached tokens: ``filled`` 0, ``filled_at``
-1), and one the request wrote that others still hold keeps no live writer and no cached tokens either (the
request's tokens past its kept pages are rolled back, or were never written). Pages its tokens still need stay:
keeping fewer pages than its written tokens need is refused, unless ``kept_tokens`` rolls those tokens back first
(in a plan without state layers, and never below the cached tokens it joined with).

Not capture-safe (host state); a few numpy calls per group that shrinks (it runs once per rollback).
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import numpy as np

from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.runtime.step.ownership import PageOwnership
from graphkv.runtime.tables.block_tables import BlockTables
from graphkv.runtime.tables.page_ids import int_array
from graphkv.spec._checks import count_arg

__all__ = ["truncate_request"]


def truncate_request(tables: BlockTables, ownership: PageOwnership, row: int, req_id: Hashable,
                     num_pages_per_group: Sequence[int], kept_tokens: Any = None) -> None:
    """Keep the first ``num_pages_per_group[g]`` pages of request ``req_id`` (table row ``row``) in each group and
    drop the rest from ``tables`` and ``ownership`` (see the module docstring); ``kept_tokens`` (default: all it
    has had written) lowers its written tokens first. Raises :class:`SpecError` for counts that are not one int
    per group in ``0..pages held`` or ``kept_tokens`` outside ``[cached tokens it joined with, written tokens]``
    (or, in a plan with state layers, other than its written tokens), and :class:`CapacityError` for fewer pages
    than the kept tokens need; nothing has changed then."""
    held = tables.num_pages_np[:, row].astype(np.int64)
    keep = _page_counts(num_pages_per_group, held, req_id, tables.num_groups)
    written = int(ownership.written[row])
    tokens = written if kept_tokens is None else _kept_tokens(kept_tokens, ownership, row, req_id, written)
    state, block_sizes = ownership.state_group.astype(bool), ownership.block_sizes.astype(np.int64)
    need = np.where(state, int(tokens > 0), -(-tokens // block_sizes))
    short = np.flatnonzero(keep < need)
    if short.size:
        g = int(short[0])
        what = "its state page" if state[g] else f"block_size {int(block_sizes[g])}"
        roll_back = "" if ownership.has_state else (
            f", or roll its tokens back first with kept_tokens <= {int(keep[g]) * int(block_sizes[g])} (the tokens "
            f"{int(keep[g])} page(s) hold; at least the {int(ownership.claimed[row])} cached tokens it joined with)")
        raise CapacityError(Problem(
            field=f"num_pages_per_group[{g}] ({req_id!r})", value=int(keep[g]),
            limit=f"request {req_id!r} holds {int(held[g])} page(s) in group {g}, and its {tokens} written tokens "
                  f"need {int(need[g])} ({what})",
            fix=f"keep at least {int(need[g])} page(s) in group {g}{roll_back}"))
    shrunk = np.flatnonzero(keep < held).tolist()
    dropped = [tables.pages_np[g][row, keep[g]:held[g]].copy() for g in shrunk]  # before the tables forget them
    tables.truncate(row, keep)
    for pages in dropped:
        _drop(ownership, row, pages[pages > 0])  # (a null entry, if a row ever has one, is nobody's page)
    ownership.written[row] = tokens


def _page_counts(values: Any, held: np.ndarray, req_id: Hashable, num_groups: int) -> np.ndarray:
    """``values`` as one page count per group in ``0..held[g]``, or :class:`SpecError`."""
    keep = int_array(values, "num_pages_per_group", "page counts")
    if keep.shape != (num_groups,) or (keep < 0).any() or (keep > held).any():
        raise SpecError(Problem(field="num_pages_per_group", value=keep.tolist(),
                                limit=f"needs one count per group ({num_groups}), each in 0..the pages request "
                                      f"{req_id!r} holds ({held.tolist()})",
                                fix="pass how many of the request's pages to keep in each group"))
    return keep


def _kept_tokens(value: Any, ownership: PageOwnership, row: int, req_id: Hashable, written: int) -> int:
    """``value`` as the tokens request ``req_id`` keeps written, or :class:`SpecError`."""
    tokens = count_arg("kept_tokens", value, 0, "pass how many of the request's written tokens it keeps")
    claimed = int(ownership.claimed[row])
    if ownership.has_state and tokens != written:
        raise SpecError(Problem(field="kept_tokens", value=tokens,
                                limit=f"request {req_id!r} has had {written} tokens written, and the model's state "
                                      "(Mamba / gated-delta) layers keep one state per request that has absorbed "
                                      "them all: they cannot be rolled back",
                                fix=f"leave kept_tokens unset (or {written}); to drop tokens, finish the request and "
                                    "prefill it again"))
    if not claimed <= tokens <= written:
        raise SpecError(Problem(field="kept_tokens", value=tokens,
                                limit=f"must be in [{claimed}, {written}]: request {req_id!r} has had {written} tokens "
                                      f"written and joined with {claimed} cached tokens (read-only prefix pages "
                                      "another request wrote)",
                                fix=f"pass a count from {claimed} to {written}"))
    return tokens


def _drop(ownership: PageOwnership, row: int, pages: np.ndarray) -> None:
    """Row ``row`` no longer holds ``pages`` (distinct page ids of one group, as :meth:`PageOwnership.release`
    keeps a row's pages): one holder less each; a page it wrote keeps no writer and no cached tokens; a page
    nobody holds any more is free."""
    if not pages.size:
        return
    mine = pages[ownership.writer_row[pages] == row]
    ownership.writer_row[mine] = -1
    ownership.filled[mine] = 0
    ownership.filled_at[mine] = -1
    left = ownership.holders[pages] - 1
    if ownership.num_shared:
        ownership.num_shared -= int(np.count_nonzero(left == 1))  # shared by two before, by one now
    ownership.holders[pages] = left
    free = pages[left == 0]
    ownership.group_of[free] = -1
    ownership.writer_row[free] = -1
    ownership.filled[free] = 0
    ownership.filled_at[free] = -1
