"""What a serving loop says about one step: :class:`Batch` (what :meth:`Step.prepare` makes of it is a
:class:`~graphkv.runtime.capture.shape.StepShape`)."""

from __future__ import annotations

from collections.abc import Mapping, MappingView, Set as AbstractSet
from typing import Any, Hashable, Sequence

import attrs

from graphkv.errors import Problem, SpecError

__all__ = ["Batch"]


_UNORDERED = (AbstractSet, Mapping, MappingView)  # sets, frozensets, dicts and their keys / values / items views


def _tuple_of(field: str) -> Any:
    """The converter of field ``field``: a tuple as it is; a list, a 1-D array, a range or another ordered
    iterable as a tuple; a set or a dict (or a view of one) refused: its order is no order of requests, and
    the rows would be paired with another request's lengths and pages."""
    def convert(value: Any) -> tuple:
        if isinstance(value, tuple):
            return value
        if type(value) is list:
            return tuple(value)
        if isinstance(value, _UNORDERED):
            raise SpecError(Problem(field=f"Batch.{field}", value=f"a {type(value).__name__} of {len(value)}",
                                    limit="must be a sequence in batch-row order (one entry per request); this is "
                                          "an unordered container: its order is no order of requests",
                                    fix="pass a tuple or list, in batch-row order (req_ids, query_lens, seq_lens and "
                                        "new_pages in the same order)"))
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise SpecError(Problem(field=f"Batch.{field}", value=value, limit="must be a sequence (one entry per "
                                    "request)", fix="pass a tuple or list"))
        return tuple(value)
    return convert


@attrs.frozen(kw_only=True)
class Batch:
    """One scheduled step, as a serving loop describes it.

    ``req_ids[i]`` (hashable) is batch row ``i``; its ``query_lens[i]`` new tokens are packed in row
    order and end the sequence at ``seq_lens[i]`` tokens (so the query starts at position
    ``seq_lens[i] - query_lens[i]``, the request's context). ``new_pages[i][g]`` are the page ids
    request ``i`` gains in KV-cache group ``g`` this step (appended to its table; ``()`` for none);
    ``new_pages[i]`` is ``None`` when request ``i`` gains no pages, and ``new_pages`` is empty when
    no request does (the cheap case for a decode step). A Mamba group's state page is the first
    page its request is given.

    A request that joins with context (``seq_len > query_len``) claims cached tokens: its first
    pages must hold them (prefix caching, see :mod:`graphkv.runtime.step.ownership`). Construction
    only converts to tuples (refusing a set or a dict, or a view of one, with :class:`SpecError`: its order is
    no order of requests); :meth:`Step.prepare` checks everything else.
    """

    req_ids: tuple[Hashable, ...] = attrs.field(converter=_tuple_of("req_ids"))
    query_lens: tuple[int, ...] = attrs.field(converter=_tuple_of("query_lens"))
    seq_lens: tuple[int, ...] = attrs.field(converter=_tuple_of("seq_lens"))
    new_pages: tuple[Sequence[Sequence[int]] | None, ...] = attrs.field(default=(), converter=_tuple_of("new_pages"))

    @property
    def num_reqs(self) -> int:
        """Requests in the step."""
        return len(self.req_ids)

