"""Repeated matmuls of a traced forward kept once.

A model served with merged projections (:mod:`graphkv.hf.projections`) calls ``linear(x, W_qkv)`` once for each of
q, k and v, each call then taking its own columns; the three calls are the same function of the same values.
:func:`dedupe_linears` keeps the first of such calls and points the others' users at it, so the forward runs one
matmul per group. Matmuls are pure (no state, no randomness), so the forward computes exactly what it computed; a
call is merged only with one that no possible write into a tensor, and no switch of autocast or grad mode,
separates it from.
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
    """The call's target, arguments (other nodes by identity) and traced result dtype; ``None`` when an argument
    is unhashable."""
    value = node.meta.get("example_value")
    key = (node.target, node.args, tuple(sorted(node.kwargs.items())), getattr(value, "dtype", None))
    try:
        hash(key)
    except TypeError:
        return None
    return key


_MODE_SWITCHES = ("autocast", "grad_enabled", "set_grad", "_enter", "_exit", "inference_mode")


def _ends_region(node: torch.fx.Node) -> bool:
    """Whether a matmul after ``node`` may compute something else than the same call before it: ``node`` may write
    into a tensor (an in-place method such as ``add_``, item assignment, an ``out=`` argument, an op whose schema
    writes an argument such as ``graphkv::attention``, a module call, a higher-order op such as a user Triton
    kernel) or switches a mode the matmul runs under (autocast, grad mode)."""
    if node.op == "call_module":
        return True
    if node.op == "call_method":
        return str(node.target).endswith("_")
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.setitem or "out" in node.kwargs or isinstance(target, torch._ops.HigherOrderOperator):
        return True
    if isinstance(target, torch._ops.OpOverloadPacket):
        return any(getattr(target, name)._schema.is_mutable for name in target.overloads())
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    name = getattr(target, "__name__", "") or ""
    where = f"{getattr(target, '__module__', '') or ''}.{name}".lower()
    return name.endswith("_") or any(switch in where for switch in _MODE_SWITCHES)


def dedupe_linears(gm: torch.fx.GraphModule) -> int:
    """Keep the first of every set of :data:`LINEAR_TARGETS` calls with the same target and arguments in ``gm``
    (changed in place and recompiled when any is removed); the others' users read the first. A call after a node
    that may write into a tensor or switch autocast or grad mode (:func:`_ends_region`) is not merged with one
    before it, nor are calls whose traced results differ in dtype. Returns how many calls were removed."""
    first: dict[tuple[Any, ...], torch.fx.Node] = {}
    removed = 0
    for node in list(gm.graph.nodes):
        if _ends_region(node):
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
