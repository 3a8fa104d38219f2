"""A model declaration: every cache entry with its spec and backend, and the layers that hold none."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec._checks import Checker, as_int
from graphkv.spec.backends import Backend, get_backend
from graphkv.spec.layers import (ChunkedLocalSpec, FullAttentionSpec, IndexerKeySpec, KVSharedSpec, LayerSpec,
                                 MambaSpec, MLASpec, NoCacheSpec, SlidingWindowSpec)
from graphkv.spec.stages import PipelineStage

__all__ = ["CachelessDecl", "LayerDecl", "ModelKV"]

_LAYER_SPEC_TYPES = (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalSpec, MLASpec, IndexerKeySpec, MambaSpec)
_CACHELESS_SPEC_TYPES = (KVSharedSpec, NoCacheSpec)


@attrs.frozen(kw_only=True)
class LayerDecl:
    """One cache entry of the model: its index, name, KV spec and backend.

    ``index`` is unique per entry and is what groups and slots list; ``layer_index`` is the model
    layer the entry belongs to when a layer holds more than one cache (Falcon-H1's attention and
    Mamba state, DeepSeek-V3.2's latent and indexer keys) — ``None`` means ``index``.
    """

    index: int
    name: str
    spec: LayerSpec
    backend: Backend = attrs.field(converter=get_backend)
    layer_index: int | None = None
    tp_replicas: int = 1  # consecutive tensor-parallel ranks holding this same cache (set by ModelKV.shard)

    @property
    def model_layer(self) -> int:
        """The position of the entry's layer in the model's stack."""
        return self.index if self.layer_index is None else self.layer_index


@attrs.frozen(kw_only=True)
class CachelessDecl:
    """A model layer that holds no cache of its own (a KV-shared attention layer, an MLP block)."""

    index: int
    name: str
    spec: "KVSharedSpec | NoCacheSpec"

    @property
    def model_layer(self) -> int:
        """The position of the layer in the model's stack."""
        return self.index


def _tuple(value: Any) -> Any:
    try:
        return tuple(value)
    except TypeError:
        return value


@attrs.frozen(kw_only=True)
class ModelKV:
    """What one GPU caches for a model: the whole model, or one tensor-parallel rank and/or
    pipeline stage of it.

    ``layers`` lists the cache entries (layers that hold a cache); ``cacheless`` the layers that
    hold none, declared so a plan can say what every layer became (optional). ``max_position_embeddings``
    caps ``max_model_len``; ``tensor_parallel_size`` / ``tensor_parallel_rank`` record the sharding
    the specs were built for (:meth:`shard`); ``pipeline`` the stage the layers are (:meth:`stage`;
    ``None``: every layer); ``hidden_size`` sizes the estimated activations of captured graphs;
    ``notes`` (e.g. which config reader built the model) are copied into the plan; ``gpu_arch`` the GPU
    architecture whose backends the layers run (``"sm_80"``), when it was named (:meth:`from_hf_config`'s ``gpu``;
    ``None``: an H100's, sm_90, assumed, as the built-in backends are), which the plan's cuBLAS workspaces follow
    and a plan for another GPU names in its notes.
    """

    name: str
    layers: tuple[LayerDecl, ...] = attrs.field(converter=_tuple)
    max_position_embeddings: int | None = attrs.field(default=None, converter=as_int)
    tensor_parallel_size: int = attrs.field(default=1, converter=as_int)
    hidden_size: int | None = attrs.field(default=None, converter=as_int)
    cacheless: tuple[CachelessDecl, ...] = attrs.field(default=(), converter=_tuple)
    notes: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    tensor_parallel_rank: int = 0
    pipeline: PipelineStage | None = None
    gpu_arch: str | None = None

    def __attrs_post_init__(self) -> None:
        check = Checker(f"ModelKV[{self.name}]")
        if not isinstance(self.layers, tuple) or not self.layers:
            check.add("layers", self.layers, "must declare at least one KV-holding layer",
                      "add LayerDecl entries (a model without attention or state layers needs no KV plan)")
        else:
            for i, layer in enumerate(self.layers):
                self._check_layer(check, i, layer)
        if not isinstance(self.cacheless, tuple):
            check.add("cacheless", self.cacheless, "must be a sequence of CachelessDecl", "pass a tuple or list")
        else:
            for i, decl in enumerate(self.cacheless):
                self._check_cacheless(check, i, decl)
        if not check.problems:
            self._check_unique(check)
        if self.max_position_embeddings is not None:
            check.positive_int("max_position_embeddings", self.max_position_embeddings)
        if check.positive_int("tensor_parallel_size", self.tensor_parallel_size):
            rank = self.tensor_parallel_rank
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.tensor_parallel_size:
                check.add("tensor_parallel_rank", rank, f"must be an integer in 0 .. {self.tensor_parallel_size - 1}",
                          "give this rank's index in its tensor-parallel group")
        if self.pipeline is not None and not isinstance(self.pipeline, PipelineStage):
            check.add("pipeline", self.pipeline, "must be a PipelineStage or None", "build stages with ModelKV.stage(...)")
        if self.hidden_size is not None:
            check.positive_int("hidden_size", self.hidden_size)
        if self.gpu_arch is not None and (not isinstance(self.gpu_arch, str) or not self.gpu_arch.startswith("sm_")):
            check.add("gpu_arch", self.gpu_arch, "must be a compute capability such as 'sm_90', or None",
                      "leave it unset, or build the model with ModelKV.from_hf_config(config, gpu=...)")
        if not isinstance(self.notes, tuple) or not all(isinstance(n, str) for n in self.notes):
            check.add("notes", self.notes, "must be a sequence of strings", "pass notes as a tuple of str")
        check.raise_if_any()

    @staticmethod
    def _check_layer(check: Checker, i: int, layer: Any) -> None:
        if not isinstance(layer, LayerDecl):
            check.add(f"layers[{i}]", layer, "must be a LayerDecl", "wrap each layer in LayerDecl(...)")
            return
        if not isinstance(layer.spec, _LAYER_SPEC_TYPES):
            check.add(f"layers[{i}].spec", layer.spec, f"must be one of {[t.__name__ for t in _LAYER_SPEC_TYPES]}",
                      "build the layer's spec with FullAttentionSpec(...), MambaSpec(...), etc. (layers that hold "
                      "no cache go in cacheless)")
            return
        for field in ("index", "layer_index"):
            value = getattr(layer, field)
            if field == "layer_index" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                check.add(f"layers[{i}].{field}", value, "must be an integer >= 0",
                          "give each layer its position in the model")
        if isinstance(layer.tp_replicas, bool) or not isinstance(layer.tp_replicas, int) or layer.tp_replicas < 1:
            check.add(f"layers[{i}].tp_replicas", layer.tp_replicas, "must be an integer >= 1",
                      "leave it to ModelKV.shard (1: each rank its own cache)")
        if not isinstance(layer.name, str) or not layer.name:
            check.add(f"layers[{i}].name", layer.name, "must be a non-empty string",
                      "name each layer, e.g. 'model.layers.0.self_attn'")
        if layer.spec.is_ssm != layer.backend.is_ssm:
            want = "a state backend such as 'mamba' or 'gdn'" if layer.spec.is_ssm else "an attention backend"
            check.add(f"layers[{i}].backend", layer.backend.name,
                      f"{layer.spec.kind.value} layers need {want}", "pick a backend that matches the layer kind")
        elif not layer.spec.is_ssm and layer.spec.kind.is_latent != layer.backend.is_mla:
            check.add(f"layers[{i}].backend", layer.backend.name,
                      "MLA and indexer layers need an MLA backend and other attention layers a non-MLA one",
                      "use 'flash_attn_mla' / 'flashmla' / 'triton_mla' for MLA layers, 'indexer' for indexer keys")

    @staticmethod
    def _check_cacheless(check: Checker, i: int, decl: Any) -> None:
        if not isinstance(decl, CachelessDecl) or not isinstance(decl.spec, _CACHELESS_SPEC_TYPES):
            check.add(f"cacheless[{i}]", decl, "must be a CachelessDecl with a KVSharedSpec or NoCacheSpec",
                      "wrap the layer in CachelessDecl(index=..., name=..., spec=NoCacheSpec())")
            return
        if isinstance(decl.index, bool) or not isinstance(decl.index, int) or decl.index < 0:
            check.add(f"cacheless[{i}].index", decl.index, "must be an integer >= 0",
                      "give each layer its position in the model")
        if not isinstance(decl.name, str) or not decl.name:
            check.add(f"cacheless[{i}].name", decl.name, "must be a non-empty string", "name each layer")

    def _check_unique(self, check: Checker) -> None:
        """Names and indices are unique across cache entries and cacheless layers (linear time)."""
        entries = (*self.layers, *self.cacheless)
        for what in ("name", "index"):
            counts = Counter(getattr(x, what) for x in entries)
            repeated = sorted((v for v, n in counts.items() if n > 1), key=str)
            if repeated:
                check.add("layers", repeated, f"layer {what}s must be unique; these repeat",
                          f"give every layer its own {what}")
        holders = {layer.name: layer for layer in self.layers}
        for i, decl in enumerate(self.cacheless):
            if isinstance(decl.spec, KVSharedSpec):
                source = holders.get(decl.spec.source)
                if source is None or source.spec.is_ssm:
                    attention = [x.name for x in self.layers if not x.spec.is_ssm]
                    fix = (f"use one of {attention[:4]}{'…' if len(attention) > 4 else ''}" if attention else
                           "the model has no attention layer that holds a cache: declare the layer it reads, or "
                           "give this one NoCacheSpec()")
                    check.add(f"cacheless[{i}].spec.source", decl.spec.source,
                              "must name an attention layer of this model that holds a cache", fix)

    @classmethod
    def from_specs(cls, name: str, specs: Sequence[tuple[LayerSpec, "str | Backend"]], **kwargs: Any) -> "ModelKV":
        """Build a model from ``(spec, backend)`` pairs, naming layers ``layers.0``, ``layers.1``, …"""
        layers = tuple(LayerDecl(index=i, name=f"layers.{i}", spec=spec, backend=backend)
                       for i, (spec, backend) in enumerate(specs))
        return cls(name=name, layers=layers, **kwargs)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], *, tp: int = 1, **overrides: Any) -> "ModelKV":
        """Derive every layer's KV spec from a Hugging Face ``config.json`` dict: the whole model
        (every head) sharded for tensor-parallel rank 0 of ``tp`` (:meth:`shard`).

        The reader follows what the config says (``layer_types``, each family's older fields,
        legacy names, ``text_config``), not its class name; see :mod:`graphkv.spec.hf_config` for
        the fields read and ``overrides``, and ``graphkv models`` for the families covered.
        """
        from graphkv.spec.hf_config import model_from_hf_config

        return model_from_hf_config(config, tp=tp, **overrides)

    def shard(self, tp_size: int, tp_rank: int) -> "ModelKV":
        """What tensor-parallel rank ``tp_rank`` of ``tp_size`` caches (this model's specs describe
        every head): KV heads divided, or one replicated head per rank when fewer than ``tp_size``;
        MLA latents and indexer keys whole; states split by their ``tp_split``. Raises
        :class:`SpecError` naming each count ``tp_size`` cannot split. See :mod:`graphkv.spec.sharding`.

        >>> from graphkv.presets import preset_model
        >>> preset_model("qwen3-next-80b-a3b").shard(4, 0).layers[3].spec.num_kv_heads
        1
        """
        from graphkv.spec.sharding import shard_model

        return shard_model(self, tp_size, tp_rank)

    def stage(self, pp_size: int, pp_rank: int, partition: Sequence[int] | None = None) -> "ModelKV":
        """What pipeline stage ``pp_rank`` of ``pp_size`` caches: its model layers under vLLM 0.33's
        default partition, or ``partition`` (layers per stage, as ``VLLM_PP_LAYER_PARTITION``).
        The stage keeps the whole model, so its plan pages like every other stage's and holds only
        its own layers' pages. See :mod:`graphkv.spec.stages`.

        >>> from graphkv.presets import preset_model
        >>> len(preset_model("llama-3.1-8b").stage(2, 1).layers)
        16
        """
        from graphkv.spec.stages import stage_model

        return stage_model(self, pp_size, pp_rank, partition)

    @property
    def pipeline_parallel_size(self) -> int:
        """Pipeline stages the model is cut into (1 when it is not a stage)."""
        return 1 if self.pipeline is None else self.pipeline.size

    @property
    def pipeline_rank(self) -> int:
        """This stage's index (0 when the model is not a stage)."""
        return 0 if self.pipeline is None else self.pipeline.rank

    @property
    def whole(self) -> "ModelKV":
        """Every layer of the model (this model unless it is a pipeline stage), sharded like it."""
        return self if self.pipeline is None else self.pipeline.model

    @property
    def kv_tp_replicas(self) -> int:
        """Consecutive tensor-parallel ranks holding identical caches for every layer
        (:func:`graphkv.spec.sharding.kv_tp_replicas`)."""
        from graphkv.spec.sharding import kv_tp_replicas

        return kv_tp_replicas(self)

    @property
    def has_attention(self) -> bool:
        """Whether any layer is an attention layer."""
        return any(not layer.spec.is_ssm for layer in self.layers)

    @property
    def has_ssm(self) -> bool:
        """Whether any layer holds a recurrent state."""
        return any(layer.spec.is_ssm for layer in self.layers)

    @property
    def is_hybrid(self) -> bool:
        """Attention and state layers in one model."""
        return self.has_attention and self.has_ssm

    def layer(self, name: str) -> LayerDecl:
        """The cache entry called ``name``."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise SpecError(Problem(field="layer", value=name, limit="no such layer in this model",
                                fix=f"use one of {[x.name for x in self.layers][:8]}…"))
