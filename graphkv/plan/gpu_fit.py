"""Plan on a GPU: the KV pool gets what weights, activations and the graph reserve leave, and the
plan's own static buffers and CUDA-graph pool must fit in that reserve.

On a GPU, ``total x utilization = weights + activations + graph reserve + KV pool``. The graph
reserve holds what the plan allocates beside the pool: its static step buffers and its estimated
CUDA-graph pool. Left to ``None`` it is sized from the plan itself (planned once with no reserve,
then again with that reserve — the second plan's pool is smaller, so its buffers are never
larger); set explicitly, the plan is refused when its buffers and graph pool exceed it. When
those cannot fit, the error names the largest ``max_num_batched_tokens`` that does (both grow
with the step's token budget).
"""

from __future__ import annotations

import attrs

from graphkv.errors import CapacityError, GraphkvError, Problem
from graphkv.plan.compile import compile_plan
from graphkv.plan.graph_pool import GraphPoolModel
from graphkv.plan.plan import Plan
from graphkv.spec.budget import Budget, format_bytes
from graphkv.spec.limits import Limits
from graphkv.spec.model import ModelKV

__all__ = ["GpuPlan", "beside_pool_bytes", "compile_for_gpu"]

_MAX_PASSES = 4


@attrs.frozen(kw_only=True)
class GpuPlan:
    """A plan whose pool, static buffers and graph pool fit the GPU together."""

    plan: Plan
    budget: Budget  # the budget the plan was compiled with (its graph reserve filled in)
    reserve_is_auto: bool  # True: the reserve was sized from the plan's own buffers and graph pool
    beside_bytes: int  # the plan's static buffers + estimated graph pool


def beside_pool_bytes(plan: Plan) -> int:
    """GPU bytes the plan allocates beside the KV pool: the runtime's static device buffers on a CUDA
    device + the estimated graph pool (host buffers are host memory and do not count)."""
    return plan.ledger.beside_pool_device_bytes


def _usable(budget: Budget) -> int:
    assert budget.gpu is not None
    return int(budget.gpu.total_memory_bytes * budget.utilization)


def _with_reserve(budget: Budget, reserve: int) -> Budget | None:
    """``budget`` with ``reserve`` bytes of graph reserve; ``None`` when that leaves no KV pool."""
    if budget.weights_bytes + budget.activation_bytes + reserve >= _usable(budget):
        return None
    return attrs.evolve(budget, graph_reserve_bytes=reserve)


def _try(model: ModelKV, limits: Limits, budget: Budget, auto: bool,
         graph_pool: GraphPoolModel | None = None) -> GpuPlan | None:
    """The fitting plan, or ``None`` when the buffers and graph pool beside the pool do not fit."""
    if auto:
        reserve = 0
        for _ in range(_MAX_PASSES):
            sized = _with_reserve(budget, reserve)
            if sized is None:
                return None
            try:
                plan = compile_plan(model, limits, sized, graph_pool=graph_pool)
            except CapacityError:
                if reserve == 0:
                    raise  # the pool is too small even with nothing beside it: not the buffers' fault
                return None
            beside = beside_pool_bytes(plan)
            if beside <= reserve:
                return GpuPlan(plan=plan, budget=sized, reserve_is_auto=True, beside_bytes=beside)
            reserve = beside
        return None
    plan = compile_plan(model, limits, budget, graph_pool=graph_pool)
    beside = beside_pool_bytes(plan)
    if beside > budget.graph_reserve_bytes:
        return None
    return GpuPlan(plan=plan, budget=budget, reserve_is_auto=False, beside_bytes=beside)


def _largest_step_tokens(model: ModelKV, limits: Limits, budget: Budget, auto: bool,
                         graph_pool: GraphPoolModel | None) -> int | None:
    """The largest ``max_num_batched_tokens`` below the given one whose plan fits (bisection; both the
    static buffers and the graph pool grow with it)."""
    def fits(tokens: int) -> bool:
        try:
            return _try(model, attrs.evolve(limits, max_num_batched_tokens=tokens), budget, auto, graph_pool) is not None
        except GraphkvError:
            return False

    lo = max(limits.max_num_seqs, 1 + limits.num_speculative_tokens)
    if lo >= limits.max_num_batched_tokens or not fits(lo):
        return None
    hi = limits.max_num_batched_tokens  # invariant: fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def compile_for_gpu(model: ModelKV, limits: Limits, budget: Budget, *,
                    graph_pool: GraphPoolModel | None = None) -> GpuPlan:
    """Compile ``model`` for ``budget`` (a :meth:`Budget.for_gpu` budget) so that the pool, the
    plan's static buffers and its estimated CUDA-graph pool fit the GPU together.

    ``budget.graph_reserve_bytes == 0`` means "size the reserve from the plan"; a positive one
    must hold the plan's buffers and graph pool. ``graph_pool``: calibrated graph-memory coefficients
    (as :func:`graphkv.compile`). Raises :class:`CapacityError` on
    ``max_num_batched_tokens`` naming the largest value that fits (or, with an explicit reserve
    too small, on ``graph_reserve_bytes``); other planning errors propagate unchanged.
    """
    if budget.gpu is None:
        raise CapacityError(Problem(field="budget", value=budget.describe(), limit="compile_for_gpu needs a GPU budget",
                                    fix="use Budget.for_gpu(...) or call graphkv.compile for a fixed KV size"))
    auto = budget.graph_reserve_bytes == 0
    fitted = _try(model, limits, budget, auto, graph_pool)
    if fitted is not None:
        return fitted
    try:  # what the plan puts beside the pool (auto: planned with no reserve, its largest)
        beside: int | None = beside_pool_bytes(compile_plan(model, limits, budget, graph_pool=graph_pool))
    except GraphkvError:
        beside = None
    tokens = _largest_step_tokens(model, limits, budget, auto, graph_pool)
    lower = (f"lower max_num_batched_tokens to <= {tokens}" if tokens is not None
             else "no max_num_batched_tokens fits at this max_num_seqs; lower max_num_seqs or max_model_len")
    need = f"{format_bytes(beside)} of static buffers and estimated graph pool" if beside is not None \
        else "the static buffers and estimated graph pool"
    left = _usable(budget) - budget.weights_bytes - budget.activation_bytes
    if not auto:
        raise CapacityError(Problem(
            field="graph_reserve_bytes", value=budget.graph_reserve_bytes,
            limit=(f"the plan needs {need} beside the KV pool (max_num_batched_tokens="
                   f"{limits.max_num_batched_tokens}) but the graph reserve is {format_bytes(budget.graph_reserve_bytes)}"),
            fix=(f"raise graph_reserve_bytes to >= {beside}, or {lower}" if beside is not None else lower)))
    raise CapacityError(Problem(
        field="max_num_batched_tokens", value=limits.max_num_batched_tokens,
        limit=(f"the plan needs {need} beside the KV pool, and with them the "
               f"{format_bytes(max(left, 0))} that weights and activations leave of {budget.gpu.name} x utilization "
               f"{budget.utilization} cannot also hold the KV pool the limits need"),
        fix=lower))
