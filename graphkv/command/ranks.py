"""``graphkv plan --tp N --pp M``: every rank planned from the flags' budget, then agreed.

Each rank's shard / stage of the model (``rank = pp_rank * tp + tp_rank``) is planned with the
same budget flags (``--gpu`` splits the weights over ``tp x pp`` ranks, or, with ``--pp-partition``,
over ``tp`` and by each stage's share of the layers), and the plans go through
the agreement :func:`~graphkv.distributed.compile_consensus` uses
(:func:`~graphkv.distributed.simulate_consensus`). Rank 0 is planned first on its own, so a bad
flag is the same one-line error as without ``--tp`` / ``--pp``; :func:`check_pipeline_flags` refuses
a ``--pp`` / ``--pp-partition`` that cannot cut the model before any rank is planned.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from graphkv.command.budget import BudgetFlags, PlannedBudget, plan_with_budget
from graphkv.command.model_source import ModelSource
from graphkv.distributed import ConsensusPlan, simulate_consensus
from graphkv.errors import Problem, SpecError
from graphkv.plan import Plan
from graphkv.spec.limits import Limits
from graphkv.spec.model import ModelKV
from graphkv.spec.stages import layer_partition, model_layer_count

__all__ = ["MAX_SIMULATION_WORK", "RankedPlans", "check_pipeline_flags", "plan_ranks", "simulation_work"]

# The most work one command simulates, in stage-layer plans (one stage's plan of one model layer; about 4 us on a
# 2-core CPU): about 9 s. A 16384-layer model at --pp 1024 (the former cap, on ranks x layers) took 57 s, 213 s with
# --gpu. Real models stay far below it (deepseek-v3 at --tp 8 --pp 16 --gpu: 5,490).
MAX_SIMULATION_WORK = 1 << 21
_SHARD_WORK = 5  # a tensor-parallel shard of a layer (split, fingerprint, report) costs about 5 stage-layer plans
_GPU_FIT_WORK = 3  # --gpu fits each stage's budget: about 3 plans per stage


def simulation_work(layers: int, tp: int, pp: int, *, gpu: bool) -> int:
    """The work of simulating ``tp x pp`` ranks of a ``layers``-layer model, in stage-layer plans: each distinct
    tensor-parallel shard is built once, each stage planned once (about three times when ``gpu`` fits its
    budget) over the whole model's layers (measured on a 2-core CPU: --tp 32 --pp 2 of 16384 layers took 10.4 s,
    --pp 128 8.9 s, 27.9 s with --gpu)."""
    return layers * (_SHARD_WORK * tp + pp * (_GPU_FIT_WORK if gpu else 1))


@attrs.frozen(kw_only=True)
class RankedPlans:
    """The agreed plans and rank 0's planned budget (its text and JSON describe every rank's)."""

    consensus: ConsensusPlan
    planned: PlannedBudget

    @property
    def widest_stage(self) -> Plan:
        """The stage plan with the most bytes per page index (a per-GPU pool size must cover it)."""
        return max(self.consensus.stages, key=lambda plan: plan.pool_bytes_per_block)


def check_pipeline_flags(whole: ModelKV, pp: int, partition: Sequence[int] | None, *, tp: int = 1,
                         gpu: bool = False) -> None:
    """Refuse, in one short line naming the flag, ``--pp`` above the model's layer count, a
    ``--pp-partition`` that does not list ``--pp`` counts summing to the model's layers (``--pp`` is
    never inferred from the partition: a partition of 3 stages with ``--pp`` 1 is a mistake to name,
    not a plan to change), and more ranks than this command simulates in seconds
    (:func:`simulation_work` above :data:`MAX_SIMULATION_WORK`; ``gpu``: ``--gpu`` fits each stage's
    budget). ``whole`` is the unstaged model."""
    layers = model_layer_count(whole)
    if pp > layers:
        raise SpecError(Problem(field="--pp", value=pp, limit=f"is more than the model's {layers} layers (every stage "
                                                              "holds at least one)", fix=f"use --pp <= {layers}"))
    work = simulation_work(layers, tp, pp, gpu=gpu)
    if tp * pp > 1 and work > MAX_SIMULATION_WORK:
        per_stage = layers * (_GPU_FIT_WORK if gpu else 1)
        stages = (MAX_SIMULATION_WORK - layers * _SHARD_WORK * tp) // per_stage
        most_tp = (MAX_SIMULATION_WORK - per_stage * pp) // (layers * _SHARD_WORK)
        if stages >= 1 and pp > 1:
            fewer = f"plan at most {stages} stages at --tp {tp}"
        elif most_tp >= 1:
            fewer = f"plan with --tp <= {most_tp}" + (f" at --pp {pp}" if pp > 1 else "")
        else:  # neither alone is enough
            fewer = (f"plan fewer ranks (at --tp 1, at most "
                     f"{max(0, (MAX_SIMULATION_WORK - layers * _SHARD_WORK) // per_stage)} stages)")
        raise SpecError(Problem(field="--pp" if pp > 1 else "--tp", value=pp if pp > 1 else tp,
                                limit=f"--tp {tp} x --pp {pp} = {tp * pp} ranks of a {layers}-layer model: every rank's "
                                      f"plan and their agreement are simulated here, {work} stage-layer plans"
                                      f"{' (--gpu fits each stage)' if gpu else ''}, more than {MAX_SIMULATION_WORK} "
                                      "(tens of seconds to minutes of work)",
                                fix=f"{fewer}, or run graphkv.distributed.compile_consensus on the ranks themselves"))
    if partition is None:
        return
    typed, stages, total = ",".join(map(str, partition)), len(partition), sum(partition)
    if len(typed) > 60:
        typed = typed[:60] + "…"
    if stages != pp:
        fixes = []
        if stages <= layers:
            even = "" if total == layers else (f" with counts summing to the model's {layers} layers, e.g. "
                                               f"--pp-partition {','.join(map(str, layer_partition(layers, stages)))}")
            fixes.append(f"add --pp {stages}{even}")
        fixes.append("drop --pp-partition" if pp == 1 else f"list {pp} layer counts summing to {layers}")
        raise SpecError(Problem(field="--pp-partition", value=typed, limit=f"lists {stages} stages but --pp is {pp}",
                                fix=", or ".join(fixes)))
    if total != layers:
        raise SpecError(Problem(field="--pp-partition", value=typed,
                                limit=f"sums to {total} layers, but the model has {layers}",
                                fix=f"list {pp} counts summing to {layers}, e.g. --pp-partition "
                                    f"{','.join(map(str, layer_partition(layers, pp)))} (vLLM's even split, the "
                                    "default without --pp-partition)"))


def plan_ranks(flags: BudgetFlags, source: ModelSource, limits: Limits, *, tp: int, pp: int,
               partition: Sequence[int] | None) -> RankedPlans:
    """Plan every rank of ``tp x pp`` with the budget ``flags`` describe, then agree (see the module docstring).

    ``source`` was read for the same ``tp``: its ``model`` is tensor-parallel rank 0."""
    counts = tuple(partition) if partition is not None else None

    def stage_of(rank: int) -> tuple[int, tuple[int, ...]] | None:
        """(the rank's stage, the partition) for an explicit ``--pp-partition``: its stages' weights differ by
        their layers (vLLM's default split is even to a layer)."""
        return None if counts is None else (rank // tp, counts)

    first_model = source.model.stage(pp, 0, partition)
    first = plan_with_budget(flags, attrs.evolve(source, model=first_model), limits, tp=tp, pp=pp, stage=stage_of(0))
    plans: dict[tuple[object, ...], Plan] = {_same_plan_key(first_model, stage_of(0)): first.plan}

    def compile_local(rank: int, model: ModelKV) -> Plan:
        # A stage's tensor-parallel ranks hold equal shards (only their rank differs) and get equal budgets:
        # each distinct shard is planned once (deepseek-v3 at --tp 8 --pp 16: 16 plans, not 128).
        key = _same_plan_key(model, stage_of(rank))
        if key not in plans:
            plans[key] = plan_with_budget(flags, attrs.evolve(source, model=model), limits, tp=tp, pp=pp,
                                          stage=stage_of(rank)).plan
        return plans[key]

    consensus = simulate_consensus(source.whole, limits, tp_size=tp, pp_size=pp, partition=partition,
                                   compile_local=compile_local, graph_pool=first.graph_pool)
    return RankedPlans(consensus=consensus, planned=first)


def _same_plan_key(model: ModelKV, stage: tuple[int, tuple[int, ...]] | None) -> tuple[object, ...]:
    """What a rank's plan depends on: its shard's layers and fields but its tensor-parallel rank, its stage's
    bounds, and its share of the weights. Ranks with equal keys get equal plans."""
    pipe = model.pipeline  # compared by its bounds: its own ``model`` is the shard, whose rank differs
    bounds = None if pipe is None else (pipe.size, pipe.rank, pipe.start_layer, pipe.end_layer, pipe.partition)
    return (model.name, model.layers, model.max_position_embeddings, model.tensor_parallel_size, model.hidden_size,
            model.cacheless, model.notes, bounds, stage)
