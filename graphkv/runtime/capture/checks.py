"""Checks of what a captured forward is built and captured with, made once (never per step).

Each refuses with a :class:`~graphkv.errors.CaptureError` that names the argument, the value, the
limit and the fix: a plan of another kind (a distributed :class:`ConsensusPlan`, a
:class:`~graphkv.plan.gpu_fit.GpuPlan`, a dict), a forward or callback that is not callable, static
input names the forward has no parameter for, a forward and a ``Step`` planned differently, and a
``prepare`` that fails or returns no context manager.

Example::

    plan = check_plan(graphkv.compile(model, limits, budget))   # the Plan itself
    plan_difference(plan, attrs.evolve(plan, model_name="x"))   # "model_name: 'toy' vs 'x'"
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, ContextManager, Iterable

import attrs

from graphkv.errors import CaptureError, GraphkvError, Problem
from graphkv.plan.graph_keys import GraphKey
from graphkv.plan.plan import Plan
from graphkv.printable import shortened

__all__ = ["check_callable", "check_forward_parameters", "check_plan", "enter_prepared", "plan_difference",
           "refuse_other_plan"]


def check_plan(plan: Any) -> Plan:
    """``plan`` when it is a :class:`Plan`; else :class:`CaptureError` saying where the Plan is (a
    ``GpuPlan`` holds it in ``.plan``, a ``ConsensusPlan`` one per pipeline stage in ``.stages``)."""
    if isinstance(plan, Plan):
        return plan
    from graphkv.plan.gpu_fit import GpuPlan

    kind = type(plan).__name__
    if isinstance(plan, GpuPlan):
        fix = "pass its .plan (the Plan compile_for_gpu sized to the GPU): graphkv.capture(gpu_plan.plan, ...)"
    elif hasattr(plan, "stages") and hasattr(plan, "plan_for"):  # graphkv.distributed's ConsensusPlan
        fix = ("pass this rank's stage plan: consensus.plan_for(model) (that is consensus.stages[model.pipeline_rank]"
               ", the Plan every rank of the stage agreed on)")
    else:
        fix = "build it with graphkv.compile(model, limits, budget)"
    raise CaptureError(Problem(field="plan", value=kind, limit="must be a graphkv Plan", fix=fix))


def check_callable(field: str, value: Any, fix: str, *, optional: bool = True) -> None:
    """:class:`CaptureError` on ``field`` unless ``value`` is callable (or ``None`` when ``optional``)."""
    if (value is None and optional) or callable(value):
        return
    raise CaptureError(Problem(field=field, value=shortened(repr(value)),
                               limit="must be callable" + (" or None" if optional else ""), fix=fix))


def check_forward_parameters(fn: Callable[..., Any], names: Iterable[str], what: str) -> None:
    """:class:`CaptureError` when the forward has no parameter for a static input name (every
    warm-up, capture and replay passes each static input as a keyword argument). A forward whose
    signature cannot be read, or that takes ``**kwargs``, passes."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or an extension: nothing to check against
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                     inspect.Parameter.KEYWORD_ONLY)]
    unknown = sorted(set(names) - set(accepted))
    if unknown:
        raise CaptureError(Problem(
            field=what, value=unknown,
            limit=f"name no parameter of the forward {getattr(fn, '__qualname__', type(fn).__name__)}"
                  f"({', '.join(accepted)}), which is called with every static input as a keyword argument",
            fix=f"name the static inputs after the forward's parameters ({', '.join(accepted) or 'it has none'})"))


def plan_difference(a: Plan, b: Plan) -> str | None:
    """How two plans differ, for an error message (``None`` when they are equal): the limits that
    differ (``"limits.max_num_seqs: 8 vs 4"``), else the plan fields that do. Host only."""
    if a is b or a == b:
        return None
    fields = [f.name for f in attrs.fields(type(a.limits)) if getattr(a.limits, f.name) != getattr(b.limits, f.name)]
    if fields:
        return ", ".join(f"limits.{n}: {getattr(a.limits, n)!r} vs {getattr(b.limits, n)!r}" for n in fields)
    fields = [f.name for f in attrs.fields(Plan) if getattr(a, f.name) != getattr(b, f.name)]
    shown = [f"{n}: {getattr(a, n)!r} vs {getattr(b, n)!r}" if n in ("model_name", "group_size") else f"{n} differs"
             for n in fields]
    return shortened(", ".join(shown), 200)


def refuse_other_plan(plan: Plan, prepare: Any) -> None:
    """Refuse ``prepare=step.capture_context`` of a Step planned otherwise than the forward's ``plan``: its
    dummy steps and buffers are not the ones the forward's keys stand for (a decode key of 8 requests cannot be
    staged by a Step of 4)."""
    owner = getattr(prepare, "__self__", None)
    other = getattr(owner, "plan", None)
    diff = plan_difference(plan, other) if isinstance(other, Plan) else None
    if diff is not None:
        kind = type(owner).__name__
        raise CaptureError(Problem(
            field="prepare", value=f"{kind}.{getattr(prepare, '__name__', 'prepare')}",
            limit=f"belongs to a {kind} of another plan than the forward's (forward's vs {kind}'s: {diff})",
            fix=f"capture the forward under the {kind}'s plan: graphkv.capture(step.plan, ...)(fn), or build both "
                "from one plan"))


def enter_prepared(stack: contextlib.ExitStack, prepare: Callable[[GraphKey], ContextManager[Any]] | None,
                   key: GraphKey) -> None:
    """Enter ``prepare(key)`` on ``stack`` (nothing when ``prepare`` is ``None``). What it raises, other
    than graphkv's own errors, becomes a :class:`CaptureError` naming the key (the exception chained), as
    does a result that is no context manager."""
    if prepare is None:
        return
    try:
        context = prepare(key)
        if not (hasattr(type(context), "__enter__") and hasattr(type(context), "__exit__")):
            raise CaptureError(Problem(field="prepare", value=f"prepare({key}) -> {type(context).__name__}",
                                       limit="must return a context manager (entered around the key's warm-up "
                                             "and capture)",
                                       fix="return one, e.g. from a @contextlib.contextmanager function, or pass "
                                           "prepare=step.capture_context"))
        stack.enter_context(context)
    except GraphkvError:
        raise
    except Exception as e:
        raise CaptureError(Problem(field="prepare", value=str(key),
                                   limit=f"prepare({key}) failed: {type(e).__name__}: {shortened(str(e), 200)}",
                                   fix="make prepare(key) set up a dummy step of every key of the plan (the "
                                       "exception is chained)")) from e
