"""What each rank tells the others before they agree: its place, its model, its limits and its own plan.

A :class:`RankReport` is plain data (ints, strings and tuples of them), small and picklable, so the
process group's store carries it (:func:`~graphkv.distributed.compile_consensus`) and the
single-process simulation builds the same thing. A rank whose own plan fails reports the error instead
of raising, so every rank still reaches the exchange and all of them raise the same
:class:`~graphkv.errors.ConsensusError`.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

from graphkv.errors import GraphkvError, Problem, SpecError
from graphkv.plan import Plan, compile_plan
from graphkv.plan.graph_pool import GraphPoolModel
from graphkv.spec.budget import Budget
from graphkv.spec.layers import FullAttentionSpec, PromotedLocalSpec
from graphkv.spec.limits import Limits
from graphkv.spec.model import ModelKV
from graphkv.spec.stages import model_layer_count

__all__ = ["LocalPlan", "RankReport", "budget_report", "graph_pool_fingerprint", "limits_fingerprint", "local_plan",
           "model_fingerprint", "rank_report"]

Fingerprint = tuple[tuple[str, str], ...]
"""``(field, value)`` pairs compared field by field, so a mismatch names the field."""


def model_fingerprint(model: ModelKV) -> Fingerprint:
    """The whole model (every stage) as this rank shards it: one entry per cache entry and cacheless layer."""
    whole = model.whole
    rows = [("model.max_position_embeddings", str(whole.max_position_embeddings)),
            ("model.tensor_parallel_size", str(whole.tensor_parallel_size)),
            ("model.layers (count)", str(len(whole.layers))), ("model.cacheless (count)", str(len(whole.cacheless)))]
    rows += [(f"model.layers[{x.name}]", f"{x.spec.describe()} on {x.backend.name} {x.backend.describe_sizes()} "
                                          f"{x.backend.cudagraph_support.name} (index {x.index}, layer "
                                          f"{x.model_layer}, {x.tp_replicas} replica(s))") for x in whole.layers]
    rows.append(("model.gpu_arch", str(whole.gpu_arch)))
    rows += [(f"model.cacheless[{x.name}]", f"{x.spec.describe()} (index {x.index})") for x in whole.cacheless]
    return tuple(rows)


def graph_pool_fingerprint(graph_pool: GraphPoolModel | None) -> Fingerprint:
    """The graph-memory calibration a rank plans with, field by field (``None``: the uncalibrated estimate): ranks
    that reserve different graph memory would agree on stages whose ledgers differ."""
    if graph_pool is None:
        return (("graph_pool", "the uncalibrated estimate"),)
    return tuple((f"graph_pool.{name}", str(value)) for name, value in attrs.asdict(graph_pool).items())


def limits_fingerprint(limits: Limits) -> Fingerprint:
    """Every limit as ``("limits.<field>", value)``."""
    return tuple((f"limits.{name}", str(getattr(value, "value", value)))
                 for name, value in attrs.asdict(limits, recurse=False).items())


def _stage_layers(model: ModelKV) -> tuple[int, int]:
    if model.pipeline is not None:
        return model.pipeline.start_layer, model.pipeline.end_layer - 1
    return 0, model_layer_count(model) - 1


def _shape(plan: Plan) -> Fingerprint:
    """How the plan pages, which every rank of one stage must share (and every stage, but for layers)."""
    rows = [("block_size", str(plan.block_size)), ("mamba_block_size", str(plan.block.mamba_block_size)),
            ("kernel_block_sizes", str(plan.kernel_block_sizes)), ("groups (count)", str(len(plan.groups)))]
    rows += [(f"groups[{g.index}]", f"{_paged_as(g.spec)} block {g.block_size} kernel {g.kernel_block_size} page "
                                    f"{g.page_size_bytes} B") for g in plan.groups]
    return tuple(rows)


def _paged_as(spec: object) -> str:
    """How a group's layers are paged: a local layer promoted to full attention pages as full attention (a stage
    whose group starts at a promoted sliding layer pages like one that starts at a full one)."""
    if isinstance(spec, PromotedLocalSpec):
        return FullAttentionSpec.describe(spec)
    return spec.describe()  # type: ignore[attr-defined]


@attrs.frozen(kw_only=True)
class LocalPlan:
    """A rank's own plan, from its own budget: the figures the agreement takes the minimum of."""

    num_blocks: int
    max_model_len: int
    num_blocks_reason: str
    max_model_len_reason: str
    pool_bytes_per_block: int
    budget_bytes: int  # the KV budget the rank planned with (num_blocks x pool bytes when it had none)
    shape: Fingerprint  # block size, kernel block sizes, groups
    model_layers: tuple[int, int]  # first and last model layer of the rank's stage (every layer without stages)
    group_layers: tuple[tuple[int, ...], ...]  # each group's layers on this rank


@attrs.frozen(kw_only=True)
class RankReport:
    """One rank's report: where it sits, what it plans, and its plan or the error its plan raised."""

    rank: int
    tp_size: int
    tp_rank: int
    pp_size: int
    pp_rank: int
    model: Fingerprint
    limits: Fingerprint
    plan: LocalPlan | None
    error: str | None = None  # "<ErrorClass>: <message>" when the rank's own plan failed
    graph_pool: Fingerprint = ()  # the graph-memory calibration the rank plans with (graph_pool_fingerprint)

    @property
    def place(self) -> str:
        """``rank 3 (tp 1, pp 1)``."""
        return f"rank {self.rank} (tp {self.tp_rank}, pp {self.pp_rank})"


def local_plan(plan: Plan, model: ModelKV) -> LocalPlan:
    """The figures of ``plan`` (of ``model``) a rank reports."""
    return LocalPlan(num_blocks=plan.num_blocks, max_model_len=plan.max_model_len,
                     num_blocks_reason=plan.capacity.num_blocks_reason,
                     max_model_len_reason=plan.capacity.max_model_len_reason,
                     pool_bytes_per_block=plan.pool_bytes_per_block, budget_bytes=plan.ledger.budget_bytes, shape=_shape(plan),
                     model_layers=_stage_layers(model),
                     group_layers=tuple(g.layers for g in plan.groups))


def rank_report(model: ModelKV, limits: Limits | None, *, rank: int,
                compile_local: Callable[[], Plan], fingerprint: Fingerprint | None = None,
                graph_pool: GraphPoolModel | None = None) -> RankReport:
    """The report of ``rank``: ``compile_local()`` plans this rank from its own budget (it must return a
    :class:`Plan` of ``model``); a :class:`GraphkvError` it raises is reported, not raised.
    ``fingerprint``: ``model_fingerprint(model)`` when the caller has it (a simulation of many ranks
    computes it once per shard); ``graph_pool``: the graph-memory calibration the plan was made with
    (every rank must use the same)."""
    limits = Limits() if limits is None else limits
    if not isinstance(model, ModelKV) or not isinstance(limits, Limits):
        wrong = "model" if not isinstance(model, ModelKV) else "limits"
        error = SpecError(Problem(field=wrong, value=type(model if wrong == "model" else limits).__name__,
                                  limit=f"must be a {'ModelKV' if wrong == 'model' else 'Limits'}",
                                  fix="pass this rank's ModelKV (ModelKV.shard / ModelKV.stage) and graphkv.Limits"))
        return RankReport(rank=rank, tp_size=0, tp_rank=0, pp_size=0, pp_rank=0, model=(), limits=(), plan=None,
                          error=f"SpecError: {error}")
    common: dict[str, Any] = dict(rank=rank, tp_size=model.tensor_parallel_size, tp_rank=model.tensor_parallel_rank,
                                  pp_size=model.pipeline_parallel_size, pp_rank=model.pipeline_rank,
                                  model=model_fingerprint(model) if fingerprint is None else fingerprint,
                                  limits=limits_fingerprint(limits), graph_pool=graph_pool_fingerprint(graph_pool))
    try:
        plan = compile_local()
        _check_local(plan, model)
    except GraphkvError as err:
        return RankReport(plan=None, error=f"{type(err).__name__}: {err}", **common)
    return RankReport(plan=local_plan(plan, model), **common)


def _kv_layers(layers: Any) -> tuple[tuple[str, Any, Any], ...]:
    return tuple((d.name, getattr(d.spec, "num_kv_heads", None), getattr(d.spec, "head_size", None)) for d in layers)


def _check_local(plan: object, model: ModelKV) -> None:
    """Refuse a rank's own plan that is not a :class:`Plan` of ``model`` (its layers, heads per layer and
    head sizes): agreeing on another model's pages (the unsharded model's, another stage's) would be silently
    wrong."""
    fix = "compile_local must return graphkv.compile(rank_model, ...) of the rank model it is given"
    if not isinstance(plan, Plan):
        raise SpecError(Problem(field="compile_local()", value=type(plan).__name__, limit="must return a Plan",
                                fix=fix))
    planned, expected = _kv_layers(plan.layers), _kv_layers(model.layers)
    if planned != expected:
        first = next((i for i, (a, b) in enumerate(zip(planned, expected)) if a != b),
                     min(len(planned), len(expected)))

        def at(rows: tuple[tuple[str, Any, Any], ...]) -> str:
            if first >= len(rows):
                return "<absent>"
            name, heads, size = rows[first]
            return f"{name}: {heads} KV heads x {size}"

        raise SpecError(Problem(field="compile_local()", value=f"a plan of {len(planned)} cache layers",
                                limit=f"must plan this rank's model ({len(expected)} cache layers); first difference "
                                      f"at layer {first}: the plan's {at(planned)}, the model's {at(expected)}",
                                fix=fix))


def budget_report(model: ModelKV, limits: Limits | None, budget: Budget | None, *, rank: int,
                  fingerprint: Fingerprint | None = None, graph_pool: GraphPoolModel | None = None) -> RankReport:
    """:func:`rank_report` with this rank's plan compiled by :func:`graphkv.compile` from ``budget``
    (its graph memory from ``graph_pool``, ``None``: the uncalibrated estimate)."""
    return rank_report(model, limits, rank=rank,
                       compile_local=lambda: compile_plan(model, limits, budget, graph_pool=graph_pool),
                       fingerprint=fingerprint, graph_pool=graph_pool)
