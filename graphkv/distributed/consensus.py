"""Agree on one plan over ``torch.distributed``: every rank plans itself, then all exchange and agree.

Steps on every rank of ``group`` (default: the world):

1. plan what this rank caches (its :meth:`ModelKV.shard <graphkv.spec.model.ModelKV.shard>` /
   :meth:`~graphkv.spec.model.ModelKV.stage`) from its own budget — an error is reported to the
   others instead of raised, so no rank is left waiting;
2. a monitored barrier with ``timeout``: a rank that died or never calls ``compile_consensus``
   makes the others raise :class:`~graphkv.errors.ConsensusError` within ``timeout`` (rank 0 names
   the missing ranks) instead of hanging;
3. ``all_gather_object`` of the small :class:`~graphkv.distributed.reports.RankReport` s;
4. the pure :func:`~graphkv.distributed.agreement.agree` and
   :func:`~graphkv.distributed.plans.finalize`, identical on every rank: the same
   :class:`~graphkv.distributed.plans.ConsensusPlan`, or the same error naming the ranks and field.

The barrier and exchange run on a gloo group: the given one, or — for an nccl group — a gloo group
over the same ranks created for the call (pass a gloo group to reuse one). The barrier bounds the
wait for a missing rank; the exchange after it uses the group's own timeout (set ``timeout`` in
``init_process_group`` too, so a rank dying between the two cannot stall the others for the
30-minute default).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from graphkv.distributed.agreement import agree
from graphkv.distributed.plans import ConsensusPlan, finalize
from graphkv.distributed.reports import RankReport, budget_report
from graphkv.errors import ConsensusError, Problem, SpecError
from graphkv.extras import require
from graphkv.plan.graph_pool import GraphPoolModel
from graphkv.spec.budget import Budget
from graphkv.spec.limits import Limits
from graphkv.spec.model import ModelKV

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "compile_consensus"]

DEFAULT_TIMEOUT_SECONDS = 60.0
_MAX_TIMEOUT_SECONDS = 24 * 3600.0
_SAME_CALL = ("every rank of the group must call compile_consensus (same group, same order); check the missing "
              "rank's log for why it stopped")


def _seconds(timeout: Any) -> float:
    """``timeout`` (seconds or a ``timedelta``) as seconds; a bad value is a :class:`SpecError`."""
    value = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= _MAX_TIMEOUT_SECONDS:
        raise SpecError(Problem(field="timeout", value=timeout,
                                limit=f"must be a number of seconds (or a timedelta) in (0, {_MAX_TIMEOUT_SECONDS:g}]",
                                fix="pass e.g. timeout=60 — long enough for the slowest rank to reach the consensus"))
    return float(value)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _exchange(dist: Any, report: RankReport, group: Any, world: int, seconds: float) -> list[RankReport]:
    """Every rank's report, in rank order, after a monitored barrier bounded by ``seconds``."""
    if world == 1:
        return [report]
    wait = timedelta(seconds=seconds)
    cpu = group
    if dist.get_backend(group) != "gloo":
        cpu = dist.new_group(ranks=dist.get_process_group_ranks(group), backend="gloo", timeout=wait,
                             use_local_synchronization=True)
    try:
        dist.monitored_barrier(group=cpu, timeout=wait, wait_all_ranks=True)
    except RuntimeError as err:
        raise ConsensusError(Problem(
            field="timeout", value=seconds,
            limit=(f"on rank {report.rank}: not every rank of the {world}-rank group reached the consensus within "
                   f"{seconds:g} s — a rank died or is stuck before compile_consensus (torch.distributed: "
                   f"{_first_line(err)})"),
            fix=_SAME_CALL)) from err
    gathered: list[Any] = [None] * world
    try:
        dist.all_gather_object(gathered, report, group=cpu)
    except RuntimeError as err:
        raise ConsensusError(Problem(
            field="group", value=f"{world} ranks",
            limit=f"on rank {report.rank}: the exchange of plans failed after every rank arrived — a rank died "
                  f"during it (torch.distributed: {_first_line(err)})",
            fix=_SAME_CALL)) from err
    return gathered


def compile_consensus(model: ModelKV, limits: Limits | None = None, budget: Budget | None = None, *,
                      group: Any = None, timeout: float | timedelta = DEFAULT_TIMEOUT_SECONDS,
                      graph_pool: GraphPoolModel | None = None) -> ConsensusPlan:
    """Plan this rank's cache from its own ``budget`` and agree with every rank of ``group``.

    ``model`` is what this rank caches (``whole_model.shard(tp, tp_rank).stage(pp, pp_rank)``);
    ``group`` a ``torch.distributed`` process group of exactly the ``tp x pp`` ranks of one model
    replica (default: the world; gloo on CPU, nccl on GPU); ``timeout`` (seconds) bounds the wait
    for a missing rank. Returns the same :class:`ConsensusPlan` on every rank: the smallest
    ``num_blocks`` and shortest auto-fit ``max_model_len`` of all ranks, one plan per pipeline
    stage (``result.plan_for(model)`` is this rank's). ``graph_pool``: the graph-memory calibration
    (:meth:`GraphPoolModel.from_file`, the same on every rank) of this rank's plan and the agreed
    stages; ``None``: the uncalibrated estimate.

    Raises :class:`ConsensusError` on every rank when a rank's own plan fails, when the ranks'
    models, limits or paging differ (naming the field and the ranks), or when a rank is missing
    (within ``timeout``); :class:`SpecError` for a bad ``timeout``; ``MissingExtraError`` without
    torch. Not capture-safe (it talks to other processes); call it once, before allocating.
    """
    seconds = _seconds(timeout)
    require("runtime", "torch", needed_by="graphkv.distributed.compile_consensus")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ConsensusError(Problem(field="torch.distributed", value="not initialized",
                                     limit="compile_consensus exchanges the ranks' plans over a process group",
                                     fix="call torch.distributed.init_process_group('gloo' or 'nccl', ...) on every "
                                         "rank first"))
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ConsensusError(Problem(field="group", value=group, limit="this process is not a member of the group",
                                     fix="pass the process group of this rank's model replica"))
    report = budget_report(model, limits, budget, rank=rank, graph_pool=graph_pool)
    reports = _exchange(dist, report, group, dist.get_world_size(group), seconds)
    return finalize(model, limits, agree(reports), graph_pool=graph_pool)
