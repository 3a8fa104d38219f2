"""graphkv.hf's decoder layers traced once per structure (nested compile regions, torch 2.12 and later)."""

from __future__ import annotations

import logging

import pytest
import torch
from hf_harness import NEW_TOKENS, generate_alone, prompts, serving_loop

import graphkv.hf.layer_regions as layer_regions
from graphkv.hf import ServingLoop
from graphkv.hf.tiny import tiny_model
from graphkv.models.demo_engine import DemoRequest
from graphkv.runtime.capture.regions import regions_reuse_traces

pytestmark = pytest.mark.skipif(not regions_reuse_traces(),
                                reason="this torch traces every call of a nested compile region again (before 2.12)")


@pytest.fixture
def breaking_regions(monkeypatch):
    """Layer regions whose body Dynamo cannot hold (a graph break in it)."""
    def breaking(layer: torch.nn.Module, *args, **kwargs):
        torch._dynamo.graph_break()
        return type(layer).forward(layer, *args, **kwargs)

    monkeypatch.setattr(layer_regions, "_LAYER", torch.compiler.nested_compile_region(breaking))


def _metric_counts() -> tuple[int, int]:
    metrics = torch._dynamo.utils.compilation_time_metrics
    return len(metrics.get("invoke_subgraph_trace", ())), len(metrics.get("invoke_subgraph_reuse_stamp_out", ()))


def _serve(loop: ServingLoop, batch: list[list[int]]) -> list[list[int]]:
    engine = loop.engine()
    engine.run([DemoRequest(req_id=i, prompt=p, max_new_tokens=NEW_TOKENS) for i, p in enumerate(batch)])
    return [engine.finished[i] for i in range(len(batch))]


@pytest.mark.slow
def test_a_layer_is_traced_once_and_stamped_out_for_the_others():
    """qwen3, 4 layers, fused: the view's 4 decoder layers are regions; Dynamo traces one and stamps it out for the
    other 3 in the one trace of the forward, the backend inlines the 4 calls and splits at the 4 attention ops (5
    graph pieces, 3 Inductor compiles as a flat trace gives); prompts alone (batch-1 decode) and together give
    generate's tokens; the user's model keeps its class's forward."""
    model = tiny_model("qwen3", num_hidden_layers=4)
    batch = prompts((5, 40, 17, 9), seed=1)
    expected = [generate_alone(model, p) for p in batch]
    traced, stamped = _metric_counts()
    loop = serving_loop(model, compile="fused", kernels="triton")
    assert _metric_counts() == (traced + 1, stamped + 3)
    backend = loop.model.piecewise
    assert loop.model.num_layer_regions == 4 and backend.num_inlined == 4
    assert [len(split.graph_pieces) for split in backend.splits] == [5]
    assert (backend.num_fused, backend.num_compiles) == (5, 3)
    assert [_serve(loop, [p]) for p in batch[:2]] == [[e] for e in expected[:2]]
    assert _serve(loop, batch) == expected
    assert all("forward" not in layer.__dict__ for layer in model.model.layers)
    assert all("forward" in layer.__dict__ for layer in loop.model.view.model.layers)


@pytest.mark.slow
def test_layers_a_region_cannot_hold_are_traced_one_by_one(breaking_regions, caplog):
    """A layer body Dynamo cannot hold in a region (here: a graph break in it) fails the first trace; the layers are
    unmarked, the forward traced again layer by layer, the fallback logged once, and the tokens are generate's."""
    model = tiny_model("qwen3")
    batch = prompts((5, 17), seed=2)
    expected = [generate_alone(model, p) for p in batch]
    with caplog.at_level(logging.WARNING, logger="graphkv.hf.model"):
        loop = serving_loop(model, compile="piecewise", kernels="triton")
    assert loop.model.num_layer_regions == 0 and loop.model.piecewise.num_inlined == 0
    assert all("forward" not in layer.__dict__ for layer in loop.model.view.model.layers)
    warned = [r.getMessage() for r in caplog.records if "nested compile regions failed" in r.getMessage()]
    assert len(warned) == 1 and "UncapturedHigherOrderOpError" in warned[0]
    assert _serve(loop, batch) == expected


@pytest.mark.slow
def test_the_fallback_waits_for_a_real_trace(breaking_regions):
    """A first serve Dynamo runs eagerly (``force_eager``) traces nothing, so it does not end the fallback's
    window: the next serve's trace fails in the regions, falls back to layer-by-layer tracing and gives
    generate's tokens."""
    model = tiny_model("qwen3")
    batch = prompts((6, 11), seed=3)
    expected = [generate_alone(model, p) for p in batch]
    with torch.compiler.set_stance("force_eager"):
        loop = serving_loop(model, compile="piecewise", capture_graphs=False)
        assert _serve(loop, batch[:1]) == expected[:1]
    assert loop.model.num_layer_regions == 2 and loop.model.piecewise.splits == []
    assert _serve(loop, batch) == expected
    assert loop.model.num_layer_regions == 0 and len(loop.model.piecewise.splits) == 1
