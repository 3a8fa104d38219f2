"""The paged layers as opaque torch custom ops, for a model compiled whole (``compile="model"``).

A compiled forward that reads the pool's caches and states as graph inputs and writes them in
place gets functionalized: every step copies whole layer caches (a tiny Qwen3's decode step cost
3 ms over a 4 MiB pool and 214 ms over a 512 MiB one on a CPU). So under ``torch.compile`` the two
layer kinds that touch the pool are custom ops the compiler cannot see into, taking the step's
activations, the layer's index and the constants its module passes (scale, window, soft-cap):

- ``graphkv::attention(query, key, value, sinks, layer, scale, window, window_given, softcap)``: the K/V write
  and the flex attention of one attention layer (through the model's compiled flex regions);
- ``graphkv::state_mixer(hidden, layer)``: one recurrent mixer's step (its projections, the packed
  state ops and their state-page writes).

``layer`` is the layer's index as a host tensor (:func:`layer_id`, a buffer of the layer's module in the paged
view), so layers of one structure trace to the same graph.

The ops find the step (its buffers, masks, the layer's binding or mixer) in a scoped context that
:class:`~graphkv.hf.model.PagedModel` enters around the forward (:func:`paged_step_context`).
``graphkv::attention`` is the name PIECEWISE capture splits at
(:data:`graphkv.runtime.capture.piecewise.SPLITTING_OPS`). Outside a compiled region the layers
call the same implementations directly (no op dispatch).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import torch

from graphkv.errors import CaptureError, Problem

__all__ = ["LAYER_BUFFER", "active_paged_step", "attention_op", "current_paged_step", "layer_id",
           "paged_step_context", "state_mixer_op"]

_STEP: contextvars.ContextVar[Any] = contextvars.ContextVar("graphkv_paged_step", default=None)


@contextlib.contextmanager
def paged_step_context(step: Any) -> Iterator[Any]:
    """Make ``step`` (a :class:`~graphkv.hf.attention.PagedStep`) the one the layer ops read inside
    the ``with`` block. Host only; capture-safe."""
    token = _STEP.set(step)
    try:
        yield step
    finally:
        _STEP.reset(token)


def active_paged_step() -> Any:
    """The :class:`~graphkv.hf.attention.PagedStep` of the forward being run, or ``None`` outside
    :meth:`PagedModel.forward`. Host only."""
    return _STEP.get()


def current_paged_step() -> Any:
    """The :class:`~graphkv.hf.attention.PagedStep` of the forward being run; :class:`CaptureError`
    outside :meth:`PagedModel.forward`."""
    step = active_paged_step()
    if step is None:
        raise CaptureError(Problem(field="graphkv::attention", value=None,
                                   limit="a paged layer op ran outside a PagedModel forward",
                                   fix="run the model through graphkv.hf.PagedModel inside Step.run"))
    return step


@torch.library.custom_op("graphkv::attention", mutates_args=())
def _attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor | None,
                  layer: torch.Tensor, scale: float | None, window: int | None, window_given: bool,
                  softcap: float | None) -> torch.Tensor:
    step = current_paged_step()
    index = int(layer)
    step.check_call(index, window=window, window_given=window_given, softcap=softcap)
    return step.attend(index, query, key, value, scale=scale, sinks=sinks).contiguous()


@_attention_op.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor | None, layer: torch.Tensor,
      scale: float | None, window: int | None, window_given: bool, softcap: float | None) -> torch.Tensor:
    return query.new_empty((query.shape[0], query.shape[1], value.shape[-1]))


@torch.library.custom_op("graphkv::state_mixer", mutates_args=())
def _state_mixer_op(hidden: torch.Tensor, layer: torch.Tensor) -> torch.Tensor:
    step = current_paged_step()
    mixer = step.mixers[int(layer)]
    return mixer.step(hidden, step).contiguous()


@_state_mixer_op.register_fake
def _(hidden: torch.Tensor, layer: torch.Tensor) -> torch.Tensor:
    return hidden.new_empty(hidden.shape)  # contiguous, as the op returns (empty_like would keep hidden's strides)


LAYER_BUFFER = "graphkv_layer"
"""The buffer naming a planned layer in the paged view (:func:`layer_id`), on its attention module or paged mixer."""


def layer_id(index: int) -> torch.Tensor:
    """Layer ``index`` as the ops take it: a 0-d int64 tensor on the host, a buffer of the layer's module in the
    paged view. A tensor, not an int: a compiled forward lifts it as an input, so every layer of one structure is
    the same traced code (an int would be a constant of each layer's trace), and the op reads it without a device
    sync. Host only (at set-up)."""
    return torch.tensor(index, dtype=torch.int64, device="cpu")  # on the host whatever the default device


def attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor | None,
                 layer: torch.Tensor, scale: float | None, *, window: int | None, window_given: bool,
                 softcap: float | None) -> torch.Tensor:
    """``graphkv::attention``: ``[T, Hq, D]`` of the step's packed ``[T, H, D]`` query / key /
    value of the attention layer whose :func:`layer_id` is ``layer`` (its transformers ``layer_idx``). ``window``
    (``window_given``: the module passed one at all) and ``softcap``: what the module asked for, checked against
    the layer's binding (:meth:`~graphkv.hf.attention.PagedStep.check_call`) when the op runs."""
    return torch.ops.graphkv.attention(query, key, value, sinks, layer, scale, window, window_given, softcap)


def state_mixer_op(hidden: torch.Tensor, layer: torch.Tensor) -> torch.Tensor:
    """``graphkv::state_mixer``: ``[T, hidden]`` of the recurrent layer whose :func:`layer_id` is ``layer``."""
    return torch.ops.graphkv.state_mixer(hidden, layer)
