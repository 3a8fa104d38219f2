"""Small helpers that collect validation problems so a descriptor reports all of them at once."""

from __future__ import annotations

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
            self.add(field, value, "must be an integer > 0", f"set {field} to a positive integer")
            return False
        return True

    def non_negative_int(self, field: str, value: Any) -> bool:
        """Record a problem unless ``value`` is an int >= 0."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.add(field, value, "must be an integer >= 0", f"set {field} to 0 or a positive integer")
            return False
        return True

    def raise_if_any(self) -> None:
        """Raise one :class:`SpecError` holding every recorded problem."""
        if self.problems:
            raise SpecError(*self.problems)


def int_problems(field: str, value: Any, minimum: int, fix: str) -> list[Problem]:
    """``[]`` when ``value`` is an int >= ``minimum`` (not a bool), else one problem naming ``field``
    (for function arguments, which carry no owner prefix)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return [Problem(field=field, value=value, limit=f"must be an integer >= {minimum}", fix=fix)]
    return []


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)
