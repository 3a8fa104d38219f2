"""Fused graph pieces: each piece of a split forward compiled by Inductor before it is captured.

A piece run as traced launches one kernel per op: a Qwen3 layer's norms, rotary and activations
are about 55 kernels per decode step, and inside a CUDA graph each costs its launch slot on the
device (about 2-3 us on an H100) whatever its size, so a small model's decode step is bound by
kernel count, not by the bytes it reads. Inductor fuses a piece's elementwise ops and reductions
into a few kernels around the matmuls. :func:`compile_pieces` compiles every graph piece of a
:class:`~graphkv.runtime.capture.split.SplitResult` with ``torch._inductor.compile_fx`` on
the shapes the forward was traced with (symbolic where Dynamo made them dynamic, so one compiled
piece serves every step size of that trace); the splitting ops (attention, state mixers) stay
outside, as they must for PIECEWISE capture.

The pieces' example inputs come from propagating the traced forward's own fake inputs (each
placeholder's ``example_value``) through the split module: the splitting ops run their
registered fake implementations. Pieces of the same structure (a model's middle layers) hit
Inductor's graph cache after the first, so compile time grows with the number of distinct
pieces, not with depth.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from graphkv.errors import CaptureError, Problem
from graphkv.runtime.capture.split import SplitResult

__all__ = ["compile_pieces", "has_ops"]


def has_ops(module: torch.fx.GraphModule) -> bool:
    """Whether a piece computes anything (a call): a piece that only passes values on is left as traced."""
    return any(node.op in ("call_function", "call_method", "call_module") for node in module.graph.nodes)


def _fake_inputs(gm: torch.fx.GraphModule) -> tuple[list[Any], Any]:
    """The traced forward's fake inputs (each placeholder's ``example_value``) and their fake mode: Dynamo's
    tracing mode, whose shape environment holds the trace's symbolic sizes (the backend's tracing context
    carries another mode, which refuses these fakes)."""
    fakes = [node.meta.get("example_value") for node in gm.graph.nodes if node.op == "placeholder"]
    mode = next((f.fake_mode for f in fakes if isinstance(f, torch._subclasses.FakeTensor)), None)
    if mode is None or any(f is None for f in fakes):
        raise CaptureError(Problem(field="compile", value="fused",
                                   limit="the traced forward carries no fake example values on its inputs "
                                         "(it was not traced by torch.compile's Dynamo)",
                                   fix="compile the forward with torch.compile(fn, backend=piecewise_backend(..., "
                                       "fuse=True)), or use compile='piecewise'"))
    return fakes, mode


def compile_pieces(split: SplitResult, gm: torch.fx.GraphModule) -> dict[str, Callable[..., Any]]:
    """Every graph piece of ``split`` (the split of ``gm``, a Dynamo-traced forward) that computes
    something, compiled by Inductor on the arguments it receives when ``gm``'s fake inputs run
    through the split module; by piece name. The compiled callables take the piece's arguments
    positionally (tensors and ints) and return what the piece returns. Host only; compiles
    (seconds per distinct piece), so call it once per trace, outside any capture."""
    from torch._inductor.compile_fx import compile_fx

    wanted = {p.name: p.module for p in split.graph_pieces if has_ops(p.module)}
    compiled: dict[str, Callable[..., Any]] = {}

    class _Compiling(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            out = super().call_module(target, args, kwargs)
            if target in wanted and target not in compiled:
                compiled[target] = compile_fx(wanted[target], list(args))
            return out

    from torch._dispatch.python import enable_python_dispatcher

    fakes, mode = _fake_inputs(gm)
    with mode, enable_python_dispatcher():  # symbolic sizes through Python meta kernels, as Dynamo runs them
        _Compiling(split.module).run(*fakes)
    missing = sorted(set(wanted) - set(compiled))
    assert not missing, f"graph pieces never called by the split module: {missing}"
    return compiled
