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
  positions, of one length and contiguous by construction), or between a stride and a constant times a size (the
  token stride of a contiguous ``[1, tokens, hidden]`` input is ``hidden * tokens``); never a size and a constant
  times a size.

An input is named by its argument name; an element of a tuple argument (a decoder layer's ``position_embeddings``,
``(cos, sin)``) by the tuple's name.

Any other expression (a dimension that happened to equal another at trace time and was unified with it, a bound
Dynamo derived from the model's code, ``size != 1`` from a branch) keeps the whole shape guard, and the forward
traces again when it fails. Every other guard (types, constants, tensor dtypes / devices / static sizes, grad mode)
is kept. What no guard shows: a branch on ``size == 1`` that Dynamo decided from the range 0/1 specialisation gave
(``size >= 2``) without writing a guard of its own; and a branch such as ``if size > 1`` or a
``torch._check(size >= 2)`` writes the same ``2 <= size`` and is dropped with it. A forward that served 1-token
steps differently that way would now serve them as it serves larger ones; the hf tests check the core families'
tokens against transformers' ``generate`` through batch-1 decode steps, which run on that one trace.

On a GPU the shape guard holds more: Inductor's Triton code generator (the GPU's; a CPU's C++ one does not) proves
that each kernel may index in 32 bits and writes that proof as guards on the step's size, ``64*tokens <=
2147483647`` for a kernel over 64 values per token, and Dynamo then writes the size's range as ``2 <= tokens and
tokens <= 2147483647`` (torch 2.11 and 2.13: ``SIMDScheduling.can_use_32bit_indexing``). That kept the whole guard,
and an H100 traced graphkv.hf's forward twice (2026-11-27) where a CPU traced it once. Such an upper bound is
dropped too, but only on a size of an input the caller names as step-sized and only when it holds at the largest
step the caller will run (``max_step``): ``c * max_step <= N``. It then holds at every step size from 1 to
``max_step``, so dropping it changes nothing (no index passes 2**31 - 1). A model whose largest step would overflow
32-bit indexing (a 152k vocabulary's logits over 16k rows) keeps the guard and traces again, as before.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Collection, Sequence

__all__ = ["StepSizeGuardFilter", "droppable_shape_guard", "step_size_guard_filter"]

logger = logging.getLogger(__name__)

_ACCESS = r"L(?:\[[^\]]+\])*?\['(\w+)'\](?:\[\d+\])?\.(?:size\(\)\[\d+\]|stride\(\)\[\d+\]|storage_offset\(\))"
_LOWER_BOUND = re.compile(rf"^2 <= {_ACCESS}$")
_EQUALITY = re.compile(rf"^{_ACCESS} == {_ACCESS}$")
_SIZE = r"L(?:\[[^\]]+\])*?\['(\w+)'\](?:\[\d+\])?\.size\(\)\[(\d+)\]"
_STRIDE = r"L(?:\[[^\]]+\])*?\['(\w+)'\](?:\[\d+\])?\.stride\(\)\[\d+\]"
_STRIDE_OF_SIZE = re.compile(rf"^{_STRIDE} == \d+\*{_SIZE}$")  # a contiguous input's stride: c times a size
_UPPER_BOUND = re.compile(rf"^(?:(\d+)\*)?{_SIZE} <= (\d+)$")  # Inductor's 32-bit indexing proof
_RANGE = re.compile(rf"^2 <= {_SIZE} and {_SIZE} <= (\d+)$")  # Dynamo's range of one size bounded both ways


def _droppable(expression: str, built_together: Collection[str], step_sized: Collection[str],
               max_step: int | None) -> bool:
    """Whether one expression of a shape guard is droppable (see :func:`droppable_shape_guard`)."""
    if _LOWER_BOUND.match(expression):
        return True
    equality = _EQUALITY.match(expression) or _STRIDE_OF_SIZE.match(expression)
    if equality is not None:
        return {equality.group(1), equality.group(2)} <= set(built_together)
    if max_step is None:
        return False
    bound = _UPPER_BOUND.match(expression)
    if bound is not None:
        return bound.group(2) in step_sized and int(bound.group(1) or 1) * max_step <= int(bound.group(4))
    both = _RANGE.match(expression)  # the same input and dimension on both sides
    return (both is not None and both.group(1, 2) == both.group(3, 4) and both.group(1) in step_sized
            and max_step <= int(both.group(5)))


def droppable_shape_guard(expressions: Sequence[str], built_together: Collection[str], *,
                          step_sized: Collection[str] = (), max_step: int | None = None) -> bool:
    """Whether a shape guard of these Python ``expressions`` (Dynamo's guard code, e.g.
    ``"2 <= L['kwargs']['input_ids'].size()[1]"``) only says what 0/1 specialisation, the inputs' construction and
    the step's largest size say: each is a lower bound of 2 on a size, stride or offset; an equality between sizes /
    strides of inputs named in ``built_together``; or, with ``max_step``, an upper bound ``c * size <= N`` (or the
    range ``2 <= size and size <= N``) on a size of an input named in ``step_sized`` that holds at ``size =
    max_step``. An empty list is not droppable (nothing to drop). Host only.

    >>> ids = "L['kwargs']['input_ids'].size()[1]"
    >>> droppable_shape_guard([f"2 <= {ids}", f"64*{ids} <= 2147483647"], (), step_sized=("input_ids",), max_step=8192)
    True
    >>> droppable_shape_guard([f"64*{ids} <= 2147483647"], (), step_sized=("input_ids",), max_step=2**26)
    False
    """
    return bool(expressions) and all(_droppable(e, built_together, step_sized, max_step) for e in expressions)


class StepSizeGuardFilter:
    """A ``guard_filter_fn`` for ``torch.compile(..., options={"guard_filter_fn": ...})``: keeps every guard but a
    shape guard that :func:`droppable_shape_guard` drops (its inputs in ``built_together`` by name, e.g.
    ``("input_ids", "position_ids")``), so one trace at 2 tokens or more serves 1-token steps too. Dynamo calls it
    on the host when it builds a trace's guards.

    A shape guard it keeps is recorded in :attr:`kept` (its expressions, one tuple per trace) and logged once at
    INFO: the expressions that are not 0/1 specialisation say why a later step size traces the forward again (an
    H100 traced graphkv.hf's forward twice where a CPU traced it once, 2026-11-27)."""

    def __init__(self, built_together: Collection[str], *, step_sized: Collection[str] = (),
                 max_step: int | None = None) -> None:
        self.built_together, self.step_sized, self.max_step = tuple(built_together), tuple(step_sized), max_step
        self.kept: list[tuple[str, ...]] = []

    def __call__(self, entries: Sequence[Any]) -> list[bool]:
        """Keep (True) or drop (False) each of Dynamo's guard entries."""
        decisions = []
        for entry in entries:
            if entry.guard_type != "SHAPE_ENV":
                decisions.append(True)
                continue
            code = tuple(getattr(entry.orig_guard, "code_list", None) or ())
            other = [c for c in code if not _droppable(c, self.built_together, self.step_sized, self.max_step)]
            if code and other:  # kept (droppable_shape_guard is False)
                self.kept.append(code)
                logger.info("graphkv: the compiled forward keeps its shape guard (a step outside it traces the "
                            "forward again); what it holds beyond the droppable: %s", "; ".join(other))
            decisions.append(not code or bool(other))
        return decisions


def step_size_guard_filter(built_together: Collection[str], *, step_sized: Collection[str] = (),
                           max_step: int | None = None) -> StepSizeGuardFilter:
    """A :class:`StepSizeGuardFilter` for the inputs ``built_together`` (by name), dropping upper bounds on the sizes of
    ``step_sized`` inputs that hold at ``max_step`` (the largest step size the caller runs)."""
    return StepSizeGuardFilter(built_together, step_sized=step_sized, max_step=max_step)
