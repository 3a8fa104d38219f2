"""The one exception hierarchy of graphkv.

Every user-facing error names the parameter (``field``), the value it got, the limit it
broke and the fix. Spec validation collects every problem before raising, so a user sees all
of them at once.
"""

from __future__ import annotations

from typing import Any

import attrs

from graphkv.printable import printable

__all__ = [
    "CapacityError",
    "CaptureError",
    "ConsensusError",
    "GraphkvError",
    "MeasurementError",
    "MissingExtraError",
    "PlanError",
    "Problem",
    "SpecError",
    "UnknownNameError",
]


@attrs.frozen(kw_only=True)
class Problem:
    """One thing wrong with the input: which field, what it got, what it must be, how to fix it."""

    field: str
    value: Any
    limit: str
    fix: str

    def __str__(self) -> str:
        # One line, whatever a config file put in the value, the field or a text quoting it (graphkv.printable).
        return printable(f"{self.field}={self.value!r}: {self.limit}; {self.fix}")


class GraphkvError(Exception):
    """Base of every error graphkv raises on purpose.

    ``problems`` holds one or more :class:`Problem` records; the message is built from them.
    """

    def __init__(self, *problems: Problem) -> None:
        assert problems, "a GraphkvError needs at least one Problem"
        self.problems: tuple[Problem, ...] = tuple(problems)
        if len(problems) == 1:
            message = str(problems[0])
        else:
            lines = "\n".join(f"  - {p}" for p in problems)
            message = f"{len(problems)} problems:\n{lines}"
        super().__init__(message)

    def one_line(self) -> str:
        """The message on one line (the command line's form): ``N problems: <first>; <second>; ...``."""
        if len(self.problems) == 1:
            return str(self.problems[0])
        return f"{len(self.problems)} problems: " + "; ".join(map(str, self.problems))

    @property
    def field(self) -> str:
        """The field of the first problem."""
        return self.problems[0].field

    @property
    def value(self) -> Any:
        """The offending value of the first problem."""
        return self.problems[0].value

    @classmethod
    def one(cls, field: str, value: Any, limit: str, fix: str) -> "GraphkvError":
        """Build an error holding a single problem."""
        return cls(Problem(field=field, value=value, limit=limit, fix=fix))


class SpecError(GraphkvError, ValueError):
    """A descriptor, limit, budget or config that is invalid on its own."""


class PlanError(GraphkvError):
    """Valid inputs that cannot be planned together (e.g. incompatible kernel block sizes)."""


class CapacityError(PlanError):
    """The KV pool cannot hold what the limits ask for."""


class ConsensusError(PlanError):
    """Ranks that cannot agree on one plan: mismatched models or limits, a rank whose own plan
    failed, or a rank that never arrived (dead or stuck). Raised alike on every rank that can."""


class CaptureError(GraphkvError):
    """A CUDA-graph capture that cannot be done as requested."""


class MeasurementError(GraphkvError):
    """A memory reading that failed while measuring (an NVML call that errs mid-run, a device that
    went away); where a measurement *method* is unavailable, graphkv falls back and says so instead."""


class UnknownNameError(GraphkvError, KeyError):
    """A lookup by a name the object does not hold (a plan's static buffer, a ledger allocation); the
    message lists the names it does hold. It is a :class:`KeyError` too, so ``except KeyError`` and
    mapping-style code still work."""

    def __str__(self) -> str:
        return str(self.args[0])  # KeyError would show the message quoted


class MissingExtraError(GraphkvError, ImportError):
    """A part of graphkv needs an optional dependency that is not installed.

    The message names the module, the extra that installs it (``pip install 'graphkv[runtime]'``)
    and why it is needed; it is an :class:`ImportError` too, so ``except ImportError`` still works.
    """
