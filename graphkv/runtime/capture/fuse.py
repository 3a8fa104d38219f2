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
registered fake implementations. Pieces of the same structure (a model's middle layers: the same
ops on arguments of the same shapes, strides and dtypes, only the weights differ) share one
compiled callable (:func:`piece_key`): Inductor compiles each distinct piece once and the others
skip even its trace and cache lookup, so compile time grows with the number of distinct pieces,
not with depth.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Mapping

import attrs
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from graphkv.errors import CaptureError, Problem
from graphkv.runtime.capture.split import SplitResult

__all__ = ["CompiledPieces", "compile_pieces", "has_ops", "piece_key", "specialize_float_inputs", "traced_args"]

_MISSING = object()  # no value: a placeholder without an example value, an attribute that is not there


def has_ops(module: torch.fx.GraphModule) -> bool:
    """Whether a piece computes anything (a call): a piece that only passes values on is left as traced."""
    return any(node.op in ("call_function", "call_method", "call_module") for node in module.graph.nodes)


def _value_key(value: Any) -> Any:
    """What a compiled piece may assume of one argument: a tensor's class, shape, strides, storage offset,
    dtype and device with its index (symbolic sizes by their expressions), a symbolic int's expression, another
    value itself (it is baked into the compiled code)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", type(value), tuple(str(d) for d in value.shape), tuple(str(d) for d in value.stride()),
                str(value.storage_offset()), value.dtype, str(value.device), value.requires_grad)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", type(value).__name__, str(value))
    return ("value", type(value).__name__, repr(value))


def piece_key(module: torch.fx.GraphModule, args: Any) -> tuple[Any, ...]:
    """A piece's structure on ``args``: every node's op, target and arguments (other nodes by their
    position, so names do not matter), each placeholder's argument by :func:`_value_key`, which tensor
    arguments share storage, and each attribute or submodule a node reads by identity. Two pieces with
    equal keys compute the same function of their arguments, so one compiled callable serves both (a
    model's middle layers differ only in the weight tensors they are given; a piece that holds its
    weights as attributes or submodules shares with no other)."""
    position = {node: i for i, node in enumerate(module.graph.nodes)}

    def arg(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return ("node", position[a])
        if isinstance(a, (tuple, list)):
            return (type(a).__name__, tuple(arg(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, arg(v)) for k, v in a.items()))
        if isinstance(a, slice):
            return ("slice", arg(a.start), arg(a.stop), arg(a.step))
        return _value_key(a)

    placeholders = iter(args)
    key: list[Any] = []
    for node in module.graph.nodes:
        if node.op == "placeholder":
            key.append(("placeholder", _value_key(next(placeholders, None))))
        elif node.op in ("get_attr", "call_module"):  # a constant or a module of this piece: the same object only
            found = _attribute(module, node.target)
            key.append((node.op, ("missing", node.target) if found is _MISSING else id(found), arg(node.args),
                        arg(node.kwargs)))
        else:  # the function itself (a bound method with its object), or a method's name
            key.append((node.op, _hashable(node.target), arg(node.args), arg(node.kwargs)))
    storages: dict[Any, int] = {}  # which tensor arguments share storage (AOTAutograd compiles for that aliasing)
    aliases = tuple(storages.setdefault(StorageWeakRef(a.untyped_storage()), i)
                    for i, a in enumerate(args) if isinstance(a, torch.Tensor))
    return (*key, ("aliases", aliases))


def _hashable(target: Any) -> Any:
    """``target`` itself where it can be a dictionary key (functions, ops and bound methods compare by identity),
    else its identity."""
    try:
        hash(target)
    except TypeError:
        return ("id", id(target))
    return target


def _attribute(module: torch.nn.Module, target: str) -> Any:
    """The attribute or submodule ``target`` (a dotted path) of ``module`` names; ``_MISSING`` where there is none."""
    for name in target.split("."):
        module = getattr(module, name, _MISSING)
        if module is _MISSING:
            return _MISSING
    return module


@attrs.frozen(kw_only=True)
class CompiledPieces:
    """:func:`compile_pieces`' result: ``callables`` by piece name (read-only), and ``num_compiles``, the
    Inductor compiles made (distinct pieces; the rest share one of those)."""

    callables: Mapping[str, Callable[..., Any]] = attrs.field(converter=lambda d: types.MappingProxyType(dict(d)))
    num_compiles: int


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


def _float_input_symbols(gm: torch.fx.GraphModule) -> list[str]:
    """The symbols of ``gm``'s float inputs that Dynamo left unspecialised (``torch.compile(dynamic=True)``
    passes a float attribute, e.g. a norm's ``eps``, as a 0-d tensor read with ``.item()``), in input order."""
    symbols = []
    for node in gm.graph.nodes:
        value = node.meta.get("example_value") if node.op == "placeholder" else None
        # a 0-d host tensor of another dtype (a layer's id) may carry a memo too: not a float
        floating = isinstance(value, torch.Tensor) and value.dtype.is_floating_point
        memo = getattr(value, "item_memo", None) if floating else None
        name = getattr(getattr(getattr(memo, "node", None), "_expr", None), "name", None)
        if name is not None:
            symbols.append(name)
    return symbols


def specialize_float_inputs(gm: torch.fx.GraphModule) -> None:
    """Have Dynamo trace ``gm`` again with its unspecialised float inputs as constants (guarded by value, as
    without ``dynamic=True``), where it has any: Inductor cannot compile a piece whose float crosses into another
    piece as a Python number, and a piece compiled on its own loses the number Dynamo read it as. Raises Dynamo's
    restart request (the one its own float pass raises); returns where there is nothing to specialise.

    Raises :class:`~graphkv.errors.CaptureError` where a float input is still there after Dynamo was asked to
    specialise it (it is also used as a tensor), or where this torch has no such request."""
    symbols = _float_input_symbols(gm)
    if not symbols:
        return
    try:
        from torch._dynamo.exc import TensorifyScalarRestartAnalysis
        from torch._dynamo.symbolic_convert import TensorifyState
    except ImportError:  # pragma: no cover - torch without tensorified floats never leaves them unspecialised
        TensorifyState = None
    if TensorifyState is None or any(TensorifyState.should_specialize(s) for s in symbols):
        raise CaptureError(Problem(field="compile", value="fused",
                                   limit=f"{len(symbols)} float input(s) of the traced forward stay symbolic "
                                         f"({', '.join(symbols)}): torch.compile(dynamic=True) made them inputs "
                                         "and Inductor cannot compile the pieces they cross",
                                   fix="compile without dynamic=True (mark the step's dimensions dynamic with "
                                       "torch._dynamo.mark_dynamic, as graphkv.hf does), or use fuse=False"))
    for symbol in symbols:
        TensorifyState.specialize(symbol)
    raise TensorifyScalarRestartAnalysis


def traced_args(module: torch.fx.GraphModule) -> list[Any] | None:
    """A piece's arguments as the trace saw them (each placeholder's ``example_value``, which the split
    copies from the traced forward), or ``None`` where one is missing."""
    args = [node.meta.get("example_value", _MISSING) for node in module.graph.nodes if node.op == "placeholder"]
    return None if any(a is _MISSING for a in args) else args



def compile_pieces(split: SplitResult, gm: torch.fx.GraphModule) -> CompiledPieces:
    """Every graph piece of ``split`` (the split of ``gm``, a Dynamo-traced forward) that computes
    something, compiled by Inductor on the arguments the trace gave it, by piece name; pieces of equal
    :func:`piece_key` share the callable compiled for the first of them. The arguments are read from
    the pieces' placeholders (their traced example values); where one lacks them, ``gm``'s fake inputs
    run through the split module to find them. The compiled callables take the piece's arguments
    positionally (tensors and ints) and return what the piece returns. Host only; compiles (seconds per
    distinct piece), so call it once per trace, outside any capture."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._inductor.compile_fx import compile_fx

    wanted = {p.name: p.module for p in split.graph_pieces if has_ops(p.module)}
    compiled: dict[str, Callable[..., Any]] = {}
    by_key: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def compile_piece(name: str, args: Any) -> None:
        key = piece_key(wanted[name], args)
        if key not in by_key:
            by_key[key] = compile_fx(wanted[name], list(args))
        compiled[name] = by_key[key]

    class _Compiling(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            out = super().call_module(target, args, kwargs)
            if target in wanted and target not in compiled:
                compile_piece(target, args)
            return out

    fakes, mode = _fake_inputs(gm)
    traced = {name: traced_args(module) for name, module in wanted.items()}
    with mode, enable_python_dispatcher():  # symbolic sizes through Python meta kernels, as Dynamo runs them
        if all(args is not None for args in traced.values()):
            for name, args in traced.items():  # no need to run the pieces on fake tensors (seconds for 16 layers)
                compile_piece(name, args)
        else:
            _Compiling(split.module).run(*fakes)
    missing = sorted(set(wanted) - set(compiled))
    assert not missing, f"graph pieces never called by the split module: {missing}"
    return CompiledPieces(callables=compiled, num_compiles=len(by_key))
