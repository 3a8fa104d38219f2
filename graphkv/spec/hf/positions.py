"""The longest context a config allows, derived by vLLM 0.33's rules (``_get_and_verify_max_len``).

- Every length field vLLM knows is read; the smallest one present wins, except that a set
  ``model_max_length`` (Command-R, Kimi-Linear, ...) replaces the others.
- A config that declares none of them (Mamba, Mamba2, Falcon-Mamba, BLOOM) is taken to allow
  2048 tokens, as vLLM assumes; the plan's notes say so.
- A RoPE scaling ``factor`` multiplies the length, except for the RoPE types whose
  ``max_position_embeddings`` is already scaled (``llama3``, ``yarn``, ``longrope``, ``su``,
  ``deepseek_yarn``, ``deepseek_llama_scaling``) and for Gemma 3, whose length is written scaled.
  The RoPE parameters are read from ``rope_parameters`` (transformers 5) or ``rope_scaling``
  (older configs), one dict, or one per layer type.

Implausible numbers are refused naming the field, not planned: a length field or a scaled length
beyond ``CAPS["positions"]`` (16,777,216 tokens; the longest served context is 10,485,760, Llama 4
Scout), a RoPE ``factor`` that is not a finite number in (0, :data:`MAX_ROPE_FACTOR`], RoPE
parameters that are not an object (a list, a string), a ``rope_type`` that is not a string or not one
of :data:`ROPE_TYPES` and an ``original_max_position_embeddings`` that is not a positive integer.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import attrs

from graphkv.spec.hf._reader import CAPS, ConfigReader

__all__ = ["ASSUMED_MAX_LEN", "LENGTH_KEYS", "MAX_ROPE_FACTOR", "ROPE_TYPES", "PositionCap", "read_position_cap"]

LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
"""The fields vLLM reads a model's maximum length from, in its order."""

ASSUMED_MAX_LEN = 2048
"""The length vLLM assumes for a config that declares none of :data:`LENGTH_KEYS`."""

MAX_ROPE_FACTOR = 1024.0
"""Plausibility cap on a RoPE scaling ``factor``: served models use 2 to 64."""

_ALREADY_SCALED = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})
ROPE_TYPES = ("default", "linear", "dynamic", "ntk", "yarn", "deepseek_yarn", "deepseek_llama_scaling", "llama3",
              "longrope", "su", "mrope", "mllama4", "xdrope", "proportional")
"""The RoPE types vLLM 0.33's ``get_rope`` builds (``su`` and ``mrope`` as its config patching renames them)
and transformers' ``ROPE_INIT_FUNCTIONS`` hold; another ``rope_type`` is refused, not guessed at."""
_NESTING_KEYS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "linear_attention",
                           "mamba", "conv", "main", "compress", "attention", "hybrid"})


@attrs.frozen
class PositionCap:
    """The model's cap on ``max_model_len`` and, when it was not read from one field as written, why."""

    value: int
    note: str | None = None


def read_position_cap(cfg: ConfigReader, model_type: str) -> PositionCap:
    """The maximum length of the model ``cfg`` describes, by vLLM's rules (module docstring); a
    length field or RoPE parameter of the wrong type, or beyond its plausibility cap, records a
    problem on ``cfg``."""
    found = {key: cfg.optional_int(key, cap="positions") for key in LENGTH_KEYS if cfg.has(key)}
    found = {key: value for key, value in found.items() if value is not None}
    rope = _rope_factor(cfg)  # checked for every model: a Gemma 3 config's factor must still be a number
    if found.get("model_max_length"):
        key, length = "model_max_length", found["model_max_length"]
    elif found:
        key = min(found, key=lambda k: found[k])
        length = found[key]
    else:
        return PositionCap(ASSUMED_MAX_LEN, f"the config declares no maximum length ({', '.join(LENGTH_KEYS[:4])}, "
                                            f"...): {ASSUMED_MAX_LEN} assumed, as vLLM does; pass max_model_len "
                                            "to plan another")
    reason = None if key == "max_position_embeddings" and len(found) == 1 else f"maximum length from {key}"
    if rope is not None and rope[0] != 1.0 and "gemma3" not in model_type:
        factor, factor_key = rope
        scaled = int(length * factor)
        if not 1 <= scaled <= CAPS["positions"]:
            bound = ("below 1" if scaled < 1 else f"beyond the plausibility cap of {CAPS['positions']} (the longest "
                                                   "served context is 10485760)")
            cfg.problem(factor_key, factor, f"scales {key}={length} to {scaled} positions, {bound}",
                        f"set {factor_key} to the model's factor (such as 8.0; served models use 2 to 64) from its "
                        "config.json, or remove it for unscaled RoPE")
            return PositionCap(length)
        length = scaled
        reason = f"{key} x RoPE scaling factor {factor:g}"
    return PositionCap(length, None if reason is None else f"{reason}: {length} (vLLM's rule)")


def _rope_factor(cfg: ConfigReader) -> tuple[float, str] | None:
    """The RoPE scaling factor vLLM applies to the length (the last one that applies) and the
    field it came from; ``None`` when none applies. Every RoPE parameter graphkv reads is checked,
    also those of RoPE types whose length is already scaled."""
    field = "rope_parameters" if cfg.has("rope_parameters") else "rope_scaling"
    params = cfg.get(field)
    if params is None:
        return None
    if not isinstance(params, Mapping):
        cfg.problem(field, params, "must be an object of RoPE parameters, e.g. {\"rope_type\": \"linear\", "
                                   "\"factor\": 4.0}, or null",
                    f"copy {field} from the model's config.json, or set it to null for unscaled RoPE")
        return None
    nested = bool(params) and set(params) <= _NESTING_KEYS
    found = None
    for name, one in (params.items() if nested else ((None, params),)):
        prefix = f"{field}.{name}" if nested else field
        if one is None:
            continue
        if not isinstance(one, Mapping):
            cfg.problem(prefix, one, "must be an object of RoPE parameters for that layer type, or null",
                        f"copy {prefix} from the model's config.json")
            continue
        factor = _checked_params(cfg, one, prefix)
        if factor is not None:
            found = factor
    return found


def _checked_params(cfg: ConfigReader, params: Mapping[str, Any], prefix: str) -> tuple[float, str] | None:
    """The factor of one RoPE parameter object when it scales the length; problems recorded on ``cfg``."""
    type_key = "rope_type" if "rope_type" in params else "type"
    rope_type = params.get(type_key)
    if rope_type is None:
        rope_type = "default"
    elif not isinstance(rope_type, str):
        cfg.problem(f"{prefix}.{type_key}", rope_type, "must be a string such as 'default', 'linear', 'dynamic', "
                                                      "'yarn' or 'llama3'",
                    f"copy {prefix}.{type_key} from the model's config.json")
        rope_type = "default"
    elif rope_type not in ROPE_TYPES:  # an unknown type may or may not scale the length: refuse, not guess
        cfg.problem(f"{prefix}.{type_key}", rope_type, f"is not a RoPE type vLLM or transformers knows "
                                                      f"({', '.join(ROPE_TYPES)})",
                    f"copy {prefix}.{type_key} from the model's config.json, or set it to 'default' for unscaled RoPE")
    original = params.get("original_max_position_embeddings")
    if original is not None and (isinstance(original, bool) or not isinstance(original, int)
                                 or not 1 <= original <= CAPS["positions"]):
        cfg.problem(f"{prefix}.original_max_position_embeddings", original,
                    f"must be an integer in [1, {CAPS['positions']}] (the context length before RoPE scaling)",
                    f"copy {prefix}.original_max_position_embeddings from the model's config.json")
    value: Any = params.get("factor")
    if value is None:
        return None
    key = f"{prefix}.factor"
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
            or (isinstance(value, float) and not math.isfinite(value))):  # an int may exceed a float: compare it
        cfg.problem(key, value, "must be a positive number (finite, not a string or a boolean)",
                    f"set {key} to a number such as 4.0, copied from the model's config.json")
        return None
    if value > MAX_ROPE_FACTOR:
        cfg.problem(key, value, f"must be <= {MAX_ROPE_FACTOR:g} (plausibility cap: served models scale RoPE by 2 to "
                                "64, so this is a typo or a corrupt config)",
                    f"set {key} to the model's factor (such as 8.0) from its config.json, or remove {prefix} for "
                    "unscaled RoPE")
        return None
    if rope_type in _ALREADY_SCALED or rope_type not in ROPE_TYPES:
        return None
    return float(value), key
