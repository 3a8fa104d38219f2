"""Repeated matmuls of a traced forward kept once.

A model served with merged projections (:mod:`graphkv.hf.projections`) calls ``linear(x, W_qkv)`` once for each of
q, k and v, each call then taking its own columns; the three calls are the same function of the same values.
:func:`dedupe_linears` keeps the first of such calls and points the others' users at it, so the forward runs one
matmul per group. Matmuls are pure (no state, no randomness), so the forward computes exactly what it computed; a
call is merged only with one that no possible write into a tensor separates it from.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

__all__ = ["LINEAR_TARGETS", "dedupe_linears"]

LINEAR_TARGETS: tuple[Any, ...] = (torch._C._nn.linear, torch.nn.functional.linear, torch.matmul,
                                   torch.ops.aten.linear.default, torch.ops.aten.mm.default,
                                   torch.ops.aten.addmm.default)
"""The calls :func:`dedupe_linears` merges: linear and matmul, as Dynamo records them and as aten ops."""


def _key(node: torch.fx.Node) -> tuple[Any, ...] | None:
    """The call's target and arguments (other nodes by identity); ``None`` when an argument is unhashable."""
    key = (node.target, node.args, tuple(sorted(node.kwargs.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _may_mutate(node: torch.fx.Node) -> bool:
    """Whether ``node`` may write into a tensor: an in-place method (``add_``), item assignment, an ``out=``
    argument, an op whose schema writes an argument (a custom op such as ``graphkv::attention``), any module call."""
    if node.op == "call_module":
        return True
    if node.op == "call_method":
        return str(node.target).endswith("_")
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.setitem or "out" in node.kwargs:
        return True
    if isinstance(target, torch._ops.OpOverloadPacket):
        return any(getattr(target, name)._schema.is_mutable for name in target.overloads())
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    return getattr(target, "__name__", "").endswith("_")


def dedupe_linears(gm: torch.fx.GraphModule) -> int:
    """Keep the first of every set of :data:`LINEAR_TARGETS` calls with the same target and arguments in ``gm``
    (changed in place and recompiled when any is removed); the others' users read the first. A call after a node
    that may write into a tensor (:func:`_may_mutate`) is not merged with one before it. Returns how many calls
    were removed."""
    first: dict[tuple[Any, ...], torch.fx.Node] = {}
    removed = 0
    for node in list(gm.graph.nodes):
        if _may_mutate(node):
            first.clear()
            continue
        if node.op != "call_function" or node.target not in LINEAR_TARGETS:
            continue
        key = _key(node)
        if key is None:
            continue
        if key in first:
            node.replace_all_uses_with(first[key])
            gm.graph.erase_node(node)
            removed += 1
        else:
            first[key] = node
    if removed:
        gm.recompile()
    return removed
