"""What a serving loop says about one step (:class:`Batch`), and what :meth:`Step.prepare` made of it
(:class:`PreparedStep`)."""

from __future__ import annotations

from typing import Hashable, Sequence

import attrs

from graphkv.runtime.capture.keys import GraphKey

__all__ = ["Batch", "PreparedStep"]


@attrs.frozen(kw_only=True)
class Batch:
    """One scheduled step, as a serving loop describes it.

    ``req_ids[i]`` is batch row ``i``; its ``query_lens[i]`` new tokens are packed in row order
    and end the sequence at ``seq_lens[i]`` tokens (so the query starts at position
    ``seq_lens[i] - query_lens[i]``). ``new_pages[i][g]`` are the page ids request ``i`` gains in
    KV-cache group ``g`` this step (appended to its table; ``()`` for none); ``new_pages[i]`` is
    ``None`` when request ``i`` gains no pages, and ``new_pages`` is empty when no request does
    (the cheap case for a decode step). A Mamba group's state page is the first page its request
    is given.
    """

    req_ids: tuple[Hashable, ...] = attrs.field(converter=tuple)
    query_lens: tuple[int, ...] = attrs.field(converter=tuple)
    seq_lens: tuple[int, ...] = attrs.field(converter=tuple)
    new_pages: tuple[tuple[Sequence[int], ...] | None, ...] = attrs.field(default=(), converter=tuple)

    @property
    def num_reqs(self) -> int:
        """Requests in the step."""
        return len(self.req_ids)

    @property
    def num_tokens(self) -> int:
        """Tokens in the step (sum of query lengths)."""
        return sum(self.query_lens)


@attrs.frozen(kw_only=True)
class PreparedStep:
    """A step whose buffers are filled: its size, its padded size and how it runs."""

    num_tokens: int
    num_reqs: int
    num_tokens_padded: int
    uniform: bool
    key: GraphKey | None
