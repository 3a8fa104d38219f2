"""Release numbers of installed libraries, for the few rules that depend on them (torch, Triton, numpy).

Example::

    release("2.11.0+cu130")  # -> (2, 11)
"""

from __future__ import annotations

import re

__all__ = ["release"]


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``torch.__version__`` (``"2.13.0.dev20261101+cpu"`` ->
    ``(2, 13)``); ``(0, 0)`` where it starts with none (``"unknown"``), which every rule reads as too old."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else (0, 0)
