"""Splitting a traced forward at the ops that cannot live inside a CUDA graph of a mixed batch.

:func:`split_at_attention` cuts a Dynamo-traced ``GraphModule`` so that every call of a splitting
op (``graphkv::attention``, ``graphkv::state_mixer``) sits alone in its own piece: a forward with
``n`` such calls becomes up to ``2n + 1`` pieces, ``n`` of them the ops, the rest *graph pieces*
that :mod:`graphkv.runtime.capture.piecewise` captures and :mod:`graphkv.runtime.capture.fuse`
compiles.
"""

from __future__ import annotations

import operator
from typing import Any, Iterable

import attrs
import torch
from torch.fx.passes.split_module import split_module

__all__ = ["SPLITTING_OPS", "Piece", "SplitResult", "op_name", "split_at_attention"]

# Ops that end a graph piece. Attention / state backends register their capture-unsafe op under
# one of these names (or callers pass their own list).
SPLITTING_OPS: tuple[str, ...] = ("graphkv::attention",)


def op_name(op: Any) -> str | None:
    """``"namespace::name"`` of a custom op (packet, overload, or a ``"ns::name"`` / ``"ns.name"``
    string); ``None`` for anything that is not a torch op."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op._qualified_op_name
    if isinstance(op, torch._ops.OpOverload):
        return op._schema.name
    if isinstance(op, str):
        return op if "::" in op else op.replace(".", "::", 1)
    return None


@attrs.frozen(kw_only=True)
class Piece:
    """One submodule of a split graph, in call order: a graph piece or a splitting (attention) op."""

    index: int  # position in call order
    name: str  # attribute name on the split module, e.g. "submod_2"
    module: torch.fx.GraphModule
    splitting_op: str | None  # "ns::name" of the op this piece holds, None for a graph piece

    @property
    def is_graph_piece(self) -> bool:
        """Whether the piece is captured (it holds no splitting op)."""
        return self.splitting_op is None


@attrs.frozen(kw_only=True)
class SplitResult:
    """A graph split at its splitting ops: the parent module calling ``pieces`` in order."""

    module: torch.fx.GraphModule
    pieces: tuple[Piece, ...]

    @property
    def graph_pieces(self) -> tuple[Piece, ...]:
        """Pieces between splitting ops (captured in CUDA graphs)."""
        return tuple(p for p in self.pieces if p.is_graph_piece)

    @property
    def splitting_pieces(self) -> tuple[Piece, ...]:
        """Pieces holding one splitting op each (run eagerly)."""
        return tuple(p for p in self.pieces if not p.is_graph_piece)

    def eager_args(self, piece: Piece) -> frozenset[int]:
        """Positions of ``piece``'s call arguments that a splitting piece computes (directly or as
        one item of its outputs): tensors an eager op allocates per call."""
        eager = {p.name for p in self.splitting_pieces}
        call = next(n for n in self.module.graph.nodes if n.op == "call_module" and n.target == piece.name)
        positions = set()
        for i, arg in enumerate(call.args):
            while isinstance(arg, torch.fx.Node) and arg.op == "call_function" and arg.target is operator.getitem:
                arg = arg.args[0]
            if isinstance(arg, torch.fx.Node) and arg.op == "call_module" and arg.target in eager:
                positions.add(i)
        return frozenset(positions)


def split_at_attention(gm: torch.fx.GraphModule, splitting_ops: Iterable[Any] = SPLITTING_OPS) -> SplitResult:
    """Split ``gm`` so that every call of a ``splitting_ops`` op sits alone in its own piece.

    ``splitting_ops`` holds op names (``"graphkv::attention"``) or op objects
    (``torch.ops.graphkv.attention``). The split module computes exactly what ``gm`` computes
    (same ops, same order). ``gm`` itself is not modified.
    """
    wanted = {op_name(op) for op in splitting_ops}
    partition: dict[torch.fx.Node, int] = {}
    split_op_of: dict[int, str] = {}
    current = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        name = op_name(node.target) if node.op == "call_function" else None
        if name is not None and name in wanted:
            current += 1
            partition[node] = current
            split_op_of[current] = name
            current += 1
        else:
            partition[node] = current
    split = split_module(gm, None, lambda node: partition[node], keep_original_order=True)
    pieces = []
    for node in split.graph.nodes:
        if node.op == "call_module":
            pid = int(node.target.rsplit("_", 1)[1])
            pieces.append(Piece(index=len(pieces), name=node.target, module=getattr(split, node.target),
                                splitting_op=split_op_of.get(pid)))
    return SplitResult(module=split, pieces=tuple(pieces))
