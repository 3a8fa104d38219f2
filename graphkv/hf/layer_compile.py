"""Decoder layers compiled one by one (``trace_layers=True``): set-up traces one layer of each structure, on any torch.

Under ``compile="piecewise"`` / ``"fused"`` graphkv.hf compiles the paged view's whole forward, and Dynamo traces it
op by op, every layer again. torch 2.12 and later stamp a traced layer out for the others
(:mod:`graphkv.hf.layer_regions`); torch 2.11, the version the lent H100s run, traces all of them: the 0.94B
benchmark model's set-up spent 13.4 s in Dynamo there (2026-11-27), most of issue 20's ten seconds.

With ``trace_layers`` the forward around the layers runs eagerly and every decoder layer calls one compiled function
(a fresh code object per :class:`~graphkv.hf.model.PagedModel`) with the layer as its argument. Dynamo lifts a
module's parameters and buffers as the graph's inputs (``inline_inbuilt_nn_modules``, torch 2.5 and later), so the
guards of a trace hold for every layer of the same structure: the first layer's trace, split and Inductor compile
serve the others, and a model with sliding and full layers (or attention and state layers) traces one of each. The
piecewise backend splits the layer at its attention (or state-mixer) op as it splits a whole forward; its runners
key their graphs by layer (:func:`~graphkv.runtime.capture.piecewise.layer_scope`), since one runner now serves
every layer. The layer's index reaches its attention op as a tensor buffer
(:func:`~graphkv.hf.layer_ops.layer_id`), never as a Python constant, so no guard names a layer.

The modules the forward runs around the layers (the embedding, the rotary tables, the final norm:
:func:`around_layers`) are compiled each on its own the same way (:func:`compile_around_layers`), so they are fused
and, in mixed steps, captured, and the first layer reads the embedding's output in the graph pool. What it costs:
Inductor fuses nothing across a layer boundary (the residual add that ends a layer and the norm that starts the
next are one kernel in a whole-forward trace, two here); a PIECEWISE mixed key holds about twice the piece graphs
(two per layer, one per module around them, where a whole forward has one per layer and one more) and replays them
one by one; each layer call of an uncaptured step passes Dynamo's guards; and what the forward computes outside
these modules runs eagerly (the head's matmul and the gather of the logits rows; a family's own extra steps). On a
CPU every piece runs eagerly, so the graph keys, replays and weak views of this path ran only in a rehearsal.

Measured on a 2-core CPU (torch 2.11.0, transformers 5.17, 16-layer tiny Qwen3, ``compile="fused"``, a short
serving run, cold Inductor cache): Dynamo 2.6 s against 10.8-11.3 s for the whole forward, set-up and run 29-30 s
against 41-42 s (5 small Inductor compiles against 3 larger ones).
"""

from __future__ import annotations

import inspect
import logging
import types
from typing import Any, Callable, Iterator

import torch

from graphkv.hf.layer_ops import LAYER_BUFFER, active_paged_step
from graphkv.runtime.capture.piecewise import layer_scope
from graphkv.runtime.flex.region import fresh_function

__all__ = ["LAYER_STEP_INPUTS", "CompiledLayer", "around_layers", "compile_around_layers", "compile_layers",
           "decoder_layers", "layer_step_inputs"]

logger = logging.getLogger(__name__)

LAYER_STEP_INPUTS = ("hidden_states", "position_embeddings", "position_ids", "cache_position")
"""A decoder layer's inputs sized by the step's tokens and built together for it (one length, contiguous): the
shape guard's equalities between their sizes and strides hold by construction (``step_size_guard_filter``)."""


def _layer_lists(view: torch.nn.Module) -> list[torch.nn.ModuleList]:
    """The ``ModuleList`` s of ``view`` that hold a planned layer (a module with the
    :data:`~graphkv.hf.layer_ops.LAYER_BUFFER` buffer)."""
    return [m for m in view.modules()
            if isinstance(m, torch.nn.ModuleList) and any(_holds_planned(layer) for layer in m)]


def decoder_layers(view: torch.nn.Module, *, whole_lists: bool = False) -> Iterator[torch.nn.Module]:
    """The decoder layers of ``view`` (a paged view), in order: each element of a ``ModuleList`` that holds a planned
    layer (a module with the :data:`~graphkv.hf.layer_ops.LAYER_BUFFER` buffer); with ``whole_lists``, every element
    of such a list (a hybrid's MLP-only layers too, e.g. Nemotron-H's). Host only."""
    for module in _layer_lists(view):
        yield from (layer for layer in module if whole_lists or _holds_planned(layer))


def around_layers(view: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules the forward runs around its decoder layers: every other direct child of a module that holds a list
    of them (:func:`decoder_layers`), but module containers (a Llama-like model's embedding, rotary tables and final
    norm). Compiled, the embedding's output is graph-pool memory in a PIECEWISE key, which the first layer's pieces
    read in place; run eagerly it was a tensor each mixed key kept a copy of outside the pool. Host only."""
    holders = {id(m) for m in _layer_lists(view)}
    around = []
    for owner in view.modules():
        children = list(owner.children())
        if not any(id(c) in holders for c in children):
            continue
        around += [c for c in children if not isinstance(c, (torch.nn.ModuleList, torch.nn.ModuleDict,
                                                             torch.nn.Sequential))]
    return around


def _holds_planned(layer: torch.nn.Module) -> bool:
    return any(LAYER_BUFFER in m._buffers for m in layer.modules())


def _positional_names(layer: torch.nn.Module) -> tuple[str, ...]:
    """The names of ``layer``'s forward's positional parameters, past ``self``."""
    params = list(inspect.signature(type(layer).forward).parameters.values())[1:]
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def layer_step_inputs(view: torch.nn.Module) -> tuple[str, ...]:
    """:data:`LAYER_STEP_INPUTS` and the first parameter of every decoder layer's forward in ``view`` (its hidden
    states, by the name its family gives them: ``x`` in CTRL's layers) and of every module :func:`around_layers`
    (a rotary embedding's ``x``), the names the guard filter treats as built together for the step. Host only."""
    names = dict.fromkeys(LAYER_STEP_INPUTS)
    for layer in [*decoder_layers(view, whole_lists=True), *around_layers(view)]:
        names.update(dict.fromkeys(_positional_names(layer)[:1]))
    return tuple(names)


def _layer_forward(layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return type(layer).forward(layer, *args, **kwargs)


class CompiledLayer:
    """One decoder layer's ``forward`` through the model's shared compiled layer function: its positional arguments
    passed by name (so the guard filter names them), the step's token dimension of every ``[1, tokens, ...]`` input
    marked dynamic (one trace for every step size), and the call made inside the layer's
    :func:`~graphkv.runtime.capture.piecewise.layer_scope` (the layer's index and which call of it in the forward).
    Host work per call: a few dict operations, the mark of each such tensor no earlier call of the step marked (the
    rotary tables and positions once a step, the hidden states once a layer) and Dynamo's guards; FULL CUDA graphs
    replay without any of it."""

    def __init__(self, compiled: Callable[..., Any], layer: torch.nn.Module, index: int) -> None:
        self.compiled, self.index = compiled, index
        self.names = _positional_names(layer)
        self._step: Any = None  # the forward's PagedStep (held, so a later one cannot take its id) and the calls
        self._calls = 0  # made in it so far: a module called twice in one forward gets graphs for each call

    def _key(self) -> tuple[int, int]:
        step = active_paged_step()
        if step is None:  # outside a PagedModel's forward: no step to count calls in
            return self.index, 0
        if step is self._step:
            self._calls += 1
        else:
            self._step, self._calls = step, 0
        return self.index, self._calls

    def __call__(self, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(self.names):  # more positional arguments than named parameters: passed as they are
            with layer_scope(self._key()):
                return self.compiled(layer, *args, **kwargs)
        kwargs.update(zip(self.names, args))
        hidden = kwargs.get(self.names[0]) if self.names else None
        if isinstance(hidden, torch.Tensor) and hidden.dim() >= 2:
            tokens = hidden.shape[1] if hidden.shape[0] == 1 else hidden.shape[0]
            for value in kwargs.values():
                for t in (value if isinstance(value, (tuple, list)) else (value,)):
                    _mark_tokens(t, tokens)
        with layer_scope(self._key()):
            return self.compiled(layer, **kwargs)


def _mark_tokens(t: Any, tokens: int) -> None:
    """Mark the step's token dimension of ``t`` dynamic: dimension 1 of a ``[1, tokens, ...]`` tensor, dimension 0 of
    a ``[tokens]`` one (``cache_position``); a tensor an earlier call of the step marked is skipped
    (``maybe_mark_dynamic`` takes about 20 us a tensor on a 2-core CPU)."""
    if not isinstance(t, torch.Tensor):
        return
    if t.dim() >= 2 and t.shape[0] == 1 and t.shape[1] == tokens:
        dim = 1
    elif t.dim() == 1 and t.shape[0] == tokens:
        dim = 0
    else:
        return
    if dim not in getattr(t, "_dynamo_weak_dynamic_indices", ()):
        torch._dynamo.maybe_mark_dynamic(t, dim)


class _CountingBackend:
    """``backend`` for the compiled layer function, counting its traces: at torch's recompile limit (a code
    object's entries, 8 by default) Dynamo runs every later layer structure eagerly, and a warning says so once."""

    def __init__(self, backend: Callable[..., Any], name: str, what: str) -> None:
        self.backend, self.name, self.what, self.traces = backend, name, what, 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.traces += 1
        limit = getattr(torch._dynamo.config, "recompile_limit", None) or torch._dynamo.config.cache_size_limit
        if self.traces == limit:
            logger.warning("graphkv.hf: trace_layers traced %s %d times (%s), torch's recompile limit: its calls "
                           "differ by Python constants or by state passed between layers, so a structure not traced "
                           "yet runs eagerly (set TORCH_LOGS=recompiles to see what differs); pass trace_layers=False "
                           "to trace the whole forward", self.what, self.traces, self.name)
        return self.backend(gm, example_inputs)


def _compiled_forward(name: str, backend: Callable[..., Any], options: dict[str, Any], what: str) -> Any:
    """``torch.compile`` of a fresh copy of :func:`_layer_forward` named ``name``, its traces counted for the
    recompile-limit warning; each compile gets its own copy of ``options`` (torch.compile pops ``guard_filter_fn``
    from the dict it is given)."""
    return torch.compile(fresh_function(_layer_forward, name), backend=_CountingBackend(backend, name, what),
                         options=dict(options))


def compile_layers(view: torch.nn.Module, backend: Callable[..., Any], *, options: dict[str, Any],
                   name: str) -> int:
    """Route every decoder layer of ``view`` (:func:`decoder_layers`, whole lists) through one ``torch.compile`` of
    the layer's forward with ``backend`` and ``options`` (a fresh code object named ``name``); returns how many layers
    were routed. The view's own forward stays eager. Each layer structure is one compiled entry of that code object,
    so torch's recompile limit (8) bounds the structures a model may have: later ones run eagerly, and a warning
    says so when the limit is reached (layers that differ by an integer attribute, such as Beam's residual index, or
    by state one layer hands the next, such as Gemma-4's shared K/V, each trace anew). Host only (at set-up)."""
    compiled = _compiled_forward(name, backend, options, "the decoder layer")
    count = 0
    for index, layer in enumerate(list(decoder_layers(view, whole_lists=True))):
        layer.forward = types.MethodType(CompiledLayer(compiled, layer, index), layer)
        count += 1
    return count


def compile_around_layers(view: torch.nn.Module, backend: Callable[..., Any], *, options: dict[str, Any],
                          name: str) -> int:
    """Route every module :func:`around_layers` of ``view`` through a ``torch.compile`` of its own forward with
    ``backend`` and ``options`` (fresh code objects named ``name`` and the module's place), so the rotary tables and
    the final norm are fused and captured as the layers' pieces are, not run op by op; returns how many were routed.
    The head stays eager (one matmul, outside the model the layers belong to). Host only (at set-up)."""
    around = around_layers(view)
    for k, module in enumerate(around):
        label = f"{name}_{k}_{type(module).__name__}"
        compiled = _compiled_forward(label, backend, options, type(module).__name__)
        module.forward = types.MethodType(CompiledLayer(compiled, module, -1 - k), module)
    return len(around)
