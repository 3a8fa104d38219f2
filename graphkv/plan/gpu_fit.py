"""Plan on a GPU: the KV pool gets what weights, activations and the graph reserve leave, and what
the plan allocates beside the pool must fit in that reserve.

On a GPU, ``total x utilization = weights + activations + graph reserve + KV pool``. The graph
reserve holds what the plan allocates beside the pool (:attr:`Ledger.beside_pool_device_bytes`): its
static step buffers, the CUDA caching allocator's rounding (the segments ``memory_reserved`` grows
by beyond the pool's and the static buffers' tensors: each pool slot ends on a whole segment),
PyTorch's lazy cuBLAS workspaces (one set per stream) and its estimated CUDA-graph pool. Left to ``None`` it is sized from the plan itself: the largest pool
whose pages and what sits beside them fit together, found from the plan with no reserve by a
bisection on the pool's pages, with the smallest reserve that leaves that pool — at least what sits
beside it, more when a larger pool's last segments would not fit. The bisection assumes that pool and
rounding together never grow as the pool shrinks. That holds except where a static buffer of 1 to
2 MiB fits in the split-off remainder of a pool slot's last segment at one page count and needs a
20 MiB segment of its own at the next lower one; there the search can stop up to that jump (about
20 MiB of pages) below the largest fitting pool. The plan it returns is always re-checked to fit:
never over-committed, at worst a few MiB of pool short (seen with Jamba at 64 sequences, not at the
presets' default limits). Set explicitly, the plan is
refused when what sits beside its pool exceeds the reserve (and the budget's unallocated
remainder). When that cannot fit, the error names the largest ``max_num_batched_tokens`` that does
(the static buffers and the graph pool grow with the step's token budget).
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


@attrs.frozen(kw_only=True)
class GpuPlan:
    """A plan whose pool, static buffers, allocator rounding, lazy cuBLAS workspaces and graph pool fit the GPU
    together."""

    plan: Plan
    budget: Budget  # the budget the plan was compiled with (its graph reserve filled in)
    reserve_is_auto: bool  # True: the reserve was sized from what the plan puts beside its pool
    beside_bytes: int  # the plan's static buffers + allocator rounding + lazy workspaces + estimated graph pool


def beside_pool_bytes(plan: Plan) -> int:
    """GPU bytes the plan allocates beside the KV pool: the runtime's static device buffers on a CUDA
    device + the caching allocator's rounding of the pool and those buffers + PyTorch's lazy cuBLAS
    workspaces + the estimated graph pool
    (host buffers are host memory and do not count)."""
    return plan.ledger.beside_pool_device_bytes


def _usable(budget: Budget) -> int:
    assert budget.gpu is not None
    return int(budget.gpu.total_memory_bytes * budget.utilization)


def _with_reserve(budget: Budget, reserve: int) -> Budget | None:
    """``budget`` with ``reserve`` bytes of graph reserve; ``None`` when that leaves no KV pool."""
    if budget.weights_bytes + budget.activation_bytes + reserve >= _usable(budget):
        return None
    return attrs.evolve(budget, graph_reserve_bytes=reserve)


def _room(budget: Budget) -> int:
    """What weights and activations leave of the GPU x utilization: the pool and what sits beside it."""
    return _usable(budget) - budget.weights_bytes - budget.activation_bytes


def _fits(plan: Plan, budget: Budget) -> bool:
    """Whether the plan's pool pages and what it allocates beside them fit what weights and activations leave."""
    return plan.num_blocks * plan.pool_bytes_per_block + beside_pool_bytes(plan) <= _room(budget)


def _at(model: ModelKV, limits: Limits, budget: Budget, graph_pool: GraphPoolModel | None, reserve: int) -> Plan | None:
    """The plan with ``reserve`` bytes of graph reserve; ``None`` when that leaves no pool the limits accept."""
    sized = _with_reserve(budget, reserve)
    if sized is None:
        return None
    try:
        return compile_plan(model, limits, sized, graph_pool=graph_pool)
    except CapacityError:
        if reserve == 0:
            raise  # the pool is too small even with nothing beside it: not the buffers' fault
        return None


def _with_pages(model: ModelKV, limits: Limits, budget: Budget, graph_pool: GraphPoolModel | None, pages: int,
                pool_bytes_per_block: int) -> Plan | None:
    """The plan with a pool of ``pages`` pages: its budget 1 B short of one page more."""
    if pages < 1:
        return None
    return _at(model, limits, budget, graph_pool, _room(budget) - (pages + 1) * pool_bytes_per_block + 1)


def _first_fit(model: ModelKV, limits: Limits, budget: Budget,
               graph_pool: GraphPoolModel | None) -> tuple[Plan, Plan | None] | None:
    """A plan that fits beside what it allocates, and the smallest plan above it found not to (``None`` when the
    plan with no reserve fits as it is): from the pool the no-reserve plan's beside bytes leave, gallop down.
    ``None`` when no pool the limits accept fits."""
    first = _at(model, limits, budget, graph_pool, 0)
    if first is None:
        return None
    if _fits(first, budget):
        return first, None
    ppb, room = first.pool_bytes_per_block, _room(budget)
    failing, step = first, 0
    pages = (room - beside_pool_bytes(first)) // ppb
    while True:
        plan = _with_pages(model, limits, budget, graph_pool, pages, ppb)
        if plan is None:
            return None  # the pool the limits need and what sits beside it do not fit together
        if _fits(plan, budget):
            return plan, failing
        over = plan.num_blocks * ppb + beside_pool_bytes(plan) - room
        failing, step = plan, max(-(-over // ppb), 2 * step)  # at least the pages it is over by
        pages = plan.num_blocks - step


def _fit_auto(model: ModelKV, limits: Limits, budget: Budget, graph_pool: GraphPoolModel | None) -> GpuPlan | None:
    """The plan with the largest pool that fits beside what it allocates, its reserve sized from it.

    The allocator rounding makes what sits beside the pool jump as the pool shrinks (its slots' last
    segments round up), so a reserve of the first plan's beside bytes may still not fit; the pool and
    everything beside it together (nearly always) only grow with the pool, so the largest fitting pool
    is found by bisection on its pages (see the module docstring for the exception, where the result
    fits but may be a few MiB short of the largest). ``None`` when no pool the limits accept fits."""
    found = _first_fit(model, limits, budget, graph_pool)
    if found is None:
        return None
    best, failing = found
    ppb, room = best.pool_bytes_per_block, _room(budget)
    if failing is not None:  # bisect between the fitting pool and the failing one above it
        fails = failing.num_blocks
        while fails - best.num_blocks > 1:
            mid = (best.num_blocks + fails) // 2
            plan = _with_pages(model, limits, budget, graph_pool, mid, ppb)
            if plan is not None and _fits(plan, budget):
                best = plan
            else:
                fails = mid
    # the smallest reserve that holds what sits beside the pool and still leaves it best's pages
    reserve = max(beside_pool_bytes(best), room - (best.num_blocks + 1) * ppb + 1)
    plan = best if best.ledger.budget_bytes == room - reserve else _at(model, limits, budget, graph_pool, reserve)
    assert plan is not None and plan.num_blocks == best.num_blocks and _fits(plan, budget), (reserve, best.num_blocks)
    sized = _with_reserve(budget, reserve)
    assert sized is not None
    return GpuPlan(plan=plan, budget=sized, reserve_is_auto=True, beside_bytes=beside_pool_bytes(plan))


def _try(model: ModelKV, limits: Limits, budget: Budget, auto: bool,
         graph_pool: GraphPoolModel | None = None) -> GpuPlan | None:
    """The fitting plan, or ``None`` when the pool and what sits beside it do not fit together."""
    if auto:
        return _fit_auto(model, limits, budget, graph_pool)
    plan = compile_plan(model, limits, budget, graph_pool=graph_pool)
    if not _fits(plan, budget):
        return None
    return GpuPlan(plan=plan, budget=budget, reserve_is_auto=False, beside_bytes=beside_pool_bytes(plan))


def _largest_step_tokens(model: ModelKV, limits: Limits, budget: Budget, auto: bool,
                         graph_pool: GraphPoolModel | None) -> int | None:
    """The largest ``max_num_batched_tokens`` below the given one whose plan fits (bisection; both the
    static buffers and the graph pool grow with it)."""
    def fits(tokens: int) -> bool:  # whether _try finds a plan, without searching for the largest pool
        at_tokens = attrs.evolve(limits, max_num_batched_tokens=tokens)
        try:
            if auto:
                return _first_fit(model, at_tokens, budget, graph_pool) is not None
            return _try(model, at_tokens, budget, auto, graph_pool) is not None
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


def _or_lower(tokens: int | None) -> str:
    """The fix on the limits: lower the step's token budget to what fits, else the limits it is bounded by."""
    if tokens is not None:
        return f"lower max_num_batched_tokens to <= {tokens}"
    return "lower max_num_seqs or max_model_len (no max_num_batched_tokens fits at this max_num_seqs)"


def compile_for_gpu(model: ModelKV, limits: Limits, budget: Budget, *,
                    graph_pool: GraphPoolModel | None = None) -> GpuPlan:
    """Compile ``model`` for ``budget`` (a :meth:`Budget.for_gpu` budget) so that the pool, the
    plan's static buffers, the caching allocator's rounding of both, PyTorch's lazy cuBLAS workspaces
    and its estimated CUDA-graph pool fit the GPU together (``GpuPlan.beside_bytes`` is :attr:`Ledger.beside_pool_device_bytes`).

    ``budget.graph_reserve_bytes == 0`` means "size the reserve from the plan"; a positive one
    must hold what the plan puts beside the pool (with the budget's unallocated remainder).
    ``graph_pool``: calibrated graph-memory coefficients (as :func:`graphkv.compile`). Raises
    :class:`CapacityError` on ``max_num_batched_tokens`` naming the largest value that fits (or, with
    an explicit reserve too small, on ``graph_reserve_bytes``, naming the automatic reserve); other
    planning errors propagate unchanged.
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
    lower = _or_lower(tokens)
    need = f"{format_bytes(beside)} of static buffers, allocator rounding, cuBLAS workspaces and estimated graph pool" \
        if beside is not None else "the static buffers, allocator rounding, cuBLAS workspaces and estimated graph pool"
    left = _room(budget)
    if not auto:
        try:  # the automatic reserve is checked to fit (a larger one nearly always does, not always: rounding)
            fits_auto = _fit_auto(model, limits, attrs.evolve(budget, graph_reserve_bytes=0), graph_pool)
        except GraphkvError:
            fits_auto = None
        raise CapacityError(Problem(
            field="graph_reserve_bytes", value=budget.graph_reserve_bytes,
            limit=(f"the plan needs {need} beside the KV pool (max_num_batched_tokens="
                   f"{limits.max_num_batched_tokens}) but the graph reserve is {format_bytes(budget.graph_reserve_bytes)}"),
            fix=(f"set graph_reserve_bytes to {fits_auto.budget.graph_reserve_bytes} (what the automatic reserve "
                 f"picks when it is left unset; checked to fit), or {lower}" if fits_auto is not None
                 else lower)))
    raise CapacityError(Problem(
        field="max_num_batched_tokens", value=limits.max_num_batched_tokens,
        limit=(f"the plan needs {need} beside the KV pool, and with them the "
               f"{format_bytes(max(left, 0))} that weights and activations leave of {budget.gpu.name} x utilization "
               f"{budget.utilization} cannot also hold the KV pool the limits need"),
        fix=lower))
