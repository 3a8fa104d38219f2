"""Every rank of a tensor- x pipeline-parallel replica planned in one process, then agreed.

What ``graphkv plan --tp N --pp M`` prints: each rank's shard / stage is compiled locally from its
own budget, the reports go through the same :func:`~graphkv.distributed.agreement.agree` as
:func:`~graphkv.distributed.compile_consensus`, and :func:`~graphkv.distributed.plans.finalize`
builds the agreed plans. Ranks are numbered as vLLM numbers them: ``rank = pp_rank * tp + tp_rank``.
Pure and torch-free.

Example::

    >>> from graphkv import Budget, Limits
    >>> from graphkv.presets import preset_model
    >>> agreed = simulate_consensus(preset_model("llama-3.1-8b"), Limits(), Budget.kv_bytes("20GiB"), tp_size=2, pp_size=2)
    >>> agreed.num_blocks, [len(plan.layers) for plan in agreed.stages]
    (40960, [16, 16])
"""

from __future__ import annotations

from typing import Callable, Sequence

from graphkv.distributed.agreement import agree
from graphkv.distributed.plans import ConsensusPlan, finalize
from graphkv.distributed.reports import Fingerprint, RankReport, budget_report, model_fingerprint, rank_report
from graphkv.errors import Problem, SpecError
from graphkv.plan import Plan
from graphkv.plan.graph_pool import GraphPoolModel
from graphkv.spec._checks import count_arg
from graphkv.spec.budget import Budget
from graphkv.spec.limits import Limits
from graphkv.spec.model import ModelKV

__all__ = ["rank_models", "simulate_consensus"]


def rank_models(model: ModelKV, tp_size: int, pp_size: int, partition: Sequence[int] | None = None) -> list[ModelKV]:
    """What each rank caches, by rank (``pp_rank * tp + tp_rank``), from the whole, unsharded ``model``."""
    shards = [model.shard(tp_size, t) for t in range(tp_size)]  # once per tensor-parallel rank, not per rank
    return [shards[r % tp_size].stage(pp_size, r // tp_size, partition) for r in range(tp_size * pp_size)]


def simulate_consensus(model: ModelKV, limits: Limits | None,
                       budget: Budget | Callable[[int, ModelKV], Budget | None] | None = None, *,
                       tp_size: int, pp_size: int = 1, partition: Sequence[int] | None = None,
                       compile_local: Callable[[int, ModelKV], Plan] | None = None,
                       graph_pool: GraphPoolModel | None = None) -> ConsensusPlan:
    """Plan every rank of ``tp_size x pp_size`` from ``model`` (whole, unsharded) and agree.

    ``budget`` is every rank's KV budget, or ``budget(rank, rank_model)`` each rank's (``None``:
    ``limits.num_blocks_override`` sizes the pool); ``compile_local(rank, rank_model)``
    (optional) replaces the default ``graphkv.compile`` of a rank and returns its plan (the
    command line plans a GPU budget this way); ``graph_pool``: the graph-memory calibration of
    every rank's plan and of the agreed stages (``None``: the uncalibrated estimate). Raises
    :class:`~graphkv.errors.ConsensusError` exactly as the ranks of ``compile_consensus`` would.
    """
    if not isinstance(model, ModelKV):
        raise SpecError(Problem(field="model", value=type(model).__name__, limit="must be a ModelKV (whole, unsharded)",
                                fix="pass graphkv.presets.preset_model(...) or ModelKV.from_hf_config(...)"))
    tp_size = count_arg("tp_size", tp_size, 1, "pass the tensor-parallel size, e.g. tp_size=2")
    pp_size = count_arg("pp_size", pp_size, 1, "pass the pipeline-parallel size, e.g. pp_size=1")
    models = rank_models(model, tp_size, pp_size, partition)
    reports: list[RankReport] = []
    # by shard (kept alive here, so no id is reused): a stage's fingerprint is its whole sharded model's
    fingerprints: dict[int, tuple[ModelKV, Fingerprint]] = {}
    for rank, local in enumerate(models):
        shard = local.whole
        if id(shard) not in fingerprints:
            fingerprints[id(shard)] = (shard, model_fingerprint(local))
        fingerprint = fingerprints[id(shard)][1]
        if compile_local is None:
            own = budget(rank, local) if callable(budget) else budget
            reports.append(budget_report(local, limits, own, rank=rank, fingerprint=fingerprint,
                                         graph_pool=graph_pool))
        else:
            reports.append(rank_report(local, limits, rank=rank, fingerprint=fingerprint, graph_pool=graph_pool,
                                       compile_local=lambda r=rank, m=local: compile_local(r, m)))  # type: ignore[misc]
    return finalize(models[0], limits, agree(reports), graph_pool=graph_pool,
                    fingerprint=fingerprints[id(models[0].whole)][1])
