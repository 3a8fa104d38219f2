"""Small helpers that collect validation problems so a descriptor reports all of them at once."""

from __future__ import annotations

import operator
from typing import Any

from graphkv.errors import Problem, SpecError


class Checker:
    """Accumulates :class:`Problem` records; :meth:`raise_if_any` raises one SpecError with all."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.problems: list[Problem] = []

    def add(self, field: str, value: Any, limit: str, fix: str) -> None:
        """Record one problem on ``owner.field``."""
        self.problems.append(Problem(field=f"{self.owner}.{field}", value=value, limit=limit, fix=fix))

    def positive_int(self, field: str, value: Any) -> bool:
        """Record a problem unless ``value`` is an int > 0; returns whether it was fine."""
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.add(field, value, "must be an integer > 0" + _got(value), f"set {field} to a positive integer"
                     + _as_int(value, 1))
            return False
        return True

    def non_negative_int(self, field: str, value: Any) -> bool:
        """Record a problem unless ``value`` is an int >= 0."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.add(field, value, "must be an integer >= 0" + _got(value), f"set {field} to 0 or a positive integer"
                     + _as_int(value, 0))
            return False
        return True

    def raise_if_any(self) -> None:
        """Raise one :class:`SpecError` holding every recorded problem."""
        if self.problems:
            raise SpecError(*self.problems)


def _got(value: Any) -> str:
    """`` (got float)`` when ``value`` is of another type than int (a bool included), else ``""``."""
    if isinstance(value, bool):
        return " (got a bool)"
    if value is None:
        return " (got None)"
    return "" if isinstance(value, int) else f" (got {type(value).__name__})"


def _as_int(value: Any, minimum: int) -> str:
    """A hint for an integer of another type (a numpy int, an integral float): pass it as a Python int."""
    if isinstance(value, bool) or isinstance(value, int):
        return ""
    try:
        whole = operator.index(value) if hasattr(type(value), "__index__") else None
    except TypeError:
        whole = None
    if whole is None and isinstance(value, float) and value.is_integer():
        whole = int(value)
    return f" (a Python int: {whole})" if whole is not None and whole >= minimum else ""


def int_problems(field: str, value: Any, minimum: int, fix: str) -> list[Problem]:
    """``[]`` when ``value`` is an int >= ``minimum`` (not a bool), else one problem naming ``field``
    (for function arguments, which carry no owner prefix)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return [Problem(field=field, value=value, limit=f"must be an integer >= {minimum}" + _got(value),
                        fix=fix + _as_int(value, minimum))]
    return []


def count_arg(field: str, value: Any, minimum: int, fix: str) -> int:
    """A function argument that counts something: ``value`` as a Python int >= ``minimum`` (numpy ints
    too), else a :class:`SpecError` naming ``field`` — a bool, a float (``1.5``, even ``4.0``), a
    string or ``None`` is refused, never truncated."""
    whole = None
    if not isinstance(value, bool) and type(value).__name__ != "bool_" and hasattr(type(value), "__index__"):
        whole = operator.index(value)
    if whole is None or whole < minimum:
        raise SpecError(Problem(field=field, value=value, limit=f"must be an integer >= {minimum}" + _got(value),
                                fix=fix + _as_int(value, minimum)))
    return whole


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)
