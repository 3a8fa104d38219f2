"""One trace of a compiled forward for every step size: the shape guard that only 0/1 specialisation wrote, dropped.

A step's token count is a *backed* dynamic size of the traced forward (Inductor sizes its kernels by it). Dynamo
specialises backed sizes at 0 and 1: a trace at 5 tokens serves every size of 2 or more, and its shape guard says
``2 <= tokens``, so the first 1-token step (every batch-1 decode step, a one-token chunk) failed it and Dynamo
traced the forward again, which then was split and (under ``compile="fused"``) compiled piece by piece a second
time. On a 2-core CPU that second trace was 6-7 s of a 16-layer tiny Qwen3's set-up (Dynamo's own metrics).

The first trace computes the same values for 1 token: nothing in a decoder's forward treats a step dimension of
size 1 differently (no broadcast of the step's tokens against a size-1 dimension, no squeeze of them), and Inductor's
kernels for a symbolic size mask any size. vLLM serves every batch size from one trace on the same ground (it drops
all of Dynamo's guards). graphkv drops much less: :func:`step_size_guard_filter` makes a ``guard_filter_fn`` (an
option of ``torch.compile``) that drops *only* the shape guard, and only when every expression in it is either

- a lower bound ``2 <= size`` (or stride, or offset) of an input: what 0/1 specialisation writes, or
- an equality between sizes / strides of the inputs the caller names as built together (a step's token ids and
  positions, of one length and contiguous by construction).

Any other expression (a dimension that happened to equal another at trace time and was unified with it, a bound
Dynamo derived from the model's code, ``size != 1`` from a branch) keeps the whole shape guard, and the forward
traces again when it fails. Every other guard (types, constants, tensor dtypes / devices / static sizes, grad mode)
is kept. What no guard shows: a branch on ``size == 1`` that Dynamo decided from the range 0/1 specialisation gave
(``size >= 2``) without writing a guard of its own; and a branch such as ``if size > 1`` or a
``torch._check(size >= 2)`` writes the same ``2 <= size`` and is dropped with it. A forward that served 1-token
steps differently that way would now serve them as it serves larger ones; the hf tests check the core families'
tokens against transformers' ``generate`` through batch-1 decode steps, which run on that one trace.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Collection, Sequence

__all__ = ["StepSizeGuardFilter", "droppable_shape_guard", "step_size_guard_filter"]

logger = logging.getLogger(__name__)

_ACCESS = r"L(?:\[[^\]]+\])*?\['(\w+)'\]\.(?:size\(\)\[\d+\]|stride\(\)\[\d+\]|storage_offset\(\))"
_LOWER_BOUND = re.compile(rf"^2 <= {_ACCESS}$")
_EQUALITY = re.compile(rf"^{_ACCESS} == {_ACCESS}$")


def droppable_shape_guard(expressions: Sequence[str], built_together: Collection[str]) -> bool:
    """Whether a shape guard of these Python ``expressions`` (Dynamo's guard code, e.g.
    ``"2 <= L['kwargs']['input_ids'].size()[1]"``) only says what 0/1 specialisation and the inputs'
    construction say: each is a lower bound of 2 on a size, stride or offset, or an equality between sizes / strides of
    inputs named in ``built_together``. An empty list is not droppable (nothing to drop). Host only."""
    if not expressions:
        return False
    for expression in expressions:
        if _LOWER_BOUND.match(expression):
            continue
        equality = _EQUALITY.match(expression)
        if equality is None or not set(equality.groups()) <= set(built_together):
            return False
    return True


class StepSizeGuardFilter:
    """A ``guard_filter_fn`` for ``torch.compile(..., options={"guard_filter_fn": ...})``: keeps every guard but a
    shape guard that :func:`droppable_shape_guard` drops (its inputs in ``built_together`` by name, e.g.
    ``("input_ids", "position_ids")``), so one trace at 2 tokens or more serves 1-token steps too. Dynamo calls it
    on the host when it builds a trace's guards.

    A shape guard it keeps is recorded in :attr:`kept` (its expressions, one tuple per trace) and logged once at
    INFO: the expressions that are not 0/1 specialisation say why a later step size traces the forward again (an
    H100 traced graphkv.hf's forward twice where a CPU traced it once, 2026-11-27)."""

    def __init__(self, built_together: Collection[str]) -> None:
        self.built_together = tuple(built_together)
        self.kept: list[tuple[str, ...]] = []

    def __call__(self, entries: Sequence[Any]) -> list[bool]:
        """Keep (True) or drop (False) each of Dynamo's guard entries."""
        decisions = []
        for entry in entries:
            if entry.guard_type != "SHAPE_ENV":
                decisions.append(True)
                continue
            code = tuple(getattr(entry.orig_guard, "code_list", None) or ())
            drop = droppable_shape_guard(code, self.built_together)
            if not drop and code:
                self.kept.append(code)
                other = [c for c in code if not _LOWER_BOUND.match(c)]
                logger.info("graphkv: the compiled forward keeps its shape guard (a step outside it traces the "
                            "forward again); beyond 0/1 specialisation it holds: %s", "; ".join(other))
            decisions.append(not drop)
        return decisions


def step_size_guard_filter(built_together: Collection[str]) -> StepSizeGuardFilter:
    """A :class:`StepSizeGuardFilter` for the inputs ``built_together`` (by name)."""
    return StepSizeGuardFilter(built_together)
