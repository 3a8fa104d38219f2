"""Tensor parallelism: what one rank of ``tp`` caches for a model whose specs describe all heads.

Each layer spec knows how it splits (:meth:`per_rank` of the specs, :mod:`graphkv.spec.split_rules`):
attention KV heads are divided, or replicated one per rank when fewer than ``tp``; MLA latents and
indexer keys are kept whole on every rank; recurrent states split by their
:class:`~graphkv.spec.layers.StateSplit`. The ranks of one tensor-parallel group cache the same
shapes (which heads differ, not how many), so their plans are identical.

Out of scope: context parallelism (DCP / PCP: KV split along tokens) and data-parallel attention
(each DP rank its own requests) — graphkv plans the tensor- and pipeline-parallel ranks of one
model replica.

Example::

    >>> from graphkv import FullAttentionSpec, ModelKV
    >>> full = ModelKV.from_specs("m", [(FullAttentionSpec(num_kv_heads=2, head_size=128), "flash_attn")])
    >>> rank = shard_model(full, 4, 3)
    >>> rank.layers[0].spec.num_kv_heads, rank.layers[0].tp_replicas, rank.tensor_parallel_rank
    (1, 2, 3)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec._checks import as_int, int_problems
from graphkv.spec.layers import RankSpec

if TYPE_CHECKING:
    from graphkv.spec.model import ModelKV

__all__ = ["kv_tp_replicas", "shard_model"]


def _relabel(problem: Problem, layer_name: str) -> Problem:
    """A spec-level problem (``MambaSpec.tp_split``, ``heads``) named after the layer it came from;
    config fields (``config.<field>``) keep their name."""
    if problem.field.startswith("config."):
        return problem
    tail = problem.field.split(".", 1)[-1]
    return attrs.evolve(problem, field=f"{layer_name}.{tail}")


def shard_model(model: ModelKV, tp_size: int, tp_rank: int) -> ModelKV:
    """What tensor-parallel rank ``tp_rank`` of ``tp_size`` caches for ``model`` (whose specs describe
    every head, ``tensor_parallel_size == 1``). A pipeline stage is sharded with its whole model.

    Raises :class:`SpecError` naming every head count ``tp_size`` cannot split (once per distinct
    spec), a state without a ``tp_split``, a bad size or rank, or a model already sharded.
    """
    problems = int_problems("tp_size", tp_size, 1, "pass the tensor-parallel size, e.g. 2")
    problems += int_problems("tp_rank", tp_rank, 0, "pass this rank's index, 0 .. tp_size - 1")
    tp_size, tp_rank = as_int(tp_size), as_int(tp_rank)  # numpy ints as Python ints (others are refused above)
    if not problems and tp_rank >= tp_size:
        problems.append(Problem(field="tp_rank", value=tp_rank, limit=f"must be < tp_size={tp_size}",
                                fix=f"pass a rank in 0 .. {tp_size - 1}"))
    if model.tensor_parallel_size != 1:
        problems.append(Problem(field="model", value=model.name,
                                limit=f"is already sharded for tp={model.tensor_parallel_size}",
                                fix="shard the unsharded model (tp=1, every head), e.g. ModelKV.from_hf_config(config)"))
    if problems:
        raise SpecError(*problems)
    if tp_size == 1:
        return model
    per_spec: dict[Any, RankSpec] = {}
    for layer in model.layers:
        if layer.spec in per_spec:
            continue
        try:
            per_spec[layer.spec] = layer.spec.per_rank(tp_size)
        except SpecError as err:
            problems.extend(_relabel(p, layer.name) for p in err.problems)
    if problems:
        raise SpecError(*problems)
    layers = tuple(attrs.evolve(layer, spec=per_spec[layer.spec].spec, tp_replicas=per_spec[layer.spec].replicas)
                   for layer in model.layers)
    pipeline = model.pipeline
    if pipeline is not None:
        pipeline = attrs.evolve(pipeline, model=shard_model(pipeline.model, tp_size, tp_rank))
    return attrs.evolve(model, layers=layers, tensor_parallel_size=tp_size, tensor_parallel_rank=tp_rank,
                        pipeline=pipeline)


def kv_tp_replicas(model: ModelKV) -> int:
    """Consecutive tensor-parallel ranks whose caches are identical for every layer: the gcd over
    layers of each layer's replicas (MLA latents and indexer keys: every rank; KV heads fewer than
    ``tp``: ``tp / heads``; states and split heads: 1).

    vLLM 0.33's ``kv_cache_groups_tp_replicas`` counts only latent caches (their specs declare
    ``max_tp_shards=1``; other attention specs leave it unset and count 1), so for a model with
    replicated KV heads vLLM reports 1 where this reports the replication.
    """
    return math.gcd(*(layer.tp_replicas for layer in model.layers))
