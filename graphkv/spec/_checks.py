"""Small helpers that collect validation problems so a descriptor reports all of them at once, and
the integer policy every entry point shares.

Integer policy: a count or size may be a Python int or any other integer (a numpy int, a 0-d
integer array or tensor: anything with ``__index__``), used as a Python int (:func:`whole_int`,
:func:`as_int` for attrs fields); a bool of any kind (Python, numpy, a bool array or tensor:
:func:`is_bool`), a float (even ``4.0``), a string or ``None`` is refused, never truncated.
"""

from __future__ import annotations

import operator
from typing import Any

from graphkv.errors import Problem, SpecError


def is_bool(value: Any) -> bool:
    """Whether ``value`` is a boolean of any kind: a Python bool, a numpy bool scalar or array, a
    torch bool tensor (read from its dtype, so neither numpy nor torch is imported)."""
    if isinstance(value, bool):
        return True
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return False
    kind = getattr(dtype, "kind", None)  # numpy's; a torch dtype has none
    return kind == "b" if kind is not None else str(dtype) == "torch.bool"


def is_hashable(value: object) -> bool:
    """Whether ``value`` can key a dict (a request id must: it keys the request's row)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


def whole_int(value: Any) -> int | None:
    """``value`` as a Python int when it is an integer of any kind but a bool (see the module
    docstring), else ``None``."""
    if type(value) is int:
        return value
    if is_bool(value) or not hasattr(type(value), "__index__") or getattr(value, "ndim", 0) != 0:
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def as_int(value: Any) -> Any:
    """attrs converter: an integer of another type (a numpy int) becomes a Python int; anything else
    (a bool, a float, a string) is kept as given, for the field's check to refuse by name."""
    whole = whole_int(value)
    return value if whole is None else whole


class Checker:
    """Accumulates :class:`Problem` records; :meth:`raise_if_any` raises one SpecError with all."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.problems: list[Problem] = []

    def add(self, field: str, value: Any, limit: str, fix: str) -> None:
        """Record one problem on ``owner.field``."""
        self.problems.append(Problem(field=f"{self.owner}.{field}", value=value, limit=limit, fix=fix))

    def positive_int(self, field: str, value: Any, *, limit: str = "must be an integer > 0",
                     fix: str | None = None) -> bool:
        """Record a problem unless ``value`` is an integer > 0 (see the module docstring); returns whether
        it was fine. ``limit`` / ``fix`` replace the generic texts (``fix`` defaults to "set <field> to a
        positive integer")."""
        whole = whole_int(value)
        if whole is None or whole <= 0:
            self.add(field, value, limit + got(value),
                     (f"set {field} to a positive integer" if fix is None else fix) + _as_int(value, 1))
            return False
        return True

    def non_negative_int(self, field: str, value: Any) -> bool:
        """Record a problem unless ``value`` is an integer >= 0."""
        whole = whole_int(value)
        if whole is None or whole < 0:
            self.add(field, value, "must be an integer >= 0" + got(value), f"set {field} to 0 or a positive integer"
                     + _as_int(value, 0))
            return False
        return True

    def raise_if_any(self) -> None:
        """Raise one :class:`SpecError` holding every recorded problem."""
        if self.problems:
            raise SpecError(*self.problems)


def got(value: Any) -> str:
    """`` (got float)`` when ``value`` is not an integer (a bool included), else ``""``."""
    if is_bool(value):
        return " (got a bool)"
    if value is None:
        return " (got None)"
    return "" if whole_int(value) is not None else f" (got {type(value).__name__})"


def _as_int(value: Any, minimum: int) -> str:
    """A hint for a whole float (``4.0``): the int to pass instead."""
    if isinstance(value, float) and value.is_integer() and value >= minimum:
        return f" (a Python int: {int(value)})"
    return ""


def int_problems(field: str, value: Any, minimum: int, fix: str) -> list[Problem]:
    """``[]`` when ``value`` is an integer >= ``minimum`` (see the module docstring), else one problem
    naming ``field`` (for function arguments, which carry no owner prefix)."""
    whole = whole_int(value)
    if whole is None or whole < minimum:
        return [Problem(field=field, value=value, limit=f"must be an integer >= {minimum}" + got(value),
                        fix=fix + _as_int(value, minimum))]
    return []


def count_arg(field: str, value: Any, minimum: int, fix: str) -> int:
    """A function argument that counts something: ``value`` as a Python int >= ``minimum`` (numpy ints
    too), else a :class:`SpecError` naming ``field`` — a bool, a float (``1.5``, even ``4.0``), a
    string or ``None`` is refused, never truncated."""
    whole = whole_int(value)
    if whole is None or whole < minimum:
        raise SpecError(Problem(field=field, value=value, limit=f"must be an integer >= {minimum}" + got(value),
                                fix=fix + _as_int(value, minimum)))
    return whole


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)
