"""Page ids as a serving loop hands them out (lists, tuples, numpy arrays), checked and flattened.

One step's new pages arrive nested: per request, per KV-cache group, a sequence of page ids.
:func:`flatten_new_pages` turns them into one :class:`PageEntries` (segments of one request and
group, and every id in one int64 array) with a constant number of numpy calls, whatever the
number of requests. The ids are converted by :func:`int_array`, which refuses what is not an
integer — floats (NaN included), strings, ``None``, bools, ints beyond int64 — with a
:class:`~graphkv.errors.SpecError` naming the field, instead of truncating ``3.7`` to page 3.

Why :mod:`array` and not ``np.asarray``: ``array("q", ids)`` converts a list of ints as fast as
numpy's slice assignment and raises on floats and strings, which numpy would truncate or parse.
It accepts ``True``/``False`` (bool is an int), so bools are found separately, and only when a 0
or a 1 is among the values (a bool converts to one of them): the common case pays one compare.
"""

from __future__ import annotations

import array
import itertools
from typing import Any, Sequence

import numpy as np

from graphkv.errors import Problem, SpecError

__all__ = ["PageEntries", "flatten_new_pages", "int_array"]

_chain = itertools.chain.from_iterable


def _is_bool(x: Any) -> bool:
    return isinstance(x, (bool, np.bool_))


def _offender(values: Sequence[Any]) -> Any:
    """The first value of ``values`` that is not an int64 integer, or the sequence's type name."""
    for x in values:
        if _is_bool(x) or not isinstance(x, (int, np.integer)) or not -(2**63) <= int(x) < 2**63:
            return x
    return type(values).__name__


def _not_integers(field: str, values: Sequence[Any], what: str) -> SpecError:
    return SpecError(Problem(field=field, value=_offender(values),
                             limit=f"{what} must be integers (not bool, float, str or None)",
                             fix=f"pass {what} as Python or numpy ints"))


def int_array(values: Any, field: str, what: str = "values", *, bools: bool = False) -> np.ndarray:
    """``values`` (a sequence of ints, or a 1-D integer numpy array) as a 1-D int64 array; raises
    :class:`SpecError` naming ``field`` for anything that is not a sequence of integers (floats,
    NaN, strings, ``None``, ints beyond int64; bools too unless ``bools``, where they count as 0/1)."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise SpecError(Problem(field=field, value=f"array of dtype {values.dtype}, shape {values.shape}",
                                    limit=f"{what} must be a 1-D integer array or a sequence of ints",
                                    fix="pass e.g. np.array([...], dtype=np.int64) or a list of ints"))
        if values.dtype.kind == "u" and values.size and int(values.max()) >= 2**63:
            raise _not_integers(field, values.tolist(), what)
        return values.astype(np.int64, copy=False)
    if not _iterable(values):
        raise _not_integers(field, [values], what)
    values = values if isinstance(values, (list, tuple)) else list(values)
    try:
        out = np.frombuffer(array.array("q", values), dtype=np.int64)
    except (TypeError, OverflowError, ValueError):
        raise _not_integers(field, values, what) from None
    if not bools and out.size and int(out.min()) <= 1:
        check_no_bools(out, values, field, what)
    return out


def _iterable(values: Any) -> bool:
    if isinstance(values, (str, bytes)):
        return False
    try:
        iter(values)
    except TypeError:
        return False
    return True


def check_no_bools(converted: np.ndarray, values: Sequence[Any], field: str, what: str) -> None:
    """Raise :class:`SpecError` if one of ``values`` (converted to ``converted``) is a bool; only the
    entries that converted to 0 or 1 are looked at."""
    if any(_is_bool(values[i]) for i in np.flatnonzero((converted == 0) | (converted == 1)).tolist()):
        raise _not_integers(field, values, what)


class PageEntries:
    """The pages one step appends, flattened: segment ``s`` gives request (batch row) ``req[s]``
    ``count[s]`` pages in group ``group[s]`` (every count >= 1); ``ids`` ``[num_pages] int64`` holds
    every page id, segment after segment (requests in batch order, groups in order). Host-side."""

    __slots__ = ("count", "group", "id_range", "ids", "req")

    def __init__(self, req: np.ndarray, group: np.ndarray, count: np.ndarray, ids: np.ndarray,
                 id_range: tuple[int, int]) -> None:
        self.req, self.group, self.count, self.ids = req, group, count, ids
        self.id_range = id_range  # (smallest, largest) id, (1, 1) when there are none

    @property
    def num_pages(self) -> int:
        """Page ids in all segments."""
        return int(self.ids.shape[0])

    def segment_of_page(self) -> np.ndarray:
        """``[num_pages] int64``: the segment of each page id."""
        return np.repeat(np.arange(self.count.shape[0]), self.count)


def flatten_new_pages(new_pages: Sequence[Any], num_groups: int, req_ids: Sequence[Any]) -> PageEntries | None:
    """Flatten ``Batch.new_pages`` (per request ``None`` or one page-id sequence per group) into
    :class:`PageEntries`, or ``None`` when no request gains a page. Raises :class:`SpecError`
    naming the request for a wrong group count or a page id that is not an integer (ids are not
    range-checked here). Host-side; a constant number of numpy calls."""
    given = [i for i, p in enumerate(new_pages) if p is not None]
    if not given:
        return None
    lists = []
    for i in given:
        pages = new_pages[i]
        if isinstance(pages, (str, bytes)) or not hasattr(pages, "__len__") or len(pages) != num_groups:
            raise SpecError(Problem(field=f"batch.new_pages[{i}] ({req_ids[i]!r})",
                                    value=len(pages) if hasattr(pages, "__len__") else type(pages).__name__,
                                    limit=f"needs one page-ID list per KV-cache group ({num_groups})",
                                    fix="pass () for groups that gain no pages, or None for the request"))
        lists.extend(pages)
    try:
        counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    except TypeError:
        s = next(s for s, ids in enumerate(lists) if not hasattr(ids, "__len__"))
        i, g = given[s // num_groups], s % num_groups
        raise SpecError(Problem(field=f"batch.new_pages[{i}][{g}] ({req_ids[i]!r})", value=lists[s],
                                limit="must be a sequence of page ids", fix="pass a tuple or list of ints")) from None
    flat = list(_chain(lists))
    try:
        ids = np.frombuffer(array.array("q", flat), dtype=np.int64)
    except (TypeError, OverflowError, ValueError):
        ids = None
    lo, hi = (int(ids.min()), int(ids.max())) if ids is not None and ids.size else (1, 1)
    if ids is None or (lo <= 1 and any(map(_is_bool, (flat[i] for i in np.flatnonzero(ids <= 1).tolist())))):
        for s, one in enumerate(lists):  # name the request and group of the bad id (error path only)
            i, g = given[s // num_groups], s % num_groups
            int_array(one, f"batch.new_pages[{i}][{g}] ({req_ids[i]!r})", "page ids")
        raise AssertionError("a page id failed to convert but every list converts on its own")
    req = np.repeat(np.asarray(given, dtype=np.int64), num_groups)
    group = np.tile(np.arange(num_groups, dtype=np.int64), len(given))
    keep = counts > 0
    return PageEntries(req=req[keep], group=group[keep], count=counts[keep], ids=ids, id_range=(lo, hi))
