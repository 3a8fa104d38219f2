"""The lean path of :meth:`BlockTables.append_batch` for one KV-cache group.

One group, every row given one list of pages: a decode step in which requests cross into a new
page, a uniform prefill, or any small append. Small appends cost less in plain Python than in
numpy calls, whose fixed cost dominates below a few hundred pages, and every numpy call counts
double when other work ran since the last step and the caches are cold (measured with
``benchmarks/block_tables.py``, where the peers run between graphkv's steps):

- up to :data:`TINY_PAGES` pages, rows gaining any numbers of pages: one Python loop stores every
  page through memoryviews of the mirror and (on a CPU, when batch row ``i`` shows request row
  ``i``, with one kernel block per page) of the step tables. A memoryview of int32 refuses floats,
  strings, ``None`` and ints out of range as it stores, so the loop is its own type check; on a
  refusal what it stored is undone. With several kernel blocks per page the step rows are expanded
  afterwards, by one broadcast add when the rows are consecutive and gain as many pages from the
  same column;
- above that, every row gaining the same number of pages: ``struct.pack`` checks the ids as uint32
  (integers, not negative; as on the general path), ``argmax`` / ``argmin`` check the range and
  find a 0 or 1 (a bool may hide there: :func:`~graphkv.runtime.tables.page_ids.bool_among`),
  and a constant handful of numpy calls write them: one row-slice write when every row holds the
  same number of pages, else one scatter.

Anything else (``None`` for a row, not exactly one list per row, more pages in uneven rows, an id
that is not an integer in ``[0, num_blocks)`` or is a bool, a row that would overflow) returns
False with nothing changed, and the general path checks, raises or appends.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any, Sequence

import numpy as np

from graphkv.runtime.tables.host_sync import HostSync, as_slice
from graphkv.runtime.tables.mirror import PageMirror
from graphkv.runtime.tables.page_ids import bool_among
from graphkv.runtime.tables.staged_sync import StagedSync

__all__ = ["TINY_PAGES", "append_one_group"]

TINY_PAGES = 64  # up to this many pages an append is stored page by page in Python
_chain = itertools.chain.from_iterable


def append_one_group(bt: PageMirror, sync: "HostSync | StagedSync", rows: "np.ndarray | None", row_list: list[int],
                     top_row: int, new_pages: Sequence[Any]) -> bool:
    """Append ``new_pages[i][0]`` to row ``row_list[i]`` of the mirror's only group (telling ``sync``,
    the device side); returns False (nothing changed) when this path does not apply. ``top_row`` is
    ``max(row_list)``."""
    try:
        lists = [p for (p,) in new_pages]
        count = len(lists[0]) if lists else 0
        if count * len(lists) <= TINY_PAGES:
            flat = list(_chain(lists))
            if not flat or len(flat) > TINY_PAGES:
                return False  # nothing to append, or uneven rows with many pages: the general path
            lo, hi = min(flat), max(flat)
            if lo < 0 or hi >= bt.num_blocks or (lo <= 1 and any(type(x) is not int for x in flat if x <= 1)):
                return False  # out of the pool, or a 0 / 1 that may be a bool: the general path looks
            return _store_pages(bt, sync, row_list, top_row, lists, count if len(flat) == count * len(lists) else 0)
    except (TypeError, ValueError):  # not one group, not sequences, or ids that do not compare with ints
        return False
    pack = bt.packers.get(count)
    if pack is None:
        pack = bt.packers[count] = struct.Struct(f"{count}I").pack
    try:  # the type check of the general path, list by list (one huge argument tuple costs more), as
        # uint32: struct refuses what is not an integer, negative or beyond 2**32 (beyond any pool)
        buf = bytearray().join(itertools.starmap(pack, lists))
    except (struct.error, TypeError, OverflowError):
        return False  # the general path names the id
    ids = np.frombuffer(buf, dtype=np.uint32)
    # Range and bool checks by argmax / argmin, not max / min reductions: their code path is much
    # shorter, which counts when other work ran since the last step and the caches are cold.
    if int(ids[ids.argmax()]) >= bt.num_blocks:
        return False
    first = int(ids.argmin())
    if ids[first] <= 1 and bool_among(ids, lambda i: lists[i // count][i % count], first=first, suspect=_not_int):
        return False  # a 0 / 1 that may be a bool (or another int type): the general path looks
    counts = bt.num_pages_mv
    held = [counts[r] for r in row_list]
    same = held.count(held[0]) == len(held)  # every row holds as many pages (the commonest case)
    if (held[0] if same else max(held)) + count > bt.max_pages[0]:
        return False
    shown = bt.identity_rows > top_row  # batch row i shows request row i for every row here
    _write_arrays(bt, sync, rows if rows is not None else np.array(row_list, dtype=np.int64), row_list, held, same,
                  ids, count, shown)
    if same:
        now = held[0] + count
        for r in row_list:
            counts[r] = now
    else:
        for r, h in zip(row_list, held):
            counts[r] = h + count
    return True


def _store_pages(bt: PageMirror, sync: "HostSync | StagedSync", row_list: list[int], top_row: int,
                 lists: list[Any], count: int) -> bool:
    """One loop over the rows: capacity, mirror, step tables (when they show these rows with one
    kernel block per page), page counts. ``count``: the pages of the first row when all rows together
    gain as many as if each gained that many (0 otherwise); each row's own length is what is stored.
    Undoes itself and returns False on anything unexpected."""
    pages, mirror, counts = bt.max_pages[0], bt.pages_mv, bt.num_pages_mv
    step = sync.step_view() if bt.identity_rows > top_row else None
    kernel_blocks = step[0] if step is not None and step[1] == 1 else None
    done: list[tuple[int, int, int]] = []  # (row, pages held before, pages added)
    try:
        if count == 1:  # a decode step crossing into new pages: one store each (split pages: expanded after)
            for r, (page,) in zip(row_list, lists):
                h = counts[r]
                if h >= pages:
                    raise ValueError("not this path")
                done.append((r, h, 1))
                base = r * pages + h
                mirror[base] = page
                if kernel_blocks is not None:
                    kernel_blocks[base] = page
                counts[r] = h + 1
        else:
            for r, ids in zip(row_list, lists):
                h, n = counts[r], len(ids)
                if h + n > pages:
                    raise ValueError("not this path")
                done.append((r, h, n))
                base = r * pages + h
                if kernel_blocks is None:
                    for j, page in enumerate(ids):
                        mirror[base + j] = page
                else:
                    for j, page in enumerate(ids):
                        mirror[base + j] = kernel_blocks[base + j] = page
                counts[r] = h + n
    except (TypeError, ValueError, OverflowError):
        for r, h, n in done:  # undo: the stored pages back to the null page, the counts as they were
            for j in range(h, min(h + n, pages)):
                mirror[r * pages + j] = 0
                if kernel_blocks is not None:
                    kernel_blocks[r * pages + j] = 0
            counts[r] = h
        return False
    if step is None:
        held = np.array([h for _, h, _ in done])
        sync.appended_one_group(np.array(row_list, dtype=np.int64), held, max(h + n for _, h, n in done))
    elif kernel_blocks is None:  # kernel blocks per page > 1: the step rows expanded from the mirror
        start = done[0][1]
        block_rows = as_slice(row_list) if count else None
        if isinstance(block_rows, slice) and all(h == start and n == count for _, h, n in done):  # one add
            sync.expand_rows(block_rows, start, start + count)
        else:
            lines = [r * pages + h + j for r, h, n in done for j in range(n)]
            sync.write_lines(lines, list(_chain(lists)))
    return True


def _not_int(x: Any) -> bool:
    return type(x) is not int


def _write_arrays(bt: PageMirror, sync: "HostSync | StagedSync", rows: np.ndarray, row_list: list[int],
                  held: list[int], same: bool, ids: np.ndarray, count: int, shown: bool) -> None:
    """A constant number of numpy calls: one row-slice write when every row holds the same pages (``same``).
    ``ids`` are uint32 (checked to be in the pool), cast to int32 as they are written."""
    start = held[0]
    if same:
        block = ids.reshape(len(row_list), count)
        if not (shown and sync.write_rows(as_slice(row_list), start, block)):
            bt.pages_np[0][rows, start:start + count] = block
            sync.appended_one_group(rows, np.full(len(row_list), start), start + count)
        return
    first = rows * bt.max_pages[0] + np.array(held)
    dst = (first[:, None] + np.arange(count)).ravel()
    if not sync.write_through(rows, dst, ids):
        bt.pages_flat[dst] = ids
        sync.appended_one_group(rows, np.array(held), max(held) + count)
