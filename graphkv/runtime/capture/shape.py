"""A step's shape, decided once: how many tokens and requests it has, how many the forward runs on,
and which graph (if any) runs it.

Every consumer of a step — the block-table sync (per-step rows up to ``num_reqs_padded``), the
metadata staging (tokens up to ``num_tokens_padded``), the flex mask build, the captured run and
the model's layers — reads one :class:`StepShape`. Nothing re-derives a padded count: a padded
*token* count once reached the table sync as a *request* count and broke every GPU flow (a CPU's
numpy slices clipped it silently).

A step replayed on graph key ``k`` runs on ``k.num_tokens`` tokens; its requests are padded to
``k.num_reqs`` for a uniform decode key and to ``min(k.num_tokens, max_num_seqs)`` for a mixed key
(the rows the key's dummy step had when it was captured). An eager step runs on its own sizes.
Either way ``num_reqs <= num_reqs_padded <= max_num_seqs`` and ``num_tokens <= num_tokens_padded``.

The shape of the step being run is scoped, like the forward context: :func:`shape_context` sets it
for a ``with`` block (``Step.run`` and ``forward_context(ctx, shape)`` do), :func:`current_shape`
reads it (a layer picks its decode or mixed compiled region by ``shape.uniform``).

Example::

    shape = step_shape(dispatcher(3, 3, True), num_tokens=3, num_reqs=3, uniform=True,
                       max_num_seqs=8, replayed=True)
    shape.num_tokens_padded, shape.num_reqs_padded  # (4, 4) on a decode key of 4 tokens
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import TYPE_CHECKING, Iterator

import attrs

from graphkv.plan.graph_keys import GraphKey
from graphkv.spec.limits import CudaGraphMode

if TYPE_CHECKING:
    from graphkv.runtime.capture.keys import StepDispatch

__all__ = ["ShapeMemo", "StepShape", "current_shape", "key_num_reqs", "key_shape", "shape_context", "step_shape"]


@attrs.frozen(kw_only=True)
class StepShape:
    """One step's sizes and how it runs (see the module docstring). ``key`` is the graph that runs
    the step (captured, or rehearsed on a CPU) and ``mode`` its mode (FULL or PIECEWISE); an eager
    step has ``key=None``, mode NONE and ``eager_reason`` saying why. Host-only; capture-safe."""

    num_tokens: int
    num_reqs: int
    num_tokens_padded: int
    num_reqs_padded: int
    uniform: bool
    key: GraphKey | None
    mode: CudaGraphMode
    eager_reason: str | None = None


def key_num_reqs(key: GraphKey, max_num_seqs: int) -> int:
    """The request rows graph ``key`` holds: its own count for a uniform decode key, ``min(num_tokens,
    max_num_seqs)`` for a mixed key (the rows of the dummy step it was captured with). Pure."""
    return key.num_reqs if key.num_reqs is not None else min(key.num_tokens, max_num_seqs)


def step_shape(dispatch: "StepDispatch", *, num_tokens: int, num_reqs: int, uniform: bool, max_num_seqs: int,
               replayed: bool, eager_reason: str | None = None) -> StepShape:
    """The shape of a step of ``num_tokens`` tokens from ``num_reqs`` requests that the plan
    dispatches to ``dispatch`` (a :class:`~graphkv.runtime.capture.keys.StepDispatch`).
    ``replayed``: the forward holds a graph (or a rehearsal) of ``dispatch.key``; otherwise the step
    runs eagerly on its own sizes, for ``eager_reason`` (default: the dispatch's). Pure."""
    key = dispatch.key
    if key is None or not replayed:
        reason = eager_reason if eager_reason is not None else dispatch.eager_reason
        return StepShape(num_tokens=num_tokens, num_reqs=num_reqs, num_tokens_padded=num_tokens,
                         num_reqs_padded=num_reqs, uniform=uniform, key=None, mode=CudaGraphMode.NONE,
                         eager_reason=reason)
    reqs_padded = key_num_reqs(key, max_num_seqs)
    assert num_tokens <= key.num_tokens and num_reqs <= reqs_padded <= max_num_seqs, (key, num_tokens, num_reqs)
    return StepShape(num_tokens=num_tokens, num_reqs=num_reqs, num_tokens_padded=key.num_tokens,
                     num_reqs_padded=reqs_padded, uniform=uniform, key=key, mode=dispatch.mode)


def key_shape(key: GraphKey, mode: CudaGraphMode, *, max_num_seqs: int) -> StepShape:
    """The shape of ``key``'s own dummy step (warm-up, capture, rehearsal): as many tokens and
    requests as the key holds, nothing padded. Pure."""
    num_reqs = key_num_reqs(key, max_num_seqs)
    return StepShape(num_tokens=key.num_tokens, num_reqs=num_reqs, num_tokens_padded=key.num_tokens,
                     num_reqs_padded=num_reqs, uniform=key.uniform, key=key, mode=mode)


class ShapeMemo:
    """:func:`step_shape` for one decider (a captured forward, or a Step's eager forward), remembered
    for uniform decode steps by request count: a serving loop's commonest step costs one dict lookup
    and allocates nothing. (A uniform step's sizes and dispatch follow from its request count; what
    else decides its shape — which graphs the forward holds — changes only at capture, which
    :meth:`clear` s the memo.) At most ``max_num_seqs`` shapes are kept."""

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self._decode: dict[int, StepShape] = {}

    def decode(self, num_reqs: int) -> StepShape | None:
        """The remembered shape of a uniform decode step of ``num_reqs`` requests, if any."""
        return self._decode.get(num_reqs)

    def clear(self) -> None:
        """Forget every remembered shape (the graphs that decide them changed)."""
        self._decode.clear()

    def shape(self, dispatch: "StepDispatch", num_tokens: int, num_reqs: int, uniform: bool, *, replayed: bool,
              eager_reason: str | None) -> StepShape:
        """:func:`step_shape` of these arguments (remembered when ``uniform``)."""
        if uniform and num_reqs in self._decode:
            return self._decode[num_reqs]
        shape = step_shape(dispatch, num_tokens=num_tokens, num_reqs=num_reqs, uniform=uniform,
                           max_num_seqs=self.max_num_seqs, replayed=replayed, eager_reason=eager_reason)
        if uniform:
            self._decode[num_reqs] = shape
        return shape


_SHAPE: contextvars.ContextVar["StepShape | None"] = contextvars.ContextVar("graphkv_step_shape", default=None)


@contextlib.contextmanager
def shape_context(shape: StepShape) -> Iterator[StepShape]:
    """Make ``shape`` the current step shape inside the ``with`` block. Host only; capture-safe."""
    token = _SHAPE.set(shape)
    try:
        yield shape
    finally:
        _SHAPE.reset(token)


def current_shape() -> StepShape | None:
    """The :class:`StepShape` of the step being run (``None`` outside one: e.g. a forward called by
    hand inside ``forward_context(step.context)`` without a shape). Host only."""
    return _SHAPE.get()
