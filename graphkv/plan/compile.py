"""The compiler pass: model + limits + budget -> one frozen :class:`Plan`.

Pure and deterministic; touches no GPU and imports neither torch nor Triton, so an 80B hybrid
model plans on a laptop in milliseconds, before any weight is loaded.
"""

from __future__ import annotations

import attrs

from graphkv.errors import CapacityError, GraphkvError, Problem, SpecError
from graphkv.plan.block_size import choose_block_size, pad_mamba_layers
from graphkv.plan.buffers import plan_buffers
from graphkv.plan.capacity import PageCounter, check_admission, check_mamba_seqs, fit_max_model_len, plan_num_blocks
from graphkv.plan.concurrency import check_concurrency, fit_for_concurrency, max_num_seqs_note
from graphkv.plan.cudagraph import plan_cudagraph
from graphkv.plan.groups import build_groups
from graphkv.plan.kernel_blocks import choose_kernel_block_size
from graphkv.plan.layout import page_local_slots
from graphkv.plan.allocations.runtime import runtime_allocations
from graphkv.plan.graph_keys import capture_keys
from graphkv.plan.allocations.blas_workspaces import blas_workspaces
from graphkv.plan.graph_pool import GraphPoolModel
from graphkv.plan.ledger import build_ledger
from graphkv.plan.plan import Capacity, GroupPlan, Plan, SlotPlan
from graphkv.plan.plausibility import beside_pool_note
from graphkv.plan.promotion import promote_for_limits, promotion_note
from graphkv.plan.stage_groups import project_grouping
from graphkv.spec.backends import ARCH_DEPENDENT_BACKENDS
from graphkv.spec.budget import ASSUMED_ARCH, GPU, Budget, arch_of
from graphkv.spec.limits import Limits
from graphkv.spec.model import ModelKV

__all__ = ["compile_plan", "resolve_limits"]


def _check_inputs(model: ModelKV, limits: Limits, budget: Budget | None) -> None:
    problems: list[Problem] = []
    if not isinstance(model, ModelKV):
        problems.append(Problem(field="model", value=type(model).__name__, limit="must be a ModelKV",
                                fix="build it with ModelKV.from_hf_config(...) or ModelKV.from_specs(...)"))
    if not isinstance(limits, Limits):
        problems.append(Problem(field="limits", value=type(limits).__name__, limit="must be a Limits",
                                fix="pass graphkv.Limits(...)"))
    if budget is not None and not isinstance(budget, Budget):
        problems.append(Problem(field="budget", value=type(budget).__name__, limit="must be a Budget or None",
                                fix="pass Budget.kv_bytes(...) or Budget.for_gpu(...)"))
    if problems:
        raise SpecError(*problems)
    tp = limits.tensor_parallel_size
    if tp is not None and tp != model.tensor_parallel_size:
        problems.append(Problem(field="tensor_parallel_size", value=tp,
                                limit=f"the model's specs were built for tp={model.tensor_parallel_size}",
                                fix=f"plan a rank's shard, model.shard({tp}, rank) (from_hf_config(..., tp={tp}) builds "
                                    "rank 0), or leave tensor_parallel_size unset"))
    cap = model.max_position_embeddings
    if not limits.is_auto_len and cap is not None and limits.max_model_len > cap:
        problems.append(Problem(field="max_model_len", value=limits.max_model_len,
                                limit=f"exceeds the model's max_position_embeddings={cap}",
                                fix=f"lower max_model_len to <= {cap} or use 'auto'"))
    if problems:
        raise SpecError(*problems)


def resolve_limits(model: ModelKV, limits: Limits) -> Limits:
    """``limits`` with ``max_concurrent_batches`` resolved from the model's pipeline stages
    (:meth:`Limits.concurrent_batches`): what the plan records."""
    if limits.max_concurrent_batches is not None:
        return limits
    return attrs.evolve(limits, max_concurrent_batches=limits.concurrent_batches(model.pipeline_parallel_size))


def _graph_pool(model: ModelKV, graph_pool: GraphPoolModel | None, keys: tuple) -> tuple[tuple, str]:
    """Each capture key's estimated graph memory, and the graph pool entry's reason."""
    if not keys:
        return (), "no graphs are captured"
    if graph_pool is not None and not isinstance(graph_pool, GraphPoolModel):
        raise SpecError(Problem(field="graph_pool", value=type(graph_pool).__name__,
                                limit="must be a GraphPoolModel or None",
                                fix="pass GraphPoolModel.from_file(path) (a calibration written by graphkv bench memory)"))
    chosen = graph_pool.scaled_to(model.hidden_size) if graph_pool is not None else GraphPoolModel.default(model.hidden_size)
    if chosen is None:
        return (), ("unknown: the model declares no hidden_size and no calibration was given (measure it with "
                    "graphkv bench memory)")
    estimates = chosen.estimate(keys)
    how = "calibrated" if chosen.calibrated else "UNCALIBRATED estimate"
    return estimates, (f"{how}: {len(keys)} graphs, captured largest first into one pool ({chosen.source}); "
                       "ledger.graph_keys lists each key")


def compile_plan(model: ModelKV, limits: Limits | None = None, budget: Budget | None = None, *,
                 graph_pool: GraphPoolModel | None = None) -> Plan:
    """Plan the KV cache and CUDA graphs of ``model`` under ``limits`` within ``budget``.

    A pipeline stage (:meth:`ModelKV.stage`) is planned with the whole model's block size, groups
    and CUDA-graph support, its pool holding only its own layers' pages
    (:mod:`graphkv.plan.stage_groups`); the plan's ``limits`` record ``max_concurrent_batches``
    resolved from the stages. ``budget`` may be ``None`` only when ``limits.num_blocks_override`` is set.
    ``graph_pool``: calibrated graph-memory coefficients (:meth:`GraphPoolModel.from_file`); the
    default is the uncalibrated estimate (:mod:`graphkv.plan.graph_pool`). Raises
    :class:`SpecError` for invalid inputs (all problems at once), :class:`PlanError` for inputs
    that cannot be planned together and :class:`CapacityError` when the pool is too small.

    >>> from graphkv import Budget, FullAttentionSpec, Limits, ModelKV, compile
    >>> spec = FullAttentionSpec(num_kv_heads=8, head_size=128)
    >>> model = ModelKV.from_specs("tiny", [(spec, "flash_attn")] * 2)
    >>> compile(model, Limits(max_model_len=4096), Budget.kv_bytes("1GiB")).num_blocks
    8192
    """
    limits = Limits() if limits is None else limits
    try:
        return _compile(model, limits, budget, graph_pool)
    except CapacityError as error:
        if not isinstance(limits, Limits) or limits.block_size is None:
            raise
        raise _blame_block_size(error, model, limits, budget, graph_pool) from error


def _blame_block_size(error: CapacityError, model: ModelKV, limits: Limits, budget: Budget | None,
                      graph_pool: GraphPoolModel | None) -> CapacityError:
    """``error`` as the user's ``block_size`` caused it, when it did: the pool cannot hold its pages but
    it holds those of the planner's own choice. The fix names the largest power-of-two multiple of that
    choice (up to the typed size) that plans, and keeps ``error``'s own fix as the last alternative."""
    try:
        chosen = _compile(model, attrs.evolve(limits, block_size=None), budget, graph_pool).block_size
    except GraphkvError:
        return error
    if limits.block_size <= chosen:
        return error
    best, size = chosen, 2 * chosen
    while size < limits.block_size:
        try:
            _compile(model, attrs.evolve(limits, block_size=size), budget, graph_pool)
        except GraphkvError:
            break
        best, size = size, 2 * size
    first = error.problems[0]
    why = "the planner's choice" if best == chosen else f"{best // chosen} x the planner's choice, {chosen}"
    return CapacityError(Problem(field="block_size", value=limits.block_size,
                                 limit=f"makes the pages too large for the pool ({first.limit})",
                                 fix=f"set block_size to {best} ({why}), or leave block_size unset, or {first.fix}"))


def _compile(model: ModelKV, limits: Limits, budget: Budget | None, graph_pool: GraphPoolModel | None) -> Plan:
    """:func:`compile_plan` of ``limits`` as given."""
    _check_inputs(model, limits, budget)
    limits = resolve_limits(model, limits)

    whole = model.whole
    block = choose_block_size(whole, limits)
    layers, promotion = promote_for_limits(pad_mamba_layers(whole, block), limits)
    grouping = build_groups(layers, block.block_size)
    if promotion is not None:
        grouping = attrs.evolve(grouping, promotion=promotion)
    layers = grouping.layers_as_planned(layers)
    picked = "" if limits.block_size is not None else " (the page size vLLM picks: no block_size given)"
    kernel_sizes = [
        choose_kernel_block_size(d.block_size, [layer.backend for layer in d.layers], group=f"group {i}{picked}")
        for i, d in enumerate(grouping.groups)
    ]
    backends = [tuple(dict.fromkeys(layer.backend.name for layer in d.layers)) for d in grouping.groups]
    cudagraph = plan_cudagraph(grouping.groups, limits)
    if model.pipeline is not None:
        held = {layer.index for layer in model.layers}
        layers = tuple(layer for layer in layers if layer.index in held)
        grouping = project_grouping(grouping, held, f"pipeline stage {model.pipeline.rank}")
    slot_pages = grouping.slot_page_bytes
    pool_bytes_per_block = sum(slot_pages)

    # the device tables hold kernel-block ids (page x blocks per page + k): those must fit int32
    kernel_blocks_per_page = max((d.block_size // k for d, k in zip(grouping.groups, kernel_sizes)), default=1)
    num_blocks, blocks_reason = plan_num_blocks(budget, limits, pool_bytes_per_block,
                                                kernel_blocks_per_page=kernel_blocks_per_page)
    from_override = limits.num_blocks_override is not None
    usable = num_blocks - 1
    counter = PageCounter.for_limits(grouping.groups, limits)
    cap = model.max_position_embeddings
    n_req = limits.concurrency
    if limits.is_auto_len and n_req is not None:
        max_model_len = fit_for_concurrency(counter, usable, n_req, cap, pool_bytes_per_block=pool_bytes_per_block,
                                            num_blocks_reason=blocks_reason, from_override=from_override)
        len_reason = (f"auto: the largest length at which concurrency={n_req} requests of "
                      f"{counter.pages(max_model_len)} pages each fit {usable} usable pages"
                      + (f" (capped by max_position_embeddings={cap})" if max_model_len == cap else ""))
    elif limits.is_auto_len:
        max_model_len = fit_max_model_len(counter, usable, cap, pool_bytes_per_block=pool_bytes_per_block,
                                          num_blocks_reason=blocks_reason, from_override=from_override)
        len_reason = (f"auto: the largest length whose {counter.pages(max_model_len)} pages per request fit "
                      f"{usable} usable pages" + (f" (capped by max_position_embeddings={cap})"
                                                  if max_model_len == cap else ""))
    else:
        max_model_len = int(limits.max_model_len)
        check_admission(counter, max_model_len, usable, num_blocks=num_blocks, pool_bytes_per_block=pool_bytes_per_block,
                        num_blocks_reason=blocks_reason, from_override=from_override)
        len_reason = f"max_model_len={max_model_len} set by the user; fits {usable} usable pages"
        if n_req is not None:
            check_concurrency(counter, max_model_len, usable, n_req, cap, pool_bytes_per_block=pool_bytes_per_block,
                              num_blocks_reason=blocks_reason, from_override=from_override)
    check_mamba_seqs(counter, limits, usable)
    seqs_note = max_num_seqs_note(limits, max_model_len, counter.pages(max_model_len), usable)
    promoted_note = (promotion_note(grouping.promotion, counter.demand(block.block_size, max_model_len))
                     if grouping.promotion is not None else None)

    real_bytes: dict[tuple[object, int], int] = {}  # (spec, block size) -> real page bytes, once per distinct spec

    def real(spec: object, block_size: int) -> int:
        key = (spec, block_size)
        if key not in real_bytes:
            real_bytes[key] = spec.real_page_size_bytes(block_size)  # type: ignore[attr-defined]
        return real_bytes[key]

    groups = tuple(
        GroupPlan(index=i, spec=d.spec, layers=tuple(layer.index for layer in d.layers),
                  layer_names=tuple(layer.name for layer in d.layers),
                  backends=backends[i],
                  block_size=d.block_size, kernel_block_size=kernel_sizes[i], page_size_bytes=d.page_size_bytes,
                  real_page_size_bytes=real(d.spec, d.block_size),
                  layer_real_page_bytes=tuple(real(layer.spec, d.block_size) for layer in d.layers),
                  pages_per_request=counter.group_pages(d, max_model_len))
        for i, d in enumerate(grouping.groups))
    slot_layers = [tuple(g.layers[j] for g in groups if j < len(g.layers)) for j in range(len(slot_pages))]
    local = page_local_slots(
        slot_layers, slot_pages, [g.layers for g in groups],
        layer_order={d.index: d.backend.kv_layout.order for d in layers},
        layer_real_bytes={i: real for g in groups for i, real in zip(g.layers, g.layer_real_page_bytes)})
    slots = tuple(SlotPlan(index=j, page_size_bytes=page, layers=slot_layers[j], page_local=local[j])
                  for j, page in enumerate(slot_pages))
    capacity = Capacity(num_blocks=num_blocks, pool_bytes_per_block=pool_bytes_per_block,
                        pages_per_request=counter.pages(max_model_len), max_model_len=max_model_len,
                        max_model_len_reason=len_reason, num_blocks_reason=blocks_reason, from_override=from_override,
                        max_position_embeddings=cap)
    buffers = plan_buffers(model, limits, groups, max_model_len=max_model_len, num_blocks=num_blocks)
    budget_bytes = budget.kv_pool_bytes() if budget is not None else num_blocks * pool_bytes_per_block
    allocations = {kind: runtime_allocations(kind, limits=limits, groups=groups, slots=slots, layers=layers,
                                             num_blocks=num_blocks, buffers=buffers) for kind in ("cpu", "cuda")}
    keys = capture_keys(cudagraph, limits)
    graph_keys, graph_reason = _graph_pool(model, graph_pool, keys)
    # the eager steps' stream, and the capture stream once graphs are captured: a cuBLAS workspace set each
    gpu = budget.gpu if budget is not None and isinstance(budget.gpu, GPU) else None
    blas = blas_workspaces(arch_of(gpu) or model.gpu_arch, num_streams=2 if keys else 1,
                           gpu_name=gpu.name if gpu is not None else None)
    ledger = build_ledger(budget_bytes=budget_bytes, capacity=capacity, groups=groups, slots=slots,
                          cpu_allocations=allocations["cpu"], cuda_allocations=allocations["cuda"],
                          graph_keys=graph_keys, graph_pool_reason=graph_reason, blas=blas)
    beside_note = beside_pool_note(ledger, limits, budget, num_blocks * pool_bytes_per_block)
    spec_note = None
    if limits.num_speculative_tokens and any(g.is_ssm for g in groups):
        # the runtime refuses the rollback a rejected draft needs (graphkv.runtime.step.ownership): said up front
        spec_note = (f"num_speculative_tokens={limits.num_speculative_tokens} with state (Mamba / gated-delta) layers: "
                     "the runtime keeps one state per request, which has absorbed every token written, so a running "
                     "request's context cannot roll back: a step after rejected drafts is refused (write a draft's "
                     "tokens only once verified)")
    arch_note = _arch_note(model, gpu)
    return Plan(model_name=model.name, limits=limits, layers=layers, block=block, groups=groups, slots=slots,
                group_size=grouping.group_size, capacity=capacity, buffers=buffers, cudagraph=cudagraph,
                ledger=ledger, notes=(*model.notes, *grouping.notes, *((beside_note,) if beside_note else ()),
                                      *((promoted_note,) if promoted_note else ()),
                                          *((seqs_note,) if seqs_note else ()),
                                          *((spec_note,) if spec_note else ()),
                                          *((arch_note,) if arch_note else ())),
                cacheless=model.cacheless)


def _arch_note(model: ModelKV, gpu: GPU | None) -> str | None:
    """A warning when the budget's GPU is not the architecture the model's backends were chosen for (the model's
    ``gpu_arch``, else an H100's, as the built-in backends are), for a model whose backends differ by architecture."""
    arch = arch_of(gpu)
    built_for = model.gpu_arch or ASSUMED_ARCH
    if gpu is None or arch is None or arch == built_for:
        return None
    if not any(layer.backend.name in ARCH_DEPENDENT_BACKENDS
               or getattr(layer.spec, "prefill_checkpoint_alignment", None) for layer in model.layers):
        return None
    named = "" if model.gpu_arch is not None else " (no GPU was named when it was built)"
    return (f"WARNING: the budget is for the {gpu.name} ({arch}) but the model's backends are those vLLM runs on "
            f"{built_for}{named}: build it for that GPU (ModelKV.from_hf_config(config, gpu={gpu.name!r}) or "
            f"preset_model(name, gpu={gpu.name!r}); graphkv plan --gpu does) for its kernel blocks and CUDA-graph "
            "support")
