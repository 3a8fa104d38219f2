"""The memory budget a ``graphkv plan`` command describes, planned and explained.

Three sources: ``--kv-memory SIZE`` (the pool itself), ``--gpu NAME`` (total x utilization minus
weights, activations and the graph reserve; the plan's static buffers, allocator rounding, cuBLAS
workspaces and graph pool must fit the reserve, see :mod:`graphkv.plan.gpu_fit`) or only
``--num-blocks-override``. Weights come from ``--weights-memory``, else from the checkpoint (the
preset's recorded bytes or the directory's safetensors metadata) divided by ``--tp``; an unknown
weight is said to be unknown, never silently zero.
"""

from __future__ import annotations

from typing import Any

import attrs

from graphkv.command.model_source import ModelSource
from graphkv.errors import GraphkvError, Problem, SpecError
from graphkv.plan import Plan, compile_plan
from graphkv.plan.gpu_fit import compile_for_gpu
from graphkv.plan.graph_pool import GraphPoolModel
from graphkv.spec.budget import DEFAULT_UTILIZATION, KNOWN_GPUS, MAX_BYTES, Budget, format_bytes, parse_bytes
from graphkv.spec.dtypes import parse_dtype
from graphkv.spec.gpu_room import FLAG_WORDS, GpuRoom, does_not_fit
from graphkv.spec.limits import Limits

__all__ = ["BudgetFlags", "PlannedBudget", "plan_with_budget"]



@attrs.frozen(kw_only=True)
class BudgetFlags:
    """The budget flags as typed (``None``: not given)."""

    kv_memory: str | None = None
    gpu: str | None = None
    utilization: float | None = None
    weights_memory: str | None = None
    activation_memory: str | None = None
    graph_reserve: str | None = None
    num_blocks_override: int | None = None
    default_kv_memory: str = "20GiB"
    graph_calibration: str | None = None  # a graph_calibration.json (graphkv bench memory --out DIR)


@attrs.frozen(kw_only=True)
class PlannedBudget:
    """The plan, the budget it used, and that budget in words (report) and as JSON."""

    plan: Plan
    budget: Budget | None
    flag: str  # the flag that sets the budget as a whole: --kv-memory, --gpu or --num-blocks-override
    text: str
    as_json: dict[str, Any]
    graph_pool: GraphPoolModel | None = None  # the graph-memory calibration the plan used (None: uncalibrated)


def _size(flag: str, text: str, *, allow_zero: bool = False) -> int:
    value = parse_bytes(text, field=flag)
    if value == 0 and not allow_zero:
        example = ("e.g. 512MiB, or leave it out: graphkv sizes it from the plan (static buffers, workspaces, graphs)"
                   if flag == "--graph-reserve" else "e.g. 40GiB")
        raise SpecError(Problem(field=flag, value=text, limit="is zero", fix=f"give {flag} a size above 0, {example}"))
    return value


def _embedding_bytes(config: Any) -> tuple[int, bool] | None:
    """``(vocab_size x hidden_size x the weights' itemsize, tied)`` of a config.json (or its
    ``text_config``): the bytes of the input embedding, which an untied output head repeats; ``None``
    when the config does not say (graphkv's presets keep only what the cache needs)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    vocab, hidden = text.get("vocab_size", config.get("vocab_size")), text.get("hidden_size", config.get("hidden_size"))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (vocab, hidden)):
        return None
    try:
        itemsize = parse_dtype(text.get("dtype") or text.get("torch_dtype") or config.get("dtype")
                               or config.get("torch_dtype") or "bfloat16").itemsize
    except GraphkvError:
        itemsize = 2
    return vocab * hidden * itemsize, bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))


def _stage_weights(source: ModelSource, tp: int, pp: int, stage: tuple[int, tuple[int, ...]],
                   split: str) -> tuple[int, str]:
    """The weights one rank of stage ``stage[0]`` of ``--pp-partition`` ``stage[1]`` holds: its layers' share
    of the layers' weights, and the embedding on the first stage and the output head on the last (vLLM puts
    them there; with tied embeddings the last stage loads its own copy)."""
    assert source.weights is not None
    rank, counts = stage
    layers, num_layers, total = counts[rank], sum(counts), source.weights.total_bytes
    edges = _embedding_bytes(source.config)
    if edges is None:  # no vocabulary known: at least the even split, which covers a stage of average length
        share = max(-(-source.weights.per_rank(tp) * layers // num_layers), source.weights.per_rank(tp * pp))
        return share, (f"{source.weights.source}, {total} B{split} x {layers}/{num_layers} layers, at least 1/{pp} "
                       "(this stage of --pp-partition; the config has no vocab_size to place the embeddings by)")
    embedding, tied = edges
    body = max(total - embedding * (1 if tied else 2), 0)
    held = -(-body * layers // num_layers) + embedding * ((rank == 0) + (rank == len(counts) - 1))
    where = " + the embedding" * (rank == 0) + " + the output head" * (rank == len(counts) - 1)
    return -(-held // tp), (f"{source.weights.source}, {total} B: {layers}/{num_layers} of the layers' {body} B"
                            f"{where} ({embedding} B each){split} (this stage of --pp-partition)")


def _weights(flags: BudgetFlags, source: ModelSource, tp: int, pp: int,
             stage: tuple[int, tuple[int, ...]] | None = None) -> tuple[int, str]:
    if flags.weights_memory is not None:
        return _size("--weights-memory", flags.weights_memory, allow_zero=True), "--weights-memory"
    if source.weights is None:
        return 0, "unknown — 0 B assumed: no safetensors metadata for this model; give --weights-memory SIZE"
    split = f" / tp {tp}" if tp > 1 else ""
    if pp > 1 and stage is not None:  # --pp-partition: a stage holds its own layers
        return _stage_weights(source, tp, pp, stage, split)
    per_rank = source.weights.per_rank(tp * pp)
    if pp > 1:  # embeddings and the head sit on the first / last stage; an even split is within a few percent
        split += f" / pp {pp}, split evenly over the stages"
    return per_rank, f"{source.weights.source}, {source.weights.total_bytes} B{split}"


def _two_pages_bytes(source: ModelSource, limits: Limits) -> int:
    """The smallest KV pool that plans (the null page and one more); 0 when the model does not plan at all."""
    try:
        plan = compile_plan(source.model, attrs.evolve(limits, num_blocks_override=None), Budget.kv_bytes(MAX_BYTES))
    except GraphkvError:
        return 0
    return 2 * plan.pool_bytes_per_block


def _gpu_budget(flags: BudgetFlags, source: ModelSource, limits: Limits, tp: int, pp: int,
                stage: tuple[int, tuple[int, ...]] | None) -> tuple[Budget, dict[str, str]]:
    assert flags.gpu is not None
    gpu = KNOWN_GPUS.get(flags.gpu.strip().lower())
    if gpu is None:
        known = ", ".join(g.name for g in KNOWN_GPUS.values())
        raise SpecError(Problem(field="--gpu", value=flags.gpu, limit=f"is not a known GPU; known: {known}",
                                fix="pick one of those or give the KV pool size directly with --kv-memory SIZE"))
    utilization = DEFAULT_UTILIZATION if flags.utilization is None else flags.utilization
    weights, weights_from = _weights(flags, source, tp, pp, stage)
    activations = 0 if flags.activation_memory is None else _size("--activation-memory", flags.activation_memory,
                                                                  allow_zero=True)
    reserve = 0 if flags.graph_reserve is None else _size("--graph-reserve", flags.graph_reserve)
    if weights + activations + reserve >= int(gpu.total_memory_bytes * utilization):
        room = GpuRoom(gpu=gpu, utilization=utilization, weights_bytes=weights, activation_bytes=activations,
                       graph_reserve_bytes=reserve, min_pool_bytes=_two_pages_bytes(source, limits),
                       default_utilization=DEFAULT_UTILIZATION,
                       typed={"gpu": flags.gpu, "utilization": flags.utilization,
                              "activations": flags.activation_memory, "reserve": flags.graph_reserve,
                              "weights": flags.weights_memory})
        split = source.weights.per_rank if source.weights is not None and flags.weights_memory is None else None
        raise SpecError(does_not_fit(room, weights_from=weights_from, tp=tp, pp=pp, per_rank=split,
                                     tp_sizes=source.tp_sizes, words=FLAG_WORDS))
    budget = Budget.for_gpu(gpu, utilization=utilization, weights_bytes=weights, activation_bytes=activations,
                            graph_reserve_bytes=reserve)
    notes = {"weights": weights_from,
             "activations": "--activation-memory" if flags.activation_memory is not None
             else "not estimated: give --activation-memory SIZE, the forward's peak temporaries",
             "graph_reserve": "--graph-reserve" if flags.graph_reserve is not None
             else "auto: the plan's static buffers + allocator rounding + cuBLAS workspaces + estimated graph pool"}
    return budget, notes


def _shipped_graph_pool(gpu: str, source: ModelSource) -> tuple[GraphPoolModel | None, str]:
    """The graph-memory calibration shipped for ``source``'s model on ``gpu``'s architecture
    (:mod:`graphkv.calibrations`; ``None``, the uncalibrated default, when none ships) and the
    words the graph reserve's note adds about it."""
    from graphkv.calibrations import missing_reason, shipped_calibration

    found = shipped_calibration(gpu, source.model.name)
    if found is None:
        return None, f"; graph pool uncalibrated: {missing_reason(gpu, source.model.name)}"
    return found.graph_pool, f"; graph pool from the shipped calibration of {found.label}"


def _gpu_text(budget: Budget, notes: dict[str, str]) -> str:
    assert budget.gpu is not None
    pad = "\n" + " " * 18
    usable = int(budget.gpu.total_memory_bytes * budget.utilization)
    return (f"{budget.gpu.name} {format_bytes(budget.gpu.total_memory_bytes)} x utilization {budget.utilization} = "
            f"{format_bytes(usable)}"
            f"{pad}- weights {format_bytes(budget.weights_bytes)} ({notes['weights']})"
            f"{pad}- activations {format_bytes(budget.activation_bytes)} ({notes['activations']})"
            f"{pad}- graph reserve {format_bytes(budget.graph_reserve_bytes)} ({notes['graph_reserve']})"
            f"{pad}= {format_bytes(budget.kv_pool_bytes())} for the KV pool")


def _json(budget: Budget | None, source: str, notes: dict[str, str] | None) -> dict[str, Any]:
    gpu = budget.gpu if budget is not None else None
    return {
        "source": source,
        "gpu": gpu.name if gpu is not None else None,
        "total_bytes": gpu.total_memory_bytes if gpu is not None else None,
        "utilization": budget.utilization if gpu is not None else None,
        "weights_bytes": budget.weights_bytes if gpu is not None else None,
        "activation_bytes": budget.activation_bytes if gpu is not None else None,
        "graph_reserve_bytes": budget.graph_reserve_bytes if gpu is not None else None,
        "kv_bytes": budget.kv_pool_bytes() if budget is not None else None,
        "sources": notes,
    }


def plan_with_budget(flags: BudgetFlags, source: ModelSource, limits: Limits, *, tp: int, pp: int = 1,
                     stage: tuple[int, tuple[int, ...]] | None = None) -> PlannedBudget:
    """Build the budget the flags describe and compile ``source.model`` (one rank of ``tp x pp``) within it.
    ``stage``: ``(the rank's stage, --pp-partition's layer counts)`` when the partition is given: with ``--gpu``
    the rank holds its stage's layers and, on the first / last stage, the embedding / output head (else
    ``1 / pp`` of the weights, vLLM's even split)."""
    if flags.gpu is None:
        for flag, value in (("--utilization", flags.utilization), ("--weights-memory", flags.weights_memory),
                            ("--activation-memory", flags.activation_memory), ("--graph-reserve", flags.graph_reserve)):
            if value is not None:
                raise SpecError(Problem(field=flag, value=value, limit="only applies with --gpu",
                                        fix=f"add --gpu NAME or drop {flag}"))
    graph_pool = GraphPoolModel.from_file(flags.graph_calibration, field="--graph-calibration") \
        if flags.graph_calibration is not None else None
    if flags.gpu is not None:
        budget, notes = _gpu_budget(flags, source, limits, tp, pp, stage)
        if graph_pool is None and flags.graph_reserve is None:
            graph_pool, said = _shipped_graph_pool(flags.gpu, source)
            notes["graph_reserve"] += said
        fitted = compile_for_gpu(source.model, limits, budget, graph_pool=graph_pool)
        if fitted.reserve_is_auto and fitted.budget.graph_reserve_bytes > fitted.beside_bytes:
            slack = fitted.budget.graph_reserve_bytes - fitted.beside_bytes
            why = (f"--num-blocks-override fixes the pool at {limits.num_blocks_override} pages"
                   if limits.num_blocks_override is not None
                   else "with one more page the pool's allocator segments would not fit")
            notes["graph_reserve"] += f"; {format_bytes(slack)} of it above what sits beside the pool, left unused: {why}"
        return PlannedBudget(plan=fitted.plan, budget=fitted.budget, flag="--gpu", text=_gpu_text(fitted.budget, notes),
                             as_json=_json(fitted.budget, "gpu", notes), graph_pool=graph_pool)
    if flags.kv_memory is None and flags.num_blocks_override is not None:
        plan = compile_plan(source.model, limits, None, graph_pool=graph_pool)
        return PlannedBudget(plan=plan, budget=None, flag="--num-blocks-override",
                             text=f"no memory budget: --num-blocks-override {flags.num_blocks_override} sizes the pool",
                             as_json=_json(None, "num_blocks_override", None), graph_pool=graph_pool)
    kv = _size("--kv-memory", flags.kv_memory or flags.default_kv_memory)
    budget = Budget(kv_cache_bytes=kv)
    plan = compile_plan(source.model, limits, budget, graph_pool=graph_pool)
    text = budget.describe() + ("" if flags.kv_memory else " (default --kv-memory)")
    return PlannedBudget(plan=plan, budget=budget, flag="--kv-memory", text=text,
                         as_json=_json(budget, "kv_memory", None), graph_pool=graph_pool)
