"""A replayed step's outputs cut to the step, and the checks that make the cut safe.

A graph of key ``k`` computes ``k.num_tokens`` padded rows; the step had ``num_tokens <=
k.num_tokens``. Every output tensor's dim 0 must be the padded tokens (cut to ``num_tokens``) or
the padded request rows (cut to at most ``num_tokens`` rows, as the eager forward returns them). A
0-dim output has nothing to cut: a reduction over the padded rows includes the padding, so it is
refused (at capture, and on any replay). Host only; :func:`cut_to_step` allocates views only.

Example (a decode of 3 requests on a key of 4)::

    cut_to_step(logits_4_rows, shape)      # logits_4_rows[:3]
"""

from __future__ import annotations

from typing import Any

import torch

from graphkv.errors import CaptureError, Problem
from graphkv.runtime.capture.shape import StepShape
from graphkv.runtime.capture.weak import tree_map

__all__ = ["bad_shape", "check_outputs", "cut_to_step"]


def bad_shape(shape: StepShape, limit: str) -> CaptureError:
    """The error for a hand-made ``shape`` that breaks ``limit`` (its key's padded sizes, or an eager shape's)."""
    return CaptureError(Problem(
        field="shape", value=(f"num_tokens={shape.num_tokens!r}, num_reqs={shape.num_reqs!r}, num_tokens_padded="
                              f"{shape.num_tokens_padded!r}, num_reqs_padded={shape.num_reqs_padded!r}, uniform="
                              f"{shape.uniform!r}, key={shape.key}"),
        limit=limit,
        fix="decide the shape with this forward: Step.prepare(batch, forward=fwd) or fwd.shape_of(...)"))


def check_outputs(outputs: Any, shape: StepShape) -> None:
    """Refuse, at capture, outputs a replay of ``shape``'s key could not cut to a step (see :func:`cut_to_step`),
    and containers :func:`~graphkv.runtime.capture.weak.tree_map` cannot rebuild."""
    tree_map(lambda t: cut_to_step(t, shape), outputs)


def cut_to_step(t: torch.Tensor, shape: StepShape) -> torch.Tensor:
    """A padded step's output cut to the step: dim 0 is its padded tokens (cut to ``num_tokens``)
    or its padded request rows (one row per request, e.g. the last token's logits: cut to at most
    ``num_tokens`` rows, as the eager forward returns them); anything else is refused, a 0-dim
    output included (a reduction over the padded rows would include the padding)."""
    if not t.dim():
        raise CaptureError(Problem(
            field="forward output", value="a 0-dim tensor",
            limit=f"has no token or request dim to cut to the step's tokens: computed over the "
                  f"{shape.num_tokens_padded} padded rows of {shape.key} it includes the padding rows of every "
                  "shorter step",
            fix="return per-token or per-request rows ([num_tokens, ...]) and reduce them after the call"))
    rows = t.shape[0]
    if rows == shape.num_tokens_padded:
        return t.narrow(0, 0, shape.num_tokens)
    if rows == shape.num_reqs_padded:
        return t.narrow(0, 0, min(shape.num_tokens, rows))
    raise CaptureError(Problem(field="forward output", value=tuple(t.shape),
                               limit=f"dim 0 must be the step's padded tokens ({shape.num_tokens_padded}) or its "
                                     f"padded request rows ({shape.num_reqs_padded})",
                               fix="return token-major outputs ([num_tokens, ...]) or one row per request"))
