"""Layers traced once: each decoder layer a nested compile region, inlined again before the forward is split.

Dynamo traces a compiled forward bytecode by bytecode, so a 16-layer model costs 16 traces of the same layer code:
on a 2-core CPU about 0.35-0.5 s a layer, most of a tiny Qwen3's 13 s of Dynamo time. A function marked with
``torch.compiler.nested_compile_region`` is traced for its first call and, from torch 2.12, *stamped out* for every
later call whose inputs match (same tensor metadata, same constants, guards on what it read re-evaluated):
Dynamo records a ``invoke_subgraph`` call of the one traced body, each layer's own weights lifted as its inputs.
Older torch traces every call again (2.11: each call is traced, equal graphs share a body), which saves nothing,
so :func:`regions_reuse_traces` says whether to mark at all.

graphkv's backend splits the forward at attention ops that now sit inside the bodies, and compiles and captures
the pieces between them; :func:`inline_regions` puts every body's nodes back in the forward first, so the split,
the matmul passes and Inductor see the graph a flat trace would have given (the same pieces, shared compiles and
captures as before). A layer is a region only if nothing in it names its own layer by a Python constant: the layer
ops take the layer's index as a tensor (:func:`graphkv.hf.layer_ops.layer_id`) for that reason.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Callable, TypeVar

import torch

__all__ = ["inline_regions", "layer_region", "regions_reuse_traces"]

F = TypeVar("F", bound=Callable[..., Any])


def regions_reuse_traces() -> bool:
    """Whether this torch stamps out a nested compile region's trace for later matching calls (torch 2.12 and later:
    ``nested_compile_region`` takes ``max_reuse_entries``), rather than tracing every call again. Host only."""
    region = getattr(torch.compiler, "nested_compile_region", None)
    if region is None:
        return False
    try:
        return "max_reuse_entries" in inspect.signature(region).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return False


def layer_region(fn: F) -> F:
    """``fn`` marked as a nested compile region where this torch reuses its trace (:func:`regions_reuse_traces`),
    else ``fn`` itself. Outside ``torch.compile`` a region runs as ``fn``. Host only (marks a function)."""
    return torch.compiler.nested_compile_region(fn) if regions_reuse_traces() else fn


def _is_region_call(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is getattr(torch.ops.higher_order, "invoke_subgraph", None)


def inline_regions(gm: torch.fx.GraphModule) -> int:
    """Replace every ``invoke_subgraph`` call in ``gm`` (a Dynamo-traced forward) by a copy of its body's nodes, the
    body's inputs bound to the call's operands and each ``getitem`` of the call's results to the body's output;
    bodies nested in bodies are inlined too. Node metadata (the traced example values) is copied with the nodes.
    Returns the number of calls inlined (0: ``gm`` is unchanged). Host only (a compile-time graph pass)."""
    graph = gm.graph
    count = 0
    bodies: set[str] = set()
    while True:
        calls = [node for node in graph.nodes if _is_region_call(node)]
        if not calls:
            break
        for call in calls:
            body_ref, operands = call.args[0], call.args[2:]
            body = getattr(gm, body_ref.target) if body_ref.op == "get_attr" else body_ref
            assert isinstance(body, torch.fx.GraphModule), f"invoke_subgraph of {type(body).__name__}"
            env: dict[torch.fx.Node, Any] = {}
            placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
            assert len(placeholders) == len(operands), "an invoke_subgraph call's operands match its body's inputs"
            env.update(zip(placeholders, operands))
            outputs: Any = None
            with graph.inserting_before(call):
                for node in body.graph.nodes:
                    if node.op == "placeholder":
                        continue
                    if node.op == "output":
                        outputs = torch.fx.map_arg(node.args[0], lambda n: env[n])
                        continue
                    if node.op == "get_attr":  # a body's own attribute (a nested body, a constant): moved to gm
                        name = _fresh_attr(gm, node.target)
                        setattr(gm, name, _get_attr(body, node.target))
                        env[node] = graph.get_attr(name)
                        env[node].meta = dict(node.meta)
                        continue
                    env[node] = graph.node_copy(node, lambda n: env[n])
            results = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
            for user in list(call.users):
                assert user.op == "call_function" and user.target is operator.getitem, \
                    f"an invoke_subgraph result read by {user.op} {user.target}"
                user.replace_all_uses_with(results[user.args[1]])
                graph.erase_node(user)
            graph.erase_node(call)
            if body_ref.op == "get_attr":
                bodies.add(body_ref.target)
                if not body_ref.users:
                    graph.erase_node(body_ref)
            count += 1
    if count:
        _drop_dead_reads(graph)
        still_read = {n.target for n in graph.nodes if n.op == "get_attr"}
        for name in bodies - still_read:
            delattr(gm, name)
        graph.lint()
        gm.recompile()
    return count


_READS = frozenset({"size", "stride", "dim", "numel", "storage_offset"})
_SYMBOLIC_ARITHMETIC = frozenset({operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
                                  operator.mod, operator.neg, operator.eq, operator.ne, operator.lt, operator.le,
                                  operator.gt, operator.ge})


def _drop_dead_reads(graph: torch.fx.Graph) -> int:
    """Erase nodes no one uses that only read: ``getitem`` (of a tuple, or a view of a tensor), ``size()`` /
    ``stride()`` and the like, and arithmetic on sizes (never on tensors). A body traced on its own keeps such
    reads, which a flat trace's dead-code pass drops; torch's own pass would take the opaque layer ops (no declared
    mutation) for dead too."""
    erased = 0
    for node in reversed(list(graph.nodes)):
        if node.users or node.op not in ("call_function", "call_method"):
            continue
        value = node.meta.get("example_value")
        reads = node.target is operator.getitem or \
            (node.op == "call_method" and node.target in _READS) or \
            (node.target in _SYMBOLIC_ARITHMETIC and not isinstance(value, torch.Tensor))
        if reads:
            graph.erase_node(node)
            erased += 1
    return erased


def _get_attr(module: torch.nn.Module, target: str) -> Any:
    obj: Any = module
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _fresh_attr(gm: torch.nn.Module, target: str) -> str:
    base = "inlined_" + target.replace(".", "_")
    name, n = base, 0
    while hasattr(gm, name):
        n += 1
        name = f"{base}_{n}"
    return name
