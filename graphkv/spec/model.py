"""A model declaration: every KV-holding layer with its spec and backend."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec._checks import Checker
from graphkv.spec.backends import Backend, get_backend
from graphkv.spec.layers import ChunkedLocalSpec, FullAttentionSpec, LayerSpec, MambaSpec, MLASpec, SlidingWindowSpec

__all__ = ["LayerDecl", "ModelKV"]

_LAYER_SPEC_TYPES = (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalSpec, MLASpec, MambaSpec)


@attrs.frozen(kw_only=True)
class LayerDecl:
    """One layer of the model: its position, name, KV spec and backend."""

    index: int
    name: str
    spec: LayerSpec
    backend: Backend = attrs.field(converter=get_backend)


def _layers(value: Any) -> Any:
    try:
        return tuple(value)
    except TypeError:
        return value


@attrs.frozen(kw_only=True)
class ModelKV:
    """What one GPU (one tensor-parallel rank) caches for a model.

    ``layers`` lists only the layers that hold a cache (embedding / MLP layers are left out);
    ``max_position_embeddings`` caps ``max_model_len``; ``tensor_parallel_size`` records the
    sharding the specs were built for; ``hidden_size`` and ``dtype`` size the estimated
    activations of captured graphs.
    """

    name: str
    layers: tuple[LayerDecl, ...] = attrs.field(converter=_layers)
    max_position_embeddings: int | None = None
    tensor_parallel_size: int = 1
    hidden_size: int | None = None

    def __attrs_post_init__(self) -> None:
        check = Checker(f"ModelKV[{self.name}]")
        if not isinstance(self.layers, tuple) or not self.layers:
            check.add("layers", self.layers, "must declare at least one KV-holding layer",
                      "add LayerDecl entries (a model without attention or state layers needs no KV plan)")
        else:
            for i, layer in enumerate(self.layers):
                if not isinstance(layer, LayerDecl):
                    check.add(f"layers[{i}]", layer, "must be a LayerDecl", "wrap each layer in LayerDecl(...)")
                    continue
                if not isinstance(layer.spec, _LAYER_SPEC_TYPES):
                    check.add(f"layers[{i}].spec", layer.spec,
                              f"must be one of {[t.__name__ for t in _LAYER_SPEC_TYPES]}",
                              "build the layer's spec with FullAttentionSpec(...), MambaSpec(...), etc.")
                    continue
                if isinstance(layer.index, bool) or not isinstance(layer.index, int) or layer.index < 0:
                    check.add(f"layers[{i}].index", layer.index, "must be an integer >= 0",
                              "give each layer its position in the model")
                if not isinstance(layer.name, str) or not layer.name:
                    check.add(f"layers[{i}].name", layer.name, "must be a non-empty string",
                              "name each layer, e.g. 'model.layers.0.self_attn'")
                if layer.spec.is_ssm != layer.backend.is_ssm:
                    want = "a state backend such as 'mamba' or 'gdn'" if layer.spec.is_ssm else "an attention backend"
                    check.add(f"layers[{i}].backend", layer.backend.name,
                              f"{layer.spec.kind.value} layers need {want}", "pick a backend that matches the layer kind")
                elif not layer.spec.is_ssm and (layer.spec.kind.value == "mla") != layer.backend.is_mla:
                    check.add(f"layers[{i}].backend", layer.backend.name,
                              "MLA layers need an MLA backend and other attention layers a non-MLA one",
                              "use 'flashmla' / 'triton_mla' for MLA layers")
            decls = [layer for layer in self.layers if isinstance(layer, LayerDecl)]
            names = [x.name for x in decls if isinstance(x.name, str)]
            indices = [x.index for x in decls if isinstance(x.index, int)]
            for what, values in (("name", names), ("index", indices)):
                repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
                if repeated:
                    check.add("layers", repeated, f"layer {what}s must be unique; these repeat",
                              f"give every layer its own {what}")
        if self.max_position_embeddings is not None:
            check.positive_int("max_position_embeddings", self.max_position_embeddings)
        check.positive_int("tensor_parallel_size", self.tensor_parallel_size)
        if self.hidden_size is not None:
            check.positive_int("hidden_size", self.hidden_size)
        check.raise_if_any()

    @classmethod
    def from_specs(cls, name: str, specs: Sequence[tuple[LayerSpec, "str | Backend"]], **kwargs: Any) -> "ModelKV":
        """Build a model from ``(spec, backend)`` pairs, naming layers ``layers.0``, ``layers.1``, …"""
        layers = tuple(LayerDecl(index=i, name=f"layers.{i}", spec=spec, backend=backend)
                       for i, (spec, backend) in enumerate(specs))
        return cls(name=name, layers=layers, **kwargs)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], *, tp: int = 1, **overrides: Any) -> "ModelKV":
        """Derive every layer's KV spec from a Hugging Face ``config.json`` dict.

        Supports Llama-style, Qwen3-Next, Nemotron-H, Jamba, gpt-oss and DeepSeek-V3 (MLA)
        architectures; see :mod:`graphkv.spec.hf_config` for the fields read and ``overrides``.
        """
        from graphkv.spec.hf_config import model_from_hf_config

        return model_from_hf_config(config, tp=tp, **overrides)

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
        """The layer called ``name``."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise SpecError(Problem(field="layer", value=name, limit="no such layer in this model",
                                fix=f"use one of {[x.name for x in self.layers][:8]}…"))
