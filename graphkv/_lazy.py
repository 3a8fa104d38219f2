"""Lazy package exports: a package lists which module defines each public name, and the name's module
is imported on first access (so ``import graphkv.runtime`` does not import Triton, nor
``import graphkv.memory`` torch or pynvml)."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, modules: Mapping[str, str],
                 names: "list[str] | tuple[str, ...]") -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``modules`` maps each lazily exported name
    to the module that defines it; ``names`` is the package's ``__all__``.

    Example (in a package's ``__init__.py``)::

        __all__ = ["Step"]
        __getattr__, __dir__ = lazy_exports(__name__, {"Step": "graphkv.runtime.step.step"}, __all__)
    """
    def getattr_(name: str) -> Any:
        if name in modules:
            return getattr(importlib.import_module(modules[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(names)

    return getattr_, dir_
