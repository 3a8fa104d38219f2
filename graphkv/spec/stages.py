"""Pipeline parallelism: which model layers each stage holds, and a model cut down to one stage.

The default partition is vLLM 0.33's ``get_pp_indices``: ``num_layers // pp`` layers per stage,
the remainder spread one each over the stages before the last, starting from the second-to-last
(the first stage holds the embedding and the last the head, so both stay light). An explicit
``partition`` (layers per stage, as ``VLLM_PP_LAYER_PARTITION="10,12,12,10"``) must list one
count per stage summing to the model's layers.

A stage keeps the whole model (:attr:`PipelineStage.model`): block size and KV-cache groups are
decided on the whole model and projected onto each stage (vLLM 0.33
``get_global_kv_cache_groups`` / ``_project_kv_cache_groups_to_worker``), so every stage pages
alike and a group may hold no layer on some stage. Pure and torch-free.

Example::

    >>> layer_partition(33, 4)
    (8, 8, 9, 8)
    >>> stage_bounds(layer_partition(32, 2), 1)
    (16, 32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec._checks import as_int, int_problems
from graphkv.spec.layers import KVSharedSpec

if TYPE_CHECKING:
    from graphkv.spec.model import ModelKV

__all__ = ["PipelineStage", "layer_partition", "model_layer_count", "stage_bounds", "stage_model"]


@attrs.frozen(kw_only=True)
class PipelineStage:
    """Stage ``rank`` of ``size``: model layers ``[start_layer, end_layer)`` of ``model`` (the whole
    model, all stages), cut by ``partition`` (layers per stage)."""

    size: int
    rank: int
    start_layer: int
    end_layer: int
    partition: tuple[int, ...]
    model: "ModelKV" = attrs.field(repr=False)

    def describe(self) -> str:
        """``pipeline stage 1 of 2: model layers 16-31 (16 of 32; partition 16,16)``."""
        total = sum(self.partition)
        return (f"pipeline stage {self.rank} of {self.size}: model layers {self.start_layer}-{self.end_layer - 1} "
                f"({self.end_layer - self.start_layer} of {total}; partition {','.join(map(str, self.partition))})")


def layer_partition(num_layers: int, pp_size: int, partition: Sequence[int] | None = None) -> tuple[int, ...]:
    """Layers per stage: ``partition`` checked, else vLLM 0.33's default. Raises :class:`SpecError`
    (field ``partition``) when ``partition`` does not list ``pp_size`` counts summing to ``num_layers``."""
    if partition is not None:
        try:
            parts = tuple(partition)
        except TypeError:
            parts = None
        if (parts is None or len(parts) != pp_size
                or any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in parts)
                or sum(parts) != num_layers):
            raise SpecError(Problem(field="partition", value=partition,
                                    limit=f"must list {pp_size} layer counts >= 0 (one per stage) summing to the "
                                          f"model's {num_layers} layers",
                                    fix=f"e.g. {list(layer_partition(num_layers, pp_size))} (the default), or leave "
                                        "partition unset"))
        return parts
    parts_list = [num_layers // pp_size] * pp_size
    for i in range(2, num_layers % pp_size + 2):  # the remainder goes to the stages before the last
        parts_list[-i] += 1
    return tuple(parts_list)


def stage_bounds(partition: Sequence[int], rank: int) -> tuple[int, int]:
    """``(start, end)`` model layers of stage ``rank`` under ``partition``."""
    start = sum(partition[:rank])
    return start, start + partition[rank]


def model_layer_count(model: ModelKV) -> int:
    """Layers in the model's stack: one past the highest model layer any entry or cacheless layer names."""
    return 1 + max(x.model_layer for x in (*model.layers, *model.cacheless))


def stage_model(model: ModelKV, pp_size: int, pp_rank: int, partition: Sequence[int] | None = None) -> ModelKV:
    """What pipeline stage ``pp_rank`` of ``pp_size`` caches: the entries and cacheless layers of its
    model layers, recording the stage and the whole model. ``pp_size == 1`` returns ``model``.

    Raises :class:`SpecError` for a bad size, rank or partition, a model that is already a stage,
    a stage with no cache-holding layer, or a KV-sharing layer whose source sits on another stage.
    """
    problems = int_problems("pp_size", pp_size, 1, "pass the pipeline-parallel size, e.g. 2")
    problems += int_problems("pp_rank", pp_rank, 0, "pass this stage's index, 0 .. pp_size - 1")
    pp_size, pp_rank = as_int(pp_size), as_int(pp_rank)  # numpy ints as Python ints (others are refused above)
    if not problems and pp_rank >= pp_size:
        problems.append(Problem(field="pp_rank", value=pp_rank, limit=f"must be < pp_size={pp_size}",
                                fix=f"pass a stage index in 0 .. {pp_size - 1}"))
    if model.pipeline is not None:
        problems.append(Problem(field="model", value=model.name,
                                limit=f"is already {model.pipeline.describe()}",
                                fix="stage the whole model (ModelKV.stage on the model before staging)"))
    if problems:
        raise SpecError(*problems)
    total = model_layer_count(model)
    parts = layer_partition(total, pp_size, partition)
    if pp_size == 1:
        return model
    start, end = stage_bounds(parts, pp_rank)
    layers = tuple(x for x in model.layers if start <= x.model_layer < end)
    cacheless = tuple(x for x in model.cacheless if start <= x.index < end)
    if not layers:
        held_text = f"model layers {start}-{end - 1}, none of which holds a cache" if end > start else "no model layer"
        raise SpecError(Problem(field="partition" if partition is not None else "pp_size",
                                value=list(parts) if partition is not None else pp_size,
                                limit=f"leaves stage {pp_rank} of {pp_size} with {held_text} (partition {list(parts)})",
                                fix="use a partition that gives every stage a cache-holding layer, or fewer stages"))
    held = {x.name for x in layers}
    for decl in cacheless:
        if isinstance(decl.spec, KVSharedSpec) and decl.spec.source not in held:
            raise SpecError(Problem(field="partition", value=list(parts),
                                    limit=f"puts {decl.name} on stage {pp_rank} but the layer whose KV cache it reads, "
                                          f"{decl.spec.source}, on another stage",
                                    fix="use a partition that keeps KV-sharing layers on their source's stage"))
    stage = PipelineStage(size=pp_size, rank=pp_rank, start_layer=start, end_layer=end, partition=parts, model=model)
    return attrs.evolve(model, layers=layers, cacheless=cacheless, pipeline=stage, notes=(*model.notes, stage.describe()))
