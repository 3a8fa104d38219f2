"""A traced forward's linear calls routed through ``graphkv::small_linear``, so few-token steps use graphkv's kernel.

A decode step at a small batch spends most of its time in matrix-vector products that read the weights
(:mod:`graphkv.kernels.small_matmul` says why cuBLAS reads them below a copy's rate). :func:`route_small_matmuls`
replaces every ``linear`` call of a Dynamo graph by the custom op ``graphkv::small_linear``
(:mod:`graphkv.runtime.ops.small_linear_op`), which computes the same product and picks its implementation per call
by the number of rows: the kernel for at most ``SMALL_LINEAR_ROWS`` tokens, torch's matmul above. Run after
:func:`~graphkv.runtime.capture.dedupe.dedupe_linears` (which merges repeated ``linear`` calls, not the op).
"""

from __future__ import annotations

from typing import Any

import torch

import graphkv.runtime.ops.small_linear_op  # noqa: F401 - registers torch.ops.graphkv.small_linear
from graphkv.kernels.small_matmul import SMALL_MATMUL_DTYPES

__all__ = ["ROUTED_TARGETS", "route_small_matmuls"]

ROUTED_TARGETS: tuple[Any, ...] = (torch._C._nn.linear, torch.nn.functional.linear, torch.ops.aten.linear.default)
"""The calls :func:`route_small_matmuls` replaces: ``linear`` as Dynamo records it and as the aten op."""


def _traced(node: Any) -> Any:
    """The traced value of an FX node: Dynamo's ``example_value``, an aten graph's ``val``; ``None`` for others."""
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else None


def _routable(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a linear call whose input, 2-D weight and result share one dtype the kernel takes (not so
    under autocast, whose casts the op would skip) and whose result needs no gradient."""
    if node.op != "call_function" or node.target not in ROUTED_TARGETS or len(node.args) < 2:
        return False
    x, weight, value = _traced(node.args[0]), _traced(node.args[1]), _traced(node)
    return all(isinstance(t, torch.Tensor) for t in (x, weight, value)) and x.dtype in SMALL_MATMUL_DTYPES \
        and x.dtype == weight.dtype == value.dtype and weight.dim() == 2 and not value.requires_grad


def route_small_matmuls(gm: torch.fx.GraphModule, kernels: str) -> int:
    """Replace every routable ``linear`` call in ``gm`` (changed in place, recompiled when any is) by
    ``torch.ops.graphkv.small_linear(x, weight, bias, kernels)``; calls whose output needs a gradient, or whose
    input, weight and output are not all one of the kernel's dtypes (float64, autocast's casts), stay. Returns how
    many were replaced."""
    replaced = 0
    for node in list(gm.graph.nodes):
        if not _routable(node):
            continue
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        with gm.graph.inserting_after(node):
            op = gm.graph.call_function(torch.ops.graphkv.small_linear.default,
                                        (node.args[0], node.args[1], bias, kernels))
        op.meta.update(node.meta)
        node.replace_all_uses_with(op)
        gm.graph.erase_node(node)
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced
