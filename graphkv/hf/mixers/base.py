"""What every paged mixer shares: the wrapped module, its state views and group, the step lookup."""

from __future__ import annotations

from typing import Any

import torch

from graphkv.errors import CaptureError, Problem
from graphkv.hf.layer_ops import LAYER_BUFFER, active_paged_step, layer_id, state_mixer_op
from graphkv.runtime.state.rows import PackedRows

__all__ = ["PagedMixer"]


class PagedMixer(torch.nn.Module):
    """A recurrent mixer whose states live in pool state pages.

    ``mixer``: the paged view's copy of the transformers mixer (its parameters are the model's);
    ``states``: the layer's state views from ``KVPool.mamba_states`` (conv, then recurrent; a short
    convolution's conv state alone);
    ``group``: the layer's KV-cache group (its state page per batch row is
    ``ctx.state_indices[group]``); ``layer``: its transformers ``layer_idx``. Subclasses implement
    :meth:`mix`. Under ``torch.compile`` (a model compiled whole) the step runs as the opaque op
    ``graphkv::state_mixer`` (:mod:`graphkv.hf.layer_ops`), so the state pages never become graph
    inputs (a compiled in-place state write would copy every state of the layer each step).
    """

    def __init__(self, mixer: torch.nn.Module, *, name: str, states: tuple[torch.Tensor, ...], group: int,
                 layer: int) -> None:
        super().__init__()
        self.mixer = mixer
        self.name = name
        self.conv_state = states[0]
        self.ssm_state = states[1] if len(states) > 1 else None  # a short convolution keeps one state
        self.group = group
        self.layer = layer
        self.register_buffer(LAYER_BUFFER, layer_id(layer), persistent=False)  # the layer as the op names it

    def forward(self, hidden_states: torch.Tensor, *args: Any, graphkv: Any = None, **kwargs: Any) -> torch.Tensor:
        """``[1, T, hidden] -> [1, T, hidden]`` for the step in ``graphkv`` (or, where none is passed, the step's
        context; other arguments — the transformers cache and mask — are ignored: the pool holds the states);
        compiled (a forward compiled whole), the ``graphkv::state_mixer`` op reads the step when it runs.
        Capture-safe."""
        if torch.compiler.is_compiling():
            return state_mixer_op(hidden_states[0], getattr(self, LAYER_BUFFER))[None]
        step = graphkv if graphkv is not None else active_paged_step()  # a compiled forward run eagerly passes none
        if step is None:
            raise CaptureError(Problem(field=self.name, value=type(self.mixer).__name__,
                                       limit="a paged mixer ran without a step (no graphkv= argument, and no "
                                             "PagedModel step running)",
                                       fix="run the model through graphkv.hf.PagedModel inside Step.run"))
        return self.step(hidden_states[0], step)[None]

    def step(self, x: torch.Tensor, graphkv: Any) -> torch.Tensor:
        """``[T, hidden] -> [T, hidden]`` for the step in ``graphkv`` (a
        :class:`~graphkv.hf.attention.PagedStep`): :meth:`mix` at each row's state page."""
        if graphkv.rows is None:
            raise CaptureError(Problem(field=self.name, value=type(self.mixer).__name__,
                                       limit="a paged mixer ran in a step without its packed rows (a PagedModel "
                                             "without state layers)",
                                       fix="run the model through the graphkv.hf.PagedModel built for it"))
        return self.mix(x, graphkv.context.state_indices[self.group], graphkv.rows)

    def mix(self, x: torch.Tensor, pages: torch.Tensor, rows: PackedRows) -> torch.Tensor:
        """``[T, hidden] -> [T, hidden]``, reading and writing the states at ``pages``."""
        raise NotImplementedError
