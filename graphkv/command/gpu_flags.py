"""``--gpu`` / ``--arch``: the GPU whose backends the model reader plans for, and its refusals in the flag typed.

``--gpu NAME`` sizes the budget and picks the backends vLLM runs on that GPU's architecture; ``--arch`` picks them
without a GPU budget (with ``--kv-memory``) and must agree with ``--gpu`` when both are given. The model reader
takes either as its ``gpu`` argument (:func:`graphkv.spec.hf_config.model_from_hf_config`), so a problem it records
on ``gpu`` is the ``--arch`` flag's when that is what the user typed (:func:`gpu_problems_as_typed`).
"""

from __future__ import annotations

from typing import Any

import attrs

from graphkv.errors import GraphkvError, Problem, SpecError
from graphkv.spec.budget import arch_of

__all__ = ["gpu_override", "gpu_problems_as_typed"]


def gpu_override(arch: str | None, gpu: str | None) -> dict[str, Any]:
    """The reader's ``gpu`` keyword for ``--arch`` and ``--gpu`` (``--arch`` wins; neither: none). Raises
    :class:`SpecError` on ``--arch`` when it is not ``--gpu``'s architecture."""
    if arch is not None and gpu is not None and arch_of(gpu) not in (None, arch):
        raise SpecError(Problem(field="--arch", value=arch, limit=f"contradicts --gpu {gpu}, an {arch_of(gpu)} GPU",
                                fix=f"drop --arch (--gpu {gpu} plans {arch_of(gpu)}'s backends) or name another GPU"))
    chosen = arch if arch is not None else gpu
    return {} if chosen is None else {"gpu": chosen}


def gpu_problems_as_typed(error: GraphkvError, *, arch: str | None, gpu: str | None) -> GraphkvError:
    """``error`` with the reader's problems on ``gpu`` on the ``arch`` field (``--arch``) when ``--arch`` was typed
    and ``--gpu`` was not; otherwise ``error`` itself."""
    if arch is None or gpu is not None or not any(p.field == "gpu" for p in error.problems):
        return error
    return type(error)(*(attrs.evolve(p, field="arch") if p.field == "gpu" else p for p in error.problems))
