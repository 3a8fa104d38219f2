"""The agreed result: one plan per pipeline stage with the agreed ``num_blocks`` and ``max_model_len``.

:func:`finalize` turns an :class:`~graphkv.distributed.agreement.Agreement` into a
:class:`ConsensusPlan` from any rank's model: every stage's plan is compiled from the whole model
(as sharded for ``tp``) with ``num_blocks`` pinned to the agreed count and ``max_model_len`` to the
agreed length, so no rank's own budget enters it and every rank builds the same object. The
tensor-parallel ranks of a stage share that stage's plan.
"""

from __future__ import annotations

from typing import Any

import attrs

from graphkv.distributed.agreement import Agreement, first_difference
from graphkv.distributed.reports import Fingerprint, limits_fingerprint, model_fingerprint
from graphkv.errors import Problem, SpecError
from graphkv.plan import Plan, compile_plan
from graphkv.plan.graph_pool import GraphPoolModel
from graphkv.spec.budget import format_bytes
from graphkv.spec.limits import Limits
from graphkv.spec.model import ModelKV

__all__ = ["ConsensusPlan", "RankFigures", "finalize"]


@attrs.frozen(kw_only=True)
class RankFigures:
    """One rank's own figures (from its own budget), before the agreement."""

    rank: int
    tp_rank: int
    pp_rank: int
    model_layers: tuple[int, int]  # first and last model layer of its stage
    budget_bytes: int
    pool_bytes_per_block: int
    num_blocks: int
    max_model_len: int


@attrs.frozen(kw_only=True)
class ConsensusPlan:
    """What every rank of one model replica agreed on, identical on every rank.

    ``stages[k]`` is the plan of pipeline stage ``k`` (one stage without pipeline parallelism),
    shared by the stage's tensor-parallel ranks; all of them have ``num_blocks`` pages and serve
    ``max_model_len`` tokens. ``ranks`` lists each rank's own figures, and the reasons say which
    rank set each number. A stage's plan has ``limits.num_blocks_override`` and ``max_model_len``
    set to the agreed numbers, so a runtime built from it allocates exactly the agreed pool.
    """

    tensor_parallel_size: int
    pipeline_parallel_size: int
    num_blocks: int
    max_model_len: int
    num_blocks_reason: str
    max_model_len_reason: str
    ranks: tuple[RankFigures, ...]
    stages: tuple[Plan, ...]
    kv_tp_replicas: int = 1  # consecutive tensor-parallel ranks with identical caches (ModelKV.kv_tp_replicas)
    agreed_model: Fingerprint = attrs.field(default=(), repr=False)  # model_fingerprint of the agreed model

    def plan_for(self, model: ModelKV) -> Plan:
        """The plan of the stage ``model`` (this rank's shard / stage) belongs to. Raises :class:`SpecError` for
        a model of another parallel layout or (where the agreed model is recorded) another model."""
        fix = "pass this rank's ModelKV: the whole model agreed on, .shard(tp, tp_rank).stage(pp, pp_rank)"
        if not isinstance(model, ModelKV):
            raise SpecError(Problem(field="model", value=type(model).__name__, limit="must be a ModelKV", fix=fix))
        layout = (model.tensor_parallel_size, model.pipeline_parallel_size)
        if layout != (self.tensor_parallel_size, self.pipeline_parallel_size):
            raise SpecError(Problem(field="model", value=f"tp={layout[0]} x pp={layout[1]}",
                                    limit=f"the ranks agreed on tp={self.tensor_parallel_size} x "
                                          f"pp={self.pipeline_parallel_size}", fix=fix))
        if self.agreed_model:
            _check_same(model_fingerprint(model), self.agreed_model, "model", "the model the ranks agreed on", fix)
        return self.stages[model.pipeline_rank]

    def to_dict(self, *, stages: bool = True) -> dict[str, Any]:
        """JSON-ready: the agreed numbers, every rank's figures and (``stages``) each stage's ``Plan.to_dict()``."""
        data: dict[str, Any] = {
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "num_blocks": self.num_blocks, "num_blocks_reason": self.num_blocks_reason,
            "max_model_len": self.max_model_len, "max_model_len_reason": self.max_model_len_reason,
            "kv_tp_replicas": self.kv_tp_replicas,
            "ranks": [{**attrs.asdict(r), "model_layers": list(r.model_layers)} for r in self.ranks],
        }
        if stages:
            data["stages"] = [plan.to_dict() for plan in self.stages]
        return data


def _figures(agreement: Agreement) -> tuple[RankFigures, ...]:
    rows = []
    for r in agreement.reports:
        assert r.plan is not None
        rows.append(RankFigures(rank=r.rank, tp_rank=r.tp_rank, pp_rank=r.pp_rank, model_layers=r.plan.model_layers,
                                budget_bytes=r.plan.budget_bytes, pool_bytes_per_block=r.plan.pool_bytes_per_block,
                                num_blocks=r.plan.num_blocks, max_model_len=r.plan.max_model_len))
    return tuple(rows)


def _reasons(agreement: Agreement, limits: Limits) -> tuple[str, str]:
    n = len(agreement.reports)
    fewest = agreement.report(agreement.num_blocks_rank)
    assert fewest.plan is not None
    blocks = (f"the smallest of {n} ranks' own counts: {fewest.place} has {format_bytes(fewest.plan.budget_bytes)} "
              f"for {fewest.plan.pool_bytes_per_block} B per page index ({fewest.plan.num_blocks_reason})")
    if not limits.is_auto_len:
        return blocks, f"max_model_len={agreement.max_model_len} set by the user; fits every rank's {agreement.num_blocks} pages"
    shortest = agreement.report(agreement.max_model_len_rank)
    assert shortest.plan is not None
    return blocks, f"the shortest of {n} ranks' auto-fit lengths: {shortest.place}: {shortest.plan.max_model_len_reason}"


def _pinned(plan: Plan, num_blocks_reason: str, max_model_len_reason: str, note: str, from_override: bool) -> Plan:
    capacity = attrs.evolve(plan.capacity, num_blocks_reason=num_blocks_reason,
                            max_model_len_reason=max_model_len_reason, from_override=from_override)
    return attrs.evolve(plan, capacity=capacity, notes=(*plan.notes, note))


def _check_same(given: Fingerprint, agreed: Fingerprint, field: str, what: str, fix: str) -> None:
    diff = first_difference(given, agreed)
    if diff is not None:
        name, value_given, value_agreed = diff
        raise SpecError(Problem(field=f"{field} ({name})", value=value_given,
                                limit=f"differs from {what}: {value_agreed}", fix=fix))


def finalize(model: ModelKV, limits: Limits | None, agreement: Agreement, *,
             graph_pool: GraphPoolModel | None = None, fingerprint: Fingerprint | None = None) -> ConsensusPlan:
    """Every stage's plan with the agreed ``num_blocks`` and ``max_model_len``, built from ``model``
    (any rank's: each keeps the whole model), its graph memory from ``graph_pool`` (the ranks'
    calibration; ``None``: the uncalibrated estimate). Pure; the same on every rank. ``model`` and
    ``limits`` must be those the ranks agreed on (:class:`SpecError` naming the first difference);
    ``fingerprint``: ``model_fingerprint(model)`` where the caller has it."""
    if not isinstance(model, ModelKV):
        raise SpecError(Problem(field="model", value=type(model).__name__, limit="must be a ModelKV",
                                fix="pass the model the ranks agreed on (any rank's shard / stage)"))
    limits = Limits() if limits is None else limits
    if not isinstance(limits, Limits):
        raise SpecError(Problem(field="limits", value=type(limits).__name__, limit="must be a graphkv.Limits or None",
                                fix="pass the limits the ranks agreed on"))
    agreed = agreement.reports[0]
    fingerprint = model_fingerprint(model) if fingerprint is None else fingerprint
    _check_same(fingerprint, agreed.model, "model", "the model the ranks agreed on",
                "finalize with the model the ranks reported (any rank's shard / stage of it)")
    _check_same(limits_fingerprint(limits), agreed.limits, "limits", "the limits the ranks agreed on",
                "finalize with the limits the ranks planned under")
    whole = model.whole
    pp = agreement.pipeline_parallel_size
    partition = model.pipeline.partition if model.pipeline is not None else None
    pinned = attrs.evolve(limits, num_blocks_override=agreement.num_blocks, max_model_len=agreement.max_model_len)
    blocks_reason, len_reason = _reasons(agreement, limits)
    note = (f"agreed by {len(agreement.reports)} ranks (tp={agreement.tensor_parallel_size} x pp={pp}): "
            f"num_blocks={agreement.num_blocks}, max_model_len={agreement.max_model_len}")
    from_override = limits.num_blocks_override is not None  # the user fixed the page count, not a memory budget
    stages = tuple(_pinned(compile_plan(whole.stage(pp, k, partition), pinned, None, graph_pool=graph_pool),
                           blocks_reason, len_reason, note, from_override) for k in range(pp))
    return ConsensusPlan(tensor_parallel_size=agreement.tensor_parallel_size, pipeline_parallel_size=pp,
                         num_blocks=agreement.num_blocks, max_model_len=agreement.max_model_len,
                         num_blocks_reason=blocks_reason, max_model_len_reason=len_reason,
                         ranks=_figures(agreement), stages=stages, kv_tp_replicas=whole.kv_tp_replicas,
                         agreed_model=fingerprint)
