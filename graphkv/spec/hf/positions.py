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
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from graphkv.spec.hf._reader import ConfigReader

__all__ = ["ASSUMED_MAX_LEN", "LENGTH_KEYS", "PositionCap", "read_position_cap"]

LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
"""The fields vLLM reads a model's maximum length from, in its order."""

ASSUMED_MAX_LEN = 2048
"""The length vLLM assumes for a config that declares none of :data:`LENGTH_KEYS`."""

_ALREADY_SCALED = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})
_NESTING_KEYS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "linear_attention",
                           "mamba", "conv", "main", "compress", "attention", "hybrid"})


@attrs.frozen
class PositionCap:
    """The model's cap on ``max_model_len`` and, when it was not read from one field as written, why."""

    value: int
    note: str | None = None


def read_position_cap(cfg: ConfigReader, model_type: str) -> PositionCap:
    """The maximum length of the model ``cfg`` describes, by vLLM's rules (module docstring); a
    length field or RoPE factor of the wrong type records a problem on ``cfg``."""
    found = {key: cfg.optional_int(key) for key in LENGTH_KEYS if cfg.has(key)}
    found = {key: value for key, value in found.items() if value is not None}
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
    factor = 1.0 if "gemma3" in model_type else _rope_factor(cfg)
    if factor != 1.0:
        length = int(length * factor)
        reason = f"{key} x RoPE scaling factor {factor:g}"
    return PositionCap(length, None if reason is None else f"{reason}: {length} (vLLM's rule)")


def _rope_factor(cfg: ConfigReader) -> float:
    """The RoPE scaling factor vLLM applies to the length (the last one that applies), 1.0 when none."""
    field = "rope_parameters" if cfg.has("rope_parameters") else "rope_scaling"
    params = cfg.get(field)
    if not isinstance(params, dict) or not params:
        return 1.0
    nested = set(params) <= _NESTING_KEYS
    factor = 1.0
    for one in (params.values() if nested else (params,)):
        if not isinstance(one, dict):
            continue
        rope_type = one.get("rope_type", one.get("type", "default"))
        if rope_type in _ALREADY_SCALED or "factor" not in one or one["factor"] is None:
            continue
        value: Any = one["factor"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            cfg.problem(f"{field}.factor", value, "must be a positive number", "copy the factor from the model's "
                                                                               "config.json")
            return 1.0
        factor = float(value)
    return factor
