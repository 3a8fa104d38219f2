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
from graphkv.runtime.capture.keys import GraphKey
from graphkv.runtime.capture.shape import StepShape
from graphkv.runtime.capture.weak import tree_map

__all__ = ["bad_shape", "check_eager_shape", "check_fits_key", "check_outputs", "cut_to_step"]


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


def check_fits_key(shape: StepShape, key: GraphKey, max_num_seqs: int) -> None:
    """Refuse a replayed ``shape`` that does not fit ``key`` (its padded sizes, at most as many tokens and requests,
    uniform where the key is): the cut would slice a graph's outputs wrongly. A few comparisons (per step)."""
    reqs = key.num_reqs if key.num_reqs is not None else min(key.num_tokens, max_num_seqs)
    num_tokens = shape.num_tokens
    if not (shape.num_tokens_padded == key.num_tokens and shape.num_reqs_padded == reqs and type(num_tokens) is int
            and 0 < num_tokens <= key.num_tokens and type(shape.num_reqs) is int and 0 < shape.num_reqs <= reqs
            and (shape.uniform or not key.uniform)):
        raise bad_shape(shape, f"does not fit its key: a step on {key} has num_tokens_padded={key.num_tokens} "
                               f"and num_reqs_padded={reqs}, 1 <= num_tokens <= {key.num_tokens}, 1 <= num_reqs "
                               f"<= {reqs}" + (" and uniform=True" if key.uniform else ""))


def check_eager_shape(shape: StepShape) -> None:
    """Refuse an eager ``shape`` that is padded: an eager step runs on its own sizes."""
    num_tokens = shape.num_tokens
    if type(num_tokens) is not int or num_tokens < 1 or shape.num_tokens_padded != num_tokens \
            or shape.num_reqs_padded != shape.num_reqs:
        raise bad_shape(shape, "an eager shape runs on its own sizes: num_tokens an int >= 1, "
                               "num_tokens_padded == num_tokens and num_reqs_padded == num_reqs")
