"""The counters of a :class:`~graphkv.models.demo_engine.DemoEngine` run."""

from __future__ import annotations

import attrs

__all__ = ["EngineStats"]


@attrs.define
class EngineStats:
    """Counters of a run: steps, tokens processed / generated, pages handed out, pages that were
    handed out again after a finished request released them, seconds in :meth:`DemoEngine.step`, and
    decode steps launched before the host read the previous step's tokens (``overlapped``). With the
    overlap, a request that stops at a stop token has computed one token more (``tokens``), which may
    have taken a page more (``pages_allocated``), and a request waiting for its pages is admitted a
    step later; the generated tokens are the same."""

    steps: int = 0
    tokens: int = 0
    generated: int = 0
    pages_allocated: int = 0
    pages_reused: int = 0
    finished: int = 0
    seconds: float = 0.0
    overlapped: int = 0
