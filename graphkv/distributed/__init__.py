"""Multi-GPU plans: tensor- and pipeline-parallel ranks that agree on one plan.

Each rank plans what it caches (:meth:`ModelKV.shard <graphkv.spec.model.ModelKV.shard>`,
:meth:`ModelKV.stage <graphkv.spec.model.ModelKV.stage>`) from its own budget; the ranks agree on
the smallest ``num_blocks`` and the shortest auto-fit ``max_model_len``, and refuse mismatched
models, limits or paging (:mod:`.agreement`). :func:`compile_consensus` does it over
``torch.distributed`` (gloo or nccl); :func:`simulate_consensus` in one process (``graphkv plan
--tp N --pp M``). Both return the same :class:`ConsensusPlan`.

Only :func:`compile_consensus` imports torch (when called); everything else here is pure planning.
Out of scope: context parallelism and data-parallel attention (each data-parallel replica agrees
within itself).
"""

from __future__ import annotations

from graphkv.distributed.agreement import Agreement, agree
from graphkv.distributed.consensus import compile_consensus
from graphkv.distributed.plans import ConsensusPlan, RankFigures, finalize
from graphkv.distributed.reports import RankReport, budget_report, rank_report
from graphkv.distributed.simulate import rank_models, simulate_consensus

__all__ = ["Agreement", "ConsensusPlan", "RankFigures", "RankReport", "agree", "budget_report", "compile_consensus",
           "finalize", "rank_models", "rank_report", "simulate_consensus"]

