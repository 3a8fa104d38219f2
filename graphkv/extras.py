"""Which optional dependencies ("extras") each part of graphkv needs, and the error when one is missing.

``pip install graphkv`` installs the planner only (attrs, typing-extensions): ``graphkv plan``,
:mod:`graphkv.spec`, :mod:`graphkv.plan`. The runtime, the kernels and the demo need the
``runtime`` extra (torch, Triton, numpy, nvidia-ml-py); :mod:`graphkv.hf` adds the ``hf`` extra
(transformers); the tests need ``dev``.
"""

from __future__ import annotations

import importlib.util
import types
from typing import Mapping

from graphkv.errors import MissingExtraError, Problem

__all__ = ["EXTRAS", "require"]

EXTRAS: Mapping[str, tuple[str, ...]] = types.MappingProxyType({
    "runtime": ("torch", "triton", "numpy", "nvidia-ml-py"),
    "bench": ("matplotlib",),
    "hf": ("transformers",),
})


def require(extra: str, module: str, *, needed_by: str) -> None:
    """Raise :class:`MissingExtraError` unless ``module`` can be imported.

    ``needed_by`` names the graphkv part that needs it (it appears in the message). Does not
    import ``module`` itself (``find_spec`` only looks it up), so the check costs microseconds.
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module left half-imported
        found = False
    if not found:
        raise MissingExtraError(Problem(
            field=needed_by, value=module,
            limit=f"needs the Python package '{module}', which is not installed (it comes with the "
                  f"'{extra}' extra: {', '.join(EXTRAS.get(extra, (module,)))})",
            fix=f"pip install 'graphkv[{extra}]' (planning alone — graphkv plan, graphkv.compile — needs no extra)"))
