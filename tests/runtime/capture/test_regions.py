"""Nested compile regions inlined back into the traced forward before the split (regions)."""

from __future__ import annotations

import pytest
import torch

from graphkv.runtime.capture.regions import inline_regions, layer_region, regions_reuse_traces

needs_regions = pytest.mark.skipif(not hasattr(torch.compiler, "nested_compile_region"),
                                   reason="this torch has no torch.compiler.nested_compile_region")


class _Block(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(6, 6, generator=gen), requires_grad=False)
        self.shift = torch.nn.Parameter(torch.randn(6, generator=gen), requires_grad=False)


def _block(block: _Block, x: torch.Tensor) -> torch.Tensor:
    return torch.relu(torch.nn.functional.linear(x, block.weight, block.shift)) + x


@needs_regions
def test_three_region_calls_are_inlined_into_one_flat_graph_that_computes_the_same():
    """Three blocks of one structure through a nested compile region: Dynamo's graph calls invoke_subgraph three
    times; inlined, it holds none (and no body submodule), three matmuls, and it gives eager's values exactly."""
    region = torch.compiler.nested_compile_region(_block)

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(_Block(seed) for seed in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = region(block, x)
            return x

    seen: dict[str, object] = {}

    def backend(gm: torch.fx.GraphModule, example_inputs):
        seen["calls"] = sum(1 for n in gm.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph)
        seen["inlined"] = inline_regions(gm)
        seen["left"] = sum(1 for n in gm.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph)
        seen["bodies"] = [name for name, m in gm.named_children() if isinstance(m, torch.fx.GraphModule)]
        seen["matmuls"] = sum(1 for n in gm.graph.nodes if n.op == "call_function"
                              and getattr(n.target, "__name__", "") in ("matmul", "linear", "mm"))
        return gm.forward

    forward = Stack()
    torch._dynamo.reset()
    x = torch.linspace(-1, 1, 4 * 6).reshape(4, 6)
    out = torch.compile(forward, backend=backend)(x)
    torch.testing.assert_close(out, forward(x), rtol=0, atol=0)
    assert (seen["calls"], seen["inlined"], seen["left"], seen["bodies"]) == (3, 3, 0, [])
    assert seen["matmuls"] == 3


def test_a_graph_without_regions_is_left_as_it_is():
    """No invoke_subgraph call: nothing inlined, the graph's code unchanged."""
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    code = gm.code
    assert inline_regions(gm) == 0 and gm.code == code


def test_layer_regions_follow_what_this_torch_can_reuse():
    """``layer_region`` marks a function only where torch stamps out a region's trace (``max_reuse_entries`` in
    ``nested_compile_region``'s signature, torch 2.12 and later); elsewhere the function is returned as it is."""
    marked = layer_region(_block)
    assert regions_reuse_traces() == ("max_reuse_entries" in _signature_parameters())
    assert (marked is _block) == (not regions_reuse_traces())
    block, x = _Block(0), torch.ones(2, 6)
    torch.testing.assert_close(marked(block, x), _block(block, x), rtol=0, atol=0)  # eager: the function itself


def _signature_parameters() -> tuple[str, ...]:
    import inspect

    region = getattr(torch.compiler, "nested_compile_region", None)
    return tuple(inspect.signature(region).parameters) if region is not None else ()
