"""Agree on one plan over ``torch.distributed``: every rank plans itself, then all exchange and agree.

Steps on every rank of ``group`` (default: the world):

1. plan what this rank caches (its :meth:`ModelKV.shard <graphkv.spec.model.ModelKV.shard>` /
   :meth:`~graphkv.spec.model.ModelKV.stage`) from its own budget — an error is reported to the
   others instead of raised, so no rank is left waiting;
2. the exchange of the small :class:`~graphkv.distributed.reports.RankReport` s through the process
   group's store, each rank waiting at most ``timeout``: a rank that died, is stuck or never calls
   ``compile_consensus`` makes every other rank raise :class:`~graphkv.errors.ConsensusError` naming it
   within ``timeout`` instead of hanging (and a rank arriving after the others gave up raises too); no
   collective runs, so the group's own timeout (30 minutes by default) never applies;
3. the pure :func:`~graphkv.distributed.agreement.agree` and
   :func:`~graphkv.distributed.plans.finalize`, identical on every rank: the same
   :class:`~graphkv.distributed.plans.ConsensusPlan`, or the same error naming the ranks and field.

The store is the one ``init_process_group`` set up (hosted by global rank 0: if that process dies, the
others raise at once); any backend works (gloo, nccl), and nothing is sent over the group itself.
"""

from __future__ import annotations

import pickle
import time
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


def _failure(report: RankReport, world: int, seconds: float, why: str, err: BaseException | None) -> ConsensusError:
    cause = f" (torch.distributed: {_first_line(err)})" if err is not None else ""
    return ConsensusError(Problem(
        field="timeout", value=seconds,
        limit=f"on rank {report.rank}: {why} within {seconds:g} s of the {world}-rank group{cause}", fix=_SAME_CALL))


def _exchange(dist: Any, report: RankReport, group: Any, world: int, seconds: float) -> list[RankReport]:
    """Every rank's report, in rank order, through the process group's store: each rank posts its report
    under this call's keys and waits at most ``seconds`` for the others' (every rank, rank 0 included, and
    whatever the group's own timeout: a collective's wait is bounded by the group's timeout only, 30 minutes
    by default). A rank that gives up marks the call failed, so a rank arriving later raises too."""
    if world == 1:
        return [report]
    from torch.distributed import distributed_c10d

    ranks = dist.get_process_group_ranks(group)
    base = "graphkv/consensus/" + ",".join(map(str, ranks))
    try:
        store = distributed_c10d._get_default_store()
        # this rank's calls in this group so far: the same count on every rank (they call in the same order)
        call = store.add(f"{base}/calls/{dist.get_rank()}", 1)
        prefix = f"{base}/{call}"
        keys = [f"{prefix}/rank/{r}" for r in range(world)]
        store.set(keys[report.rank], pickle.dumps(report))
    except RuntimeError as err:
        raise _failure(report, world, seconds, "could not reach the group's store (its host, global rank 0, died?)",
                       err) from err
    # Polled (not store.wait: a client whose wait timed out can answer its next request wrongly), rank by rank, so
    # the ranks still missing are known without asking the store again once the wait is over.
    waiting, pending = list(range(world)), None  # pending: the ranks missing at the last answer
    deadline, pause = time.monotonic() + seconds, 0.001
    try:
        while True:
            pending = waiting = [r for r in waiting if not store.check([keys[r]])]
            if not pending:
                break
            if time.monotonic() > deadline:
                try:
                    store.set(f"{prefix}/failed", f"rank {report.rank}")
                except RuntimeError:
                    pass  # the store's host left meanwhile: ranks arriving later fail on it anyway
                raise _failure(report, world, seconds, f"rank(s) {pending} did not reach the consensus (dead, or "
                                                       "stuck before compile_consensus)", None)
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        if store.check([f"{prefix}/failed"]):
            raise _failure(report, world, seconds, f"{store.get(f'{prefix}/failed').decode()} gave up waiting before "
                                                   "this rank arrived", None)
        reports = [pickle.loads(store.get(key)) for key in keys]
    except RuntimeError as err:
        why = (f"rank(s) {pending} had not reached the consensus when the group's store (its host: global rank 0) "
               "went away" if pending else "the group's store (its host: global rank 0) went away")
        raise _failure(report, world, seconds, why, err) from err
    try:
        if store.add(f"{prefix}/read", 1) == world:  # the last reader removes the call's keys
            for key in (*keys, f"{prefix}/read"):
                store.delete_key(key)
    except RuntimeError:
        pass  # every report is read; keys left behind are a few bytes in the store
    return reports


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
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise SpecError(Problem(field="group", value=type(group).__name__,
                                limit="must be a torch.distributed ProcessGroup (or None: the world)",
                                fix="pass the process group of this rank's model replica, e.g. from "
                                    "torch.distributed.new_group(ranks)"))
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ConsensusError(Problem(field="group", value=group, limit="this process is not a member of the group",
                                     fix="pass the process group of this rank's model replica"))
    report = budget_report(model, limits, budget, rank=rank, graph_pool=graph_pool)
    reports = _exchange(dist, report, group, dist.get_world_size(group), seconds)
    return finalize(model, limits, agree(reports), graph_pool=graph_pool)
