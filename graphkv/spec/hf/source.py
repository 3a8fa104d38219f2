"""Which part of a config describes the decoder, and which family it belongs to.

A multimodal config (Gemma-3/3n/4, Llama-4, Qwen3.5, …) nests its language model under
``text_config`` (``llm_config`` / ``language_config`` in some families; one that is not an object
is refused naming it); the decoder is read from there, with the checkpoint dtype, name and
architectures inherited from the outer config when the inner one does not set them. The family
(``model_type``, outer first) picks the few defaults a config does not write (see
:mod:`graphkv.spec.hf.families`); an unknown family is read by its fields alone and the plan's
notes say so.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec.hf.families import Family, find_family

__all__ = ["ConfigSource", "resolve_source"]

_NESTED_DECODER_KEYS = ("text_config", "llm_config", "language_config")
_INHERITED = ("torch_dtype", "dtype", "_name_or_path", "architectures", "mamba_ssm_cache_dtype")


@attrs.frozen(kw_only=True)
class ConfigSource:
    """The decoder's fields, the family they belong to, and where they came from."""

    fields: Mapping[str, Any]
    family: Family | None
    model_type: str | None  # the outer config's model_type
    architecture: str | None  # architectures[0] of the outer config
    nested_key: str | None  # "text_config" etc. when the decoder was nested

    def describe(self) -> str:
        """One sentence: which config was read and whether graphkv knows its family."""
        where = f"{self.nested_key} of " if self.nested_key else ""
        what = self.architecture or self.model_type or "an unnamed config"
        if self.family is not None:
            return f"read {where}{what} as family {self.family.model_type} ({self.family.checkpoint})"
        return (f"read {where}{what} by its fields: model_type {self.model_type!r} is not a family graphkv lists "
                "(`graphkv models`)")


def as_mapping(config: Any) -> Mapping[str, Any]:
    """``config`` as a mapping: a dict, or a ``PretrainedConfig`` through its ``to_dict()``."""
    if isinstance(config, Mapping):
        return config
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        as_dict = to_dict()
        if isinstance(as_dict, Mapping):
            return as_dict
    raise SpecError(Problem(field="config", value=type(config).__name__,
                            limit="must be a mapping: the parsed config.json (or a PretrainedConfig)",
                            fix="pass json.load(open('config.json')) or AutoConfig.from_pretrained(...)"))


def _architecture(config: Mapping[str, Any], problems: list[Problem]) -> str | None:
    architectures = config.get("architectures")
    if architectures is None:
        return None
    if (not isinstance(architectures, (list, tuple)) or not architectures
            or not all(isinstance(a, str) for a in architectures)):
        problems.append(Problem(field="config.architectures", value=architectures,
                                limit="must be a non-empty list of class names",
                                fix="set architectures like ['LlamaForCausalLM'] as in the model's config.json"))
        return None
    return architectures[0]


def _model_type(config: Mapping[str, Any], key: str, problems: list[Problem]) -> str | None:
    value = config.get("model_type")
    if value is None or isinstance(value, str):
        return value or None
    problems.append(Problem(field=key, value=value, limit="must be a string", fix="set model_type like 'llama'"))
    return None


def resolve_source(config: Any) -> ConfigSource:
    """The decoder's fields of ``config`` and its family. Raises SpecError (one line per problem)
    when ``config`` is not a mapping or names its architecture / model type with the wrong types."""
    outer = as_mapping(config)
    problems: list[Problem] = []
    architecture = _architecture(outer, problems)
    model_type = _model_type(outer, "config.model_type", problems)
    for key in _NESTED_DECODER_KEYS:
        value = outer.get(key)
        if value is not None and not isinstance(value, Mapping):
            shown = value if len(repr(value)) <= 80 else type(value).__name__
            problems.append(Problem(field=f"config.{key}", value=shown,
                                    limit="must be an object holding the language model's fields (num_hidden_layers, "
                                          "num_attention_heads, ...), or null",
                                    fix=f"copy {key} from the model's config.json, or remove it when the decoder's "
                                        "fields are at the top level"))
    nested_key = next((k for k in _NESTED_DECODER_KEYS if isinstance(outer.get(k), Mapping)), None)
    fields: Mapping[str, Any] = outer
    inner_type = None
    if nested_key is not None:
        inner = as_mapping(outer[nested_key])
        inherited = {k: outer[k] for k in _INHERITED if outer.get(k) is not None and inner.get(k) is None}
        fields = {**inner, **inherited}
        inner_type = _model_type(inner, f"config.{nested_key}.model_type", problems)
    if outer.get("is_encoder_decoder") is True and nested_key is None:
        problems.append(Problem(field="config.is_encoder_decoder", value=True,
                                limit=f"{architecture or model_type or 'this model'} is an encoder-decoder model: its "
                                      "decoder's cross-attention caches the encoder's output, which graphkv does "
                                      "not plan (it plans decoder-only models' KV caches)",
                                fix="plan a decoder-only model, or declare the decoder's self-attention layers with "
                                    "ModelKV.from_specs"))
    cross = fields.get("cross_attention_layers")
    if cross is not None and cross != []:  # Mllama: decoder layers that attend to the image encoder's output
        where = f"config.{nested_key}." if nested_key is not None else "config."
        shown = cross if len(repr(cross)) <= 80 else type(cross).__name__
        problems.append(Problem(field=f"{where}cross_attention_layers", value=shown,
                                limit=f"{architecture or model_type or 'this model'} has cross-attention layers, which "
                                      "cache the vision encoder's output, not the decoder's tokens, and graphkv does "
                                      "not plan them",
                                fix="plan a decoder-only model, or declare the self-attention layers with "
                                    "ModelKV.from_specs"))
    if problems:
        raise SpecError(*problems)
    if architecture is None and model_type is None and inner_type is None:
        raise SpecError(Problem(field="config.architectures", value=outer.get("architectures", "<missing>"),
                                limit="is required (or model_type) to know what the config describes",
                                fix="pass the whole config.json, which names architectures and model_type"))
    family = find_family(model_type) or find_family(inner_type)
    return ConfigSource(fields=fields, family=family, model_type=model_type or inner_type, architecture=architecture,
                        nested_key=nested_key)
