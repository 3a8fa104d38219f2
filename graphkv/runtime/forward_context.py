"""An explicit, scoped forward context: how per-step metadata reaches attention layers.

A serving step enters ``with forward_context(ctx):`` around the model call; attention and state
layers read it with :func:`current_context`. The value lives in a :class:`contextvars.ContextVar`,
so it is scoped to the ``with`` block (and to the thread / task), never a mutable module global,
and nesting restores the outer context on exit.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

from graphkv.errors import CaptureError, Problem

__all__ = ["current_context", "forward_context"]

_CONTEXT: contextvars.ContextVar[Any] = contextvars.ContextVar("graphkv_forward_context")


@contextlib.contextmanager
def forward_context(ctx: Any) -> Iterator[Any]:
    """Make ``ctx`` the current forward context inside the ``with`` block. Capture-safe (host only)."""
    token = _CONTEXT.set(ctx)
    try:
        yield ctx
    finally:
        _CONTEXT.reset(token)


def current_context() -> Any:
    """The context of the innermost enclosing :func:`forward_context` block.

    Raises :class:`CaptureError` when called outside one (a layer ran without step metadata).
    """
    try:
        return _CONTEXT.get()
    except LookupError:
        raise CaptureError(Problem(field="forward_context", value=None,
                                   limit="an attention / state layer ran outside a forward_context block",
                                   fix="run the model through Step.run, or inside `with forward_context(step.context):`")) from None
