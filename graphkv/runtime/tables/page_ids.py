"""Page ids as a serving loop hands them out (lists, tuples, numpy arrays), checked and flattened.

One step's new pages arrive nested: per request, per KV-cache group, a sequence of page ids.
:func:`flatten_new_pages` turns them into one :class:`PageEntries` (segments of one request and
group, and every id in one int64 array) with a constant number of numpy calls, whatever the
number of requests. The ids are converted by :func:`int_array`, which refuses what is not an
integer — floats (NaN included), strings, ``None``, bools, ints beyond int64 — with a
:class:`~graphkv.errors.SpecError` naming the field, instead of truncating ``3.7`` to page 3.

Why :mod:`struct` and not ``np.asarray``: ``struct.pack("<n>q", *ids)`` converts ints at least as
fast as numpy's slice assignment (the fastest of the candidates measured here) and raises on
floats, strings and ``None``, which numpy would truncate (``3.7`` -> 3) or parse (``"3"`` -> 3).
It accepts ``True``/``False`` (bool is an int) and a 0-d bool tensor, so bools are found
separately, and only when a 0 or a 1 is among the values (a bool converts to one of them): the
common case pays one compare. Where every value may be 1 (a decode step's query lengths),
:func:`has_bool` asks :func:`plain_ints` first: one C-level pass that proves a tuple holds plain
ints only. A dict or a set is refused: its order is no order of ids.
"""

from __future__ import annotations

import itertools
import marshal
import struct
from collections.abc import Mapping, Set
from typing import Any, Callable, Sequence

import numpy as np

from graphkv.errors import Problem, SpecError
from graphkv.printable import shortened
from graphkv.spec._checks import is_bool

__all__ = ["PageEntries", "bool_among", "flatten_new_pages", "has_bool", "int_array", "plain_int_bytes", "plain_ints"]

_chain = itertools.chain.from_iterable
_SMALL = 256  # page ids up to this many are range-checked with Python builtins
_FEW = 8  # ids equal to 1 looked at one by one before one array pass finds the rest
_PY_MIN = 48  # up to this many values Python's min beats a numpy reduction
_min = np.minimum.reduce  # (np.min and ndarray.min add a Python-level call)
_ZEROS = np.zeros(4096, dtype=np.int64)
_ZEROS.flags.writeable = False  # a shared constant: the group of every segment of a one-group plan


def _offender(values: Sequence[Any]) -> Any:
    """The first value of ``values`` that is not an int64 integer, or the sequence's type name."""
    for x in values:
        if is_bool(x) or not isinstance(x, (int, np.integer)) or not -(2**63) <= int(x) < 2**63:
            return x
    return type(values).__name__


def _not_integers(field: str, values: Sequence[Any], what: str) -> SpecError:
    bad = _offender(values)
    if isinstance(bad, (int, np.integer)) and not is_bool(bad):  # an integer, but beyond int64
        return SpecError(Problem(field=field, value=bad, limit=f"{what} must fit int64 (-2**63 <= v < 2**63)",
                                 fix=f"pass {what} below 2**63 (an id or length this large is no real one)"))
    return SpecError(Problem(field=field, value=bad,
                             limit=f"{what} must be integers (not bool, float, str or None)",
                             fix=f"pass {what} as Python or numpy ints"))


def int_array(values: Any, field: str, what: str = "values", *, bools: bool = False) -> np.ndarray:
    """``values`` (a sequence of ints, or a 1-D integer numpy array) as a 1-D int64 array; raises
    :class:`SpecError` naming ``field`` for anything that is not an ordered sequence of integers
    (floats, NaN, strings, ``None``, ints beyond int64, a dict or a set; bools of every kind too
    unless ``bools``, where the caller looks for them itself)."""
    if not isinstance(values, (list, tuple)):
        values = _ordered(values, field, what)
        if isinstance(values, np.ndarray):
            return values
    try:
        out = np.frombuffer(struct.pack(f"{len(values)}q", *values), dtype=np.int64)
    except (struct.error, TypeError, OverflowError, ValueError):
        raise _not_integers(field, values, what) from None
    if not bools and out.size and (min(values) if len(values) <= _PY_MIN else _min(out)) <= 1:
        check_no_bools(out, values, field, what)
    return out


def plain_int_bytes(values: Sequence[Any]) -> bytes | None:
    """The tuple or list ``values`` as :mod:`marshal` bytes when it holds only plain Python ints within
    int32 (no bool, no numpy int), else ``None``: one C-level pass, about half a ``type()`` pass.
    Format 2 writes such an int as ``i`` and 4 bytes, a bool as ``T`` / ``F``, a larger int and a numpy
    scalar (as its buffer) in more bytes, and refuses other types, so the values are plain ints exactly
    when every 5th byte after the 5-byte header is ``i``; equal bytes are then equal values of equal types."""
    try:
        data = marshal.dumps(values, 2)
    except ValueError:
        return None
    return data if len(data) == 5 + 5 * len(values) and not data[5::5].strip(b"i") else None


def plain_ints(values: Sequence[Any]) -> bool:
    """Whether ``values`` holds only plain ints (:func:`plain_int_bytes`); ``False`` says only "look closer"."""
    return plain_int_bytes(values) is not None


def has_bool(values: Sequence[Any]) -> bool:
    """Whether a bool of any kind (Python, numpy, a 0-d bool tensor) is among ``values``."""
    return not plain_ints(values) and any(map(is_bool, values))


def _ordered(values: Any, field: str, what: str) -> "list[Any] | np.ndarray":
    """``values`` other than a list or tuple: a 1-D integer array as int64, an iterable as a list; a
    dict, a set, a non-integer array or something not iterable is refused naming ``field``."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise SpecError(Problem(field=field, value=f"array of dtype {values.dtype}, shape {values.shape}",
                                    limit=f"{what} must be a 1-D integer array or a sequence of ints",
                                    fix="pass e.g. np.array([...], dtype=np.int64) or a list of ints"))
        if values.dtype.kind == "u" and values.size and int(values.max()) >= 2**63:
            raise _not_integers(field, values.tolist(), what)
        return values.astype(np.int64, copy=False)
    if isinstance(values, (Mapping, Set)):
        raise SpecError(Problem(field=field, value=type(values).__name__,
                                limit=f"is unordered ({type(values).__name__}), so its order is no order of {what}",
                                fix=f"pass {what} as a list or tuple, in order"))
    if not _iterable(values):
        if isinstance(values, (int, np.integer)) and not is_bool(values):  # one id where a sequence of them goes
            raise SpecError(Problem(field=field, value=values, limit=f"is one integer, not a sequence of {what}",
                                    fix=f"wrap it in a list: [{values}]"))
        raise _not_integers(field, [values], what)
    return list(values)


def _iterable(values: Any) -> bool:
    if isinstance(values, (str, bytes)):
        return False
    try:
        iter(values)
    except TypeError:
        return False
    return True


def check_no_bools(converted: np.ndarray, values: Sequence[Any], field: str, what: str) -> None:
    """Raise :class:`SpecError` if one of ``values`` (converted to ``converted``, whose smallest is at
    most 1) is a bool."""
    if bool_among(converted, values.__getitem__):
        raise _not_integers(field, values, what)


def bool_among(ids: np.ndarray, value_of: Callable[[int], Any], *, first: int | None = None,
               suspect: Callable[[Any], bool] = is_bool) -> bool:
    """Whether an id equal to 0 or 1 among ``ids`` (whose smallest is at most 1; ``first``: its index
    when known) was given as a bool: ``suspect(value_of(i))`` for such an ``i``. When the smallest is
    1 (no id is 0 or below; page ids are distinct in practice) the 1s are visited in order, one
    ``argmin`` of the rest each, up to :data:`_FEW` of them: one or two short calls, where an array
    pass over every id costs more when the caches are cold. Otherwise one pass finds every id <= 1."""
    if first is None:
        first = int(ids.argmin())
    at = 0
    if ids[first] == 1:
        at = first
        for _ in range(_FEW):
            if suspect(value_of(at)):
                return True
            rest = ids[at + 1:]
            if not rest.shape[0]:
                return False
            j = int(rest.argmin())
            if rest[j] > 1:
                return False
            at += 1 + j
    return any(suspect(value_of(i)) for i in (at + np.flatnonzero(ids[at:] <= 1)).tolist())


class PageEntries:
    """The pages one step appends, flattened: segment ``s`` gives request (batch row) ``req[s]``
    (``req`` is ``None`` when segment ``s`` is request ``s``: one group, every request given)
    ``count[s]`` pages (possibly none) in group ``group[s]``; ``ids`` ``[num_pages] int64`` holds
    every page id, segment after segment (requests in batch order, groups in order). Host-side."""

    __slots__ = ("_segment", "count", "group", "id_range", "ids", "req", "uniform_count")

    def __init__(self, req: np.ndarray | None, group: np.ndarray, count: np.ndarray, ids: np.ndarray,
                 id_range: tuple[int, int], uniform_count: int = 0) -> None:
        self.req, self.group, self.count, self.ids = req, group, count, ids
        self.id_range = id_range  # (smallest, largest) id, (1, 1) when there are none
        self.uniform_count = uniform_count  # pages of every segment when they are all equal, else 0
        self._segment: np.ndarray | None = None

    @property
    def num_pages(self) -> int:
        """Page ids in all segments."""
        return int(self.ids.shape[0])

    def request_of_segment(self) -> np.ndarray:
        """``[segments] int64``: the request (batch row) of each segment."""
        return np.arange(self.count.shape[0]) if self.req is None else self.req

    def segment_of_page(self) -> np.ndarray:
        """``[num_pages] int64``: the segment of each page id (computed once)."""
        if self._segment is None:
            self._segment = np.repeat(np.arange(self.count.shape[0]), self.count)
        return self._segment


def flatten_new_pages(new_pages: Sequence[Any], num_groups: int, req_ids: Sequence[Any]) -> PageEntries | None:
    """Flatten ``Batch.new_pages`` (per request ``None`` or one page-id sequence per group) into
    :class:`PageEntries`, or ``None`` when no request gains a page. Raises :class:`SpecError`
    naming the request (and group) for a wrong group count or a page id that is not an integer
    (ids are not range-checked here). Host-side: a constant number of numpy calls, and C-level
    passes (``map``, ``chain``, ``array``) over the requests and ids."""
    try:
        has_none = None in new_pages  # C-level
    except ValueError:  # an array entry compares with None elementwise
        has_none = any(p is None for p in new_pages)
    if has_none:
        given = [i for i, p in enumerate(new_pages) if p is not None]
        if not given:
            return None
        pages = [new_pages[i] for i in given]
    else:
        given, pages = None, new_pages
    try:
        group_counts_ok = set(map(len, pages)) == {num_groups}  # a str fails the id conversion below
    except TypeError:
        group_counts_ok = False
    if not group_counts_ok:
        raise _group_count_error(pages, given, num_groups, req_ids)
    lists = list(_chain(pages))
    if not set(map(type, lists)) <= _SEQUENCES:  # C-level; a set, a dict, bytes or a generator: named below
        lists = [_page_list(one, s, given, num_groups, req_ids) for s, one in enumerate(lists)]
    try:
        lengths = list(map(len, lists))
        num = sum(lengths)
        if num <= _SMALL:  # Python's min / max on the list beat two numpy reductions
            flat = list(_chain(lists))
            ids = np.frombuffer(struct.pack(f"{num}q", *flat), dtype=np.int64)
            lo, hi = (min(flat), max(flat)) if num else (1, 1)
        else:  # list by list: one huge argument tuple costs more than the joins
            packed = (struct.pack(f"{num}q", *_chain(lists)) if num < 8 * len(lists) else
                      b"".join([struct.pack(f"{len(one)}q", *one) for one in lists]))
            ids = np.frombuffer(packed, dtype=np.int64)
            lo, hi = int(ids.min()), int(ids.max())
    except (struct.error, TypeError, OverflowError, ValueError):
        ids, lo, hi = None, 0, 0
    if ids is None or (lo <= 1 and ids.shape[0] and bool_among(ids, list(_chain(lists)).__getitem__)):
        raise _bad_id_error(lists, given, num_groups, req_ids)
    counts = np.array(lengths, dtype=np.int64)
    uniform = lengths[0] if lengths and lengths.count(lengths[0]) == len(lengths) else 0
    num_given = len(pages)
    if num_groups == 1:
        req = None if given is None else np.asarray(given, dtype=np.int64)
        group = _ZEROS[:num_given] if num_given <= _ZEROS.shape[0] else np.zeros(num_given, dtype=np.int64)
    else:
        seg = np.arange(num_given * num_groups)
        req, group = seg // num_groups, seg % num_groups
        if given is not None:
            req = np.asarray(given, dtype=np.int64)[req]
    return PageEntries(req=req, group=group, count=counts, ids=ids, id_range=(int(lo), int(hi)),
                       uniform_count=uniform)


_SEQUENCES = frozenset((list, tuple, np.ndarray))  # page-id lists taken as they are


def _page_list(one: Any, s: int, given: list[int] | None, num_groups: int, req_ids: Sequence[Any]) -> Any:
    """Page-id list ``s`` (of request ``s // num_groups``'s group ``s % num_groups``) when it is not a list, tuple or
    array: another ordered sequence as a list; a set or a dict (its order is no order of pages: a set reordered
    them), bytes or a string (its items are characters or bytes, not ids) and anything not iterable are refused
    naming the request and group."""
    i, g = _request_of(s // num_groups, given), s % num_groups
    field = f"batch.new_pages[{i}][{g}] ({req_ids[i]!r})"
    if isinstance(one, (str, bytes, bytearray)) or not _iterable(one):
        shown = one if len(repr(one)) <= 60 else shortened(repr(one))
        raise SpecError(Problem(field=field, value=shown, limit="must be a sequence of page ids",
                                fix="pass a tuple or list of ints"))
    return _ordered(one, field, "page ids")


def _request_of(s: int, given: list[int] | None) -> int:
    return s if given is None else given[s]


def _group_count_error(pages: Sequence[Any], given: list[int] | None, num_groups: int,
                       req_ids: Sequence[Any]) -> SpecError:
    for s, one in enumerate(pages):
        if isinstance(one, (str, bytes)) or not hasattr(one, "__len__") or len(one) != num_groups:
            i = _request_of(s, given)
            return SpecError(Problem(field=f"batch.new_pages[{i}] ({req_ids[i]!r})",
                                     value=len(one) if hasattr(one, "__len__") else type(one).__name__,
                                     limit=f"needs one page-ID list per KV-cache group ({num_groups})",
                                     fix="pass () for groups that gain no pages, or None for the request"))
    raise AssertionError("a request's group count is wrong but none was found")


def _bad_id_error(lists: Sequence[Any], given: list[int] | None, num_groups: int, req_ids: Sequence[Any]) -> SpecError:
    """The error naming the request and group of the first page id that is not an integer."""
    for s, one in enumerate(lists):
        i, g = _request_of(s // num_groups, given), s % num_groups
        field = f"batch.new_pages[{i}][{g}] ({req_ids[i]!r})"
        if isinstance(one, (str, bytes)) or not _iterable(one):
            return SpecError(Problem(field=field, value=one, limit="must be a sequence of page ids",
                                     fix="pass a tuple or list of ints"))
        try:
            int_array(one, field, "page ids")
        except SpecError as error:
            return error
    raise AssertionError("a page id failed to convert but every list converts on its own")
