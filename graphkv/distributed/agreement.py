"""The agreement rule: from every rank's report to one ``num_blocks`` and one ``max_model_len``.

One pure function, :func:`agree`, used by :func:`~graphkv.distributed.compile_consensus` (after the
reports are exchanged over ``torch.distributed``) and by ``graphkv plan --tp N --pp M`` (which
builds every rank's report in one process), so the two cannot disagree. In order:

1. a rank whose own plan failed fails them all, naming the rank and its error;
2. the ranks must be one model replica: the same ``tp`` and ``pp``, ``tp x pp`` of them, each
   tensor-parallel rank of each stage exactly once;
3. every rank must plan the same whole model (as sharded for ``tp``) under the same limits, and
   page it alike (block size, kernel block sizes, groups); tensor-parallel ranks of one stage also
   hold the same layers. A mismatch names the field and the ranks that differ from rank 0;
4. ``num_blocks`` is the smallest rank's (vLLM 0.33 ``get_kv_cache_configs``: every worker's block
   count becomes the minimum), and ``max_model_len`` the smallest rank's auto-fit length (every
   stage needs the same pages per request, so that length fits every rank).
"""

from __future__ import annotations

from itertools import zip_longest
from typing import Callable, Sequence

import attrs

from graphkv.distributed.reports import Fingerprint, RankReport
from graphkv.errors import ConsensusError, Problem, SpecError

__all__ = ["Agreement", "agree", "first_difference"]

_SAME_MODEL_FIX = ("build every rank's model from the same config and sizes (ModelKV.from_hf_config(config)"
                   ".shard(tp, tp_rank).stage(pp, pp_rank)) and pass the same Limits on every rank")


@attrs.frozen(kw_only=True)
class Agreement:
    """What the ranks agreed on, and which rank set each number."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    num_blocks: int
    num_blocks_rank: int  # the (lowest) rank whose own plan had the fewest pages
    max_model_len: int
    max_model_len_rank: int  # the (lowest) rank whose own plan had the shortest max_model_len
    reports: tuple[RankReport, ...]  # by rank

    def report(self, rank: int) -> RankReport:
        """The report of ``rank``."""
        return self.reports[rank]


def _failed(reports: Sequence[RankReport]) -> list[Problem]:
    return [Problem(field="ranks", value=[r.rank], limit=f"{r.place} could not plan its own cache: {r.error}",
                    fix="fix that rank's budget, model or limits (every rank raises this, so none waits for it)")
            for r in reports if r.error is not None]


def _topology(reports: Sequence[RankReport]) -> list[Problem]:
    sizes = {(r.tp_size, r.pp_size) for r in reports}
    if len(sizes) > 1:
        by_rank = {r.rank: f"tp={r.tp_size} pp={r.pp_size}" for r in reports}
        return [Problem(field="tensor_parallel_size / pipeline_parallel_size", value=by_rank,
                        limit="the ranks' models are sharded and staged for different sizes", fix=_SAME_MODEL_FIX)]
    ((tp, pp),) = sizes
    if tp * pp != len(reports):
        return [Problem(field="group", value=f"{len(reports)} ranks",
                        limit=f"the models are sharded for tp={tp} x pp={pp} = {tp * pp} ranks but {len(reports)} "
                              "ranks joined",
                        fix="call compile_consensus on exactly the tp x pp ranks of one model replica (data-parallel "
                            "replicas agree separately)")]
    seen: dict[tuple[int, int], int] = {}
    for r in reports:
        other = seen.setdefault((r.tp_rank, r.pp_rank), r.rank)
        if other != r.rank:
            return [Problem(field="tensor_parallel_rank / pipeline_rank", value=[other, r.rank],
                            limit=f"ranks {other} and {r.rank} both hold tp rank {r.tp_rank} of stage {r.pp_rank}",
                            fix="give each rank its own ModelKV.shard(tp, tp_rank).stage(pp, pp_rank)")]
    return []


def first_difference(a: Fingerprint, b: Fingerprint) -> tuple[str, str, str] | None:
    """The first field where ``a`` and ``b`` differ, with both values."""
    if a is b or a == b:  # one C-level comparison when nothing differs (every rank, usually)
        return None
    for left, right in zip_longest(a, b, fillvalue=("<absent>", "<absent>")):
        if left != right:
            field = left[0] if left[0] != "<absent>" else right[0]
            value_a = left[1] if left[0] == field else "<absent>"
            value_b = right[1] if right[0] == field else "<absent>"
            return field, value_a, value_b
    return None


def _mismatch(reports: Sequence[RankReport], key: Callable[[RankReport], Fingerprint], what: str) -> list[Problem]:
    """Compare every report to the first of ``reports``; one problem naming the first differing field."""
    first = reports[0]
    # by fingerprint object (ranks of a simulation share one), each kept alive here: a key that builds a new
    # tuple per call would otherwise free it, and the next rank's tuple could reuse its id
    differences: dict[int, tuple[Fingerprint, tuple[str, str, str] | None]] = {}

    def difference(r: RankReport) -> tuple[str, str, str] | None:
        theirs = key(r)
        if id(theirs) not in differences:
            differences[id(theirs)] = (theirs, first_difference(key(first), theirs))
        return differences[id(theirs)][1]

    for r in reports[1:]:
        diff = difference(r)
        if diff is None:
            continue
        field, value_a, value_b = diff
        others = [x.rank for x in reports[1:] if difference(x) is not None]
        return [Problem(field=field, value=f"rank {first.rank}: {value_a}; rank {r.rank}: {value_b}",
                        limit=f"differs between rank {first.rank} and rank(s) {others}: {what}",
                        fix=_SAME_MODEL_FIX)]
    return []


def _checked(problems: list[Problem]) -> None:
    if problems:
        raise ConsensusError(*problems)


def _checked_reports(reports: Sequence[RankReport]) -> tuple[RankReport, ...]:
    """``reports`` sorted by rank; a :class:`SpecError` unless they are RankReports, one per rank 0 .. n - 1."""
    fix = "pass one RankReport per rank of the group (budget_report / rank_report), ranks 0 .. n - 1"
    if isinstance(reports, (str, bytes)) or not isinstance(reports, Sequence) or not reports:
        given = [] if isinstance(reports, (list, tuple)) else type(reports).__name__
        raise SpecError(Problem(field="reports", value=given, limit="must be a non-empty sequence of RankReport",
                                fix=fix))
    wrong = [i for i, r in enumerate(reports) if not isinstance(r, RankReport)]
    if wrong:
        raise SpecError(Problem(field=f"reports[{wrong[0]}]", value=type(reports[wrong[0]]).__name__,
                                limit="must be a RankReport", fix=fix))
    ranks = sorted(r.rank for r in reports)
    if ranks != list(range(len(reports))):
        raise SpecError(Problem(field="reports (ranks)", value=ranks,
                                limit=f"must be ranks 0 .. {len(reports) - 1}, each once", fix=fix))
    return tuple(sorted(reports, key=lambda r: r.rank))


def agree(reports: Sequence[RankReport]) -> Agreement:
    """Agree on one plan from every rank's report (see the module docstring). Pure and deterministic:
    every rank that runs it on the same reports gets the same result or raises the same
    :class:`ConsensusError`."""
    reports = _checked_reports(reports)
    _checked(_failed(reports))
    _checked(_topology(reports))
    _checked(_mismatch(reports, lambda r: r.model, "every rank must plan the same model, sharded alike"))
    _checked(_mismatch(reports, lambda r: r.limits, "every rank must plan under the same limits"))
    _checked(_mismatch(reports, lambda r: r.graph_pool, "every rank must reserve graph memory from the same "
                                                        "calibration (graph_pool)"))
    _checked(_mismatch(reports, lambda r: r.plan.shape, "every rank must page alike (block size, kernel block sizes, "
                                                        "groups)"))  # type: ignore[union-attr]
    for stage in range(reports[0].pp_size):
        members = [r for r in reports if r.pp_rank == stage]
        _checked(_mismatch(members, lambda r: tuple(("group layers", str(g)) for g in r.plan.group_layers),
                           f"the tensor-parallel ranks of stage {stage} must hold the same layers"))
    plans = [(r.plan, r.rank) for r in reports]
    fewest = min(plans, key=lambda p: (p[0].num_blocks, p[1]))  # type: ignore[union-attr]
    shortest = min(plans, key=lambda p: (p[0].max_model_len, p[1]))  # type: ignore[union-attr]
    return Agreement(tensor_parallel_size=reports[0].tp_size, pipeline_parallel_size=reports[0].pp_size,
                     num_blocks=fewest[0].num_blocks, num_blocks_rank=fewest[1],  # type: ignore[union-attr]
                     max_model_len=shortest[0].max_model_len, max_model_len_rank=shortest[1],  # type: ignore[union-attr]
                     reports=reports)
