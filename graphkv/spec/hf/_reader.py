"""Typed access to a Hugging Face config dict that records problems instead of raising.

Every problem is recorded once per field on one :class:`~graphkv.spec._checks.Checker` (config
fields are named ``config.<field>``, keyword overrides by their own name) and raised together
by :meth:`ConfigReader.raise_if_any` — never a ``KeyError`` or ``TypeError``.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from graphkv.errors import Problem
from graphkv.spec._checks import Checker
from graphkv.spec.dtypes import DType

__all__ = ["MISSING", "ConfigReader", "Options"]


class _Missing:
    """Marks a field absent from the config (shown as ``<missing>`` in messages)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


@attrs.frozen(kw_only=True)
class Options:
    """The keyword overrides of ``model_from_hf_config``, resolved against the config."""

    tp: int
    model_dtype: DType  # the checkpoint's dtype: Mamba conv states use it
    attention_dtype: DType  # attention / MLA cache
    ssm_dtype: DType  # Mamba ssm / gated-delta recurrent state
    attention_backend: str  # non-MLA attention layers
    mla_backend: str  # MLA layers


def _divisors(value: int, limit: int = 64) -> list[int]:
    return [d for d in range(1, min(value, limit) + 1) if value % d == 0]


class ConfigReader:
    """Reads fields of one config; ``label`` (the architecture) appears in "is required" messages."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self.check = Checker("config")
        self.label = ""  # the architecture, once known
        self._reported: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value of ``key``; ``default`` when absent or ``null``."""
        value = self.config.get(key)
        return default if value is None else value

    def has(self, key: str) -> bool:
        """Whether ``key`` is present and not ``null``."""
        return self.config.get(key) is not None

    def first_present(self, *keys: str) -> str:
        """The first of ``keys`` the config sets (the first key if none): for renamed fields."""
        return next((key for key in keys if self.has(key)), keys[0])

    def problem(self, key: str, value: Any, limit: str, fix: str) -> None:
        """Record a problem on ``config.<key>`` (once per key)."""
        if key not in self._reported:
            self._reported.add(key)
            self.check.add(key, value, limit, fix)

    def argument_problem(self, field: str, value: Any, limit: str, fix: str) -> None:
        """Record a problem on a keyword argument (named without the ``config.`` prefix)."""
        if field not in self._reported:
            self._reported.add(field)
            self.check.problems.append(Problem(field=field, value=value, limit=limit, fix=fix))

    def raise_if_any(self) -> None:
        """Raise one SpecError with every problem recorded so far."""
        self.check.raise_if_any()

    def int_field(self, key: str, *, default: Any = MISSING, minimum: int = 1, why: str = "") -> int | None:
        """An int >= ``minimum``; records a problem and returns ``None`` otherwise."""
        value = self.get(key, default)
        if value is MISSING:
            reason = why or (f"for {self.label} configs" if self.label else "")
            self.problem(key, MISSING, f"is required {reason}".rstrip(),
                         f"add {key} (an integer >= {minimum}) from the model's config.json")
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.problem(key, value, f"must be an integer >= {minimum}",
                         f"set {key} to the integer from the model's config.json")
            return None
        return value

    def optional_int(self, key: str) -> int | None:
        """A positive int when set, ``None`` when absent; a bad value records a problem."""
        return self.int_field(key) if self.has(key) else None

    def shard(self, key: str, value: int | None, tp: int) -> int | None:
        """``value // tp`` for a head or channel count that tensor parallelism splits."""
        if value is None:
            return None
        if value % tp:
            self.problem(key, value, f"must be divisible by tp={tp} (each rank holds {key} / tp)",
                         f"use a tensor-parallel size that divides {value}, e.g. one of {_divisors(value)}")
            return None
        return value // tp

    def kv_heads_per_rank(self, key: str, heads: int | None, tp: int) -> int | None:
        """KV heads one rank caches: ``heads // tp``, or 1 (replicated) when ``tp > heads``."""
        if heads is None or heads >= tp:
            return self.shard(key, heads, tp)
        if tp % heads:
            self.problem(key, heads, f"is below tp={tp}, so every rank keeps one replicated KV head, which needs "
                                     f"tp to be a multiple of {heads}",
                         f"use tp={heads} or a multiple of it, or a tp that divides {heads}")
            return None
        return 1

    def str_list(self, key: str, allowed: tuple[str, ...], length: int | None) -> list[str] | None:
        """A list of strings from ``allowed``, ``length`` long when known."""
        value = self.get(key)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            self.problem(key, value, f"must be a list of strings from {list(allowed)}",
                         f"set {key} to one entry per layer")
            return None
        unknown = sorted({v for v in value if v not in allowed})
        if unknown:
            self.problem(key, value if len(value) <= 8 else f"<{len(value)} entries>",
                         f"has unknown entries {unknown}; allowed: {list(allowed)}",
                         f"use only {list(allowed)} in {key}")
            return None
        if length is not None and len(value) != length:
            self.problem(key, f"<{len(value)} entries>", f"must have one entry per layer (num_hidden_layers={length})",
                         f"make {key} and num_hidden_layers agree")
            return None
        return list(value)
