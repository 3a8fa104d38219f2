"""An explicit, scoped forward context: how per-step metadata reaches attention layers.

A serving step enters ``with forward_context(ctx, shape):`` around the model call; attention and
state layers read the step's persistent buffers with :func:`current_context` and its
:class:`~graphkv.runtime.capture.shape.StepShape` (sizes, padding, graph key) with
:func:`current_shape`. The values live in :class:`contextvars.ContextVar` s, so they are scoped to
the ``with`` block (and to the thread / task), never a mutable module global, and nesting restores
the outer values on exit.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Mapping

import attrs
import torch
from torch.nn.attention.flex_attention import BlockMask

from graphkv.errors import CaptureError, Problem
from graphkv.plan.plan import Plan
from graphkv.runtime.capture.shape import StepShape, current_shape, shape_context
from graphkv.runtime.flex.mask import FlexMaskBuilder

__all__ = ["StepContext", "current_context", "current_shape", "forward_context"]

_CONTEXT: contextvars.ContextVar[Any] = contextvars.ContextVar("graphkv_forward_context")


@contextlib.contextmanager
def forward_context(ctx: Any, shape: StepShape | None = None) -> Iterator[Any]:
    """Make ``ctx`` the current forward context and ``shape`` the current step shape inside the
    ``with`` block (``shape=None`` keeps the enclosing one). Capture-safe (host only)."""
    token = _CONTEXT.set(ctx)
    try:
        with shape_context(shape) if shape is not None else contextlib.nullcontext():
            yield ctx
    finally:
        _CONTEXT.reset(token)


def current_context() -> Any:
    """The context of the innermost enclosing :func:`forward_context` block.

    Raises :class:`CaptureError` when called outside one (a layer ran without step metadata).
    """
    try:
        return _CONTEXT.get()
    except LookupError:
        raise CaptureError(Problem(field="forward_context", value=None,
                                   limit="an attention / state layer ran outside a forward_context block",
                                   fix="run the model through Step.run, or inside `with forward_context(step.context):`")) from None


@attrs.frozen(kw_only=True, eq=False)
class StepContext:
    """What attention and state layers read during a step (through ``current_context()``).

    Every tensor is a persistent buffer (or a view of one) sized for the plan's maxima; a layer
    uses the first ``num_tokens`` rows, where ``num_tokens`` is its input's length (the padded
    size inside a graph). Per batch row (``[max_num_seqs]``): ``query_start_loc`` (``+1``
    entries, int32), ``seq_lens`` (int32), ``query_lens`` / ``context_lens`` (int64),
    ``row_valid`` (bool). Per token (``[max_num_batched_tokens]``, int64): ``positions``,
    ``token_row`` (-1 for padding), ``token_offset`` (index inside its request's query).
    ``slot_mappings[g]``, ``block_tables[g]`` (kernel blocks, per batch row) and
    ``state_indices[g]`` (int64 page of each batch row's state, null page 0 for rows past the
    step) per group; ``num_reqs`` (0-d int32) and the flex ``mask_builders`` by group.
    """

    plan: Plan
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    query_lens: torch.Tensor
    context_lens: torch.Tensor
    row_valid: torch.Tensor
    num_reqs: torch.Tensor
    positions: torch.Tensor
    token_row: torch.Tensor
    token_offset: torch.Tensor
    slot_mappings: torch.Tensor
    block_tables: tuple[torch.Tensor, ...]
    state_indices: Mapping[int, torch.Tensor]
    mask_builders: Mapping[int, FlexMaskBuilder]
    group_of_layer: Mapping[str, int]

    def group(self, layer_name: str) -> int:
        """The KV-cache group index of ``layer_name``."""
        return self.group_of_layer[layer_name]

    def build_masks(self, num_tokens_padded: int) -> dict[int, BlockMask]:
        """Build every flex group's block mask for a forward over ``num_tokens_padded`` tokens.

        Call it once at the top of the forward and hand the masks to the attention layers: it
        rewrites persistent buffers from the step's tables with in-place device ops (no host
        sync), so inside a captured graph each replay rebuilds the masks for its step."""
        return {g: b.build(self.num_reqs, num_tokens_padded=num_tokens_padded)
                for g, b in self.mask_builders.items()}
