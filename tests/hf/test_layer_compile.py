"""graphkv.hf with ``trace_layers=True``: one decoder layer of each structure traced and compiled for every layer.

The forward around the layers runs eagerly; every layer calls one compiled layer function, which the piecewise
backend splits at the layer's attention or state-mixer op. Each core family's tokens equal transformers' with one
trace per layer structure (the layers' shape guards dropped as the whole forward's are), through rehearsed capture
(the GPU path on a CPU) and with Inductor-fused pieces; runners key their graphs by layer.
"""

from __future__ import annotations

import logging

import pytest
import torch

from graphkv import CudaGraphMode, Limits
from graphkv.errors import SpecError
from graphkv.hf import ServingLoop
from graphkv.hf.declare import model_kv
from graphkv.hf.generation import workload_budget
from graphkv.hf.layer_compile import CompiledLayer, around_layers, compile_layers, layer_step_inputs
from graphkv.hf.layer_ops import LAYER_BUFFER, paged_step_context
from graphkv.hf.tiny import CORE_FAMILIES, tiny_model
from graphkv.models.demo_engine import DemoRequest
from graphkv.runtime.capture.piecewise import _signature, layer_scope

from hf_harness import NEW_TOKENS, generate_alone, prompts, serving_loop

# graph pieces of each trace, in the order the traces first run: the embedding one piece, the rotary tables one
# (Gemma-3 two, local and global), an attention or mixer layer two (before and after its op), an MLP-only layer
# (Nemotron-H's "-") one, the final norm one
PIECES = {"gemma3_text": [1, 1, 1, 2, 2, 1], "gpt_oss": [1, 1, 2, 2, 1], "llama": [1, 1, 2, 1],
          "mistral": [1, 1, 2, 1], "nemotron_h": [1, 2, 2, 1, 1], "qwen3": [1, 1, 2, 1], "qwen3_next": [1, 1, 2, 2, 1]}
AROUND = {"nemotron_h": 2}  # modules around the layers compiled on their own: the embedding, the rotary tables, the
# final norm (3; Nemotron-H has no rotary tables)
LIMITS = Limits(max_model_len=96, max_num_seqs=4, max_num_batched_tokens=32, max_cudagraph_capture_size=32,
                cudagraph_mode=CudaGraphMode.FULL_AND_PIECEWISE)


def _served_tokens(loop, lengths: tuple[int, ...], seed: int) -> tuple[list, list]:
    batch = prompts(lengths, seed=seed)
    engine = loop.engine()
    engine.run([DemoRequest(req_id=i, prompt=p, max_new_tokens=NEW_TOKENS) for i, p in enumerate(batch)])
    return [engine.finished[i] for i in range(len(batch))], batch


@pytest.mark.parametrize("family", CORE_FAMILIES)
def test_each_layer_structure_is_traced_once_and_serving_gives_generates_tokens(family: str) -> None:
    """Prompts of 9, 30 and 5 tokens (a 30-token prefill beside decodes, then batch-1 decode steps) under
    'piecewise' with trace_layers: generate's tokens; every decoder layer routed through the compiled layer, the
    embedding, rotary tables and final norm through their own, one trace per structure (PIECES), no shape guard kept
    (1-token steps ran the first trace)."""
    model = tiny_model(family)
    loop = serving_loop(model, compile="piecewise", capture_graphs=False, trace_layers=True)
    tokens, batch = _served_tokens(loop, (9, 30, 5), seed=5)
    assert tokens == [generate_alone(model, p) for p in batch]
    assert loop.model.num_compiled_layers == model.config.num_hidden_layers
    assert loop.model.num_compiled_around == AROUND.get(family, 3)
    assert [len(split.graph_pieces) for split in loop.model.piecewise.splits] == PIECES[family]
    assert loop.model.size_guards.kept == []


@pytest.mark.slow
def test_captured_keys_and_fused_pieces_serve_generates_tokens(device: str) -> None:
    """qwen3 (3 layers), 'fused' with trace_layers, on the GPU path (a CPU rehearses capture with kernels='triton'):
    the same 3 decode and 7 mixed keys as the whole forward; the embedding, the rotary tables, the layer's two pieces
    and the final norm compiled by Inductor once each (5 compiles for 3 layers) and run by 5 runners, which on a GPU
    capture a graph per mixed key (7 each for the embedding, the rotary tables and the norm) and, for the layer's
    pieces, per layer too (21 each: 63 in all); prompts of 5, 40, 17 and 9 tokens served 4 at a time give
    generate's tokens."""
    model = tiny_model("qwen3", num_hidden_layers=3).to(device)
    loop = ServingLoop(model, limits=LIMITS, budget=workload_budget(model_kv(model), LIMITS), compile="fused",
                       kernels="triton" if device == "cpu" else "auto", trace_layers=True)
    keys = loop.capture_report.keys
    assert loop.capture_report.rehearsed == (device == "cpu")
    if device == "cuda":
        assert loop.capture_report.num_piece_graphs == 63
        assert [runner.num_graphs for runner in loop.model.piecewise.runners] == [7, 7, 21, 21, 7]
    assert sorted(k.num_tokens for k in keys if not k.uniform) == [1, 2, 4, 8, 16, 24, 32]
    assert sorted(k.num_tokens for k in keys if k.uniform) == [1, 2, 4]
    backend = loop.model.piecewise
    assert (backend.num_fused, backend.num_compiles, len(backend.runners)) == (5, 5, 5)
    assert (loop.model.num_compiled_layers, loop.model.num_compiled_around) == (3, 3)
    tokens, batch = _served_tokens(loop, (5, 40, 17, 9), seed=1)
    assert tokens == [generate_alone(model, p) for p in batch]


def test_a_runner_keys_its_graphs_by_the_open_layer_scope() -> None:
    """One runner serves every layer of a structure, each layer on its own weights: inside layer_scope(i) a piece's
    graph key (its arguments' shapes, strides, dtypes and devices) names layer i, so layers never share a graph;
    outside any scope the key is as before, with no layer."""
    args = (torch.zeros(1, 5, 8), 3)
    outside = _signature(args)
    with layer_scope(0):
        first = _signature(args)
        with layer_scope(1):
            second = _signature(args)
        assert _signature(args) == first
    assert outside[0] is None and first[0] == 0 and second[0] == 1
    assert outside[1:] == first[1:] == second[1:] and len({outside, first, second}) == 3


def test_trace_layers_is_refused_outside_a_split_forward_or_when_not_a_bool() -> None:
    """trace_layers needs the piecewise backend (compile='piecewise' / 'fused'): under compile='model' or eager it
    is refused naming the field, the compile mode and the fix; a non-bool is refused before anything is built."""
    model = tiny_model("qwen3")
    with pytest.raises(SpecError) as refused:
        serving_loop(model, compile="model", capture_graphs=False, trace_layers=True)
    text = str(refused.value)
    assert "trace_layers" in text and "compile='model'" in text and "compile='fused'" in text
    with pytest.raises(SpecError) as refused:
        serving_loop(model, compile="piecewise", capture_graphs=False, trace_layers="yes")
    assert "trace_layers" in str(refused.value) and "must be a bool" in str(refused.value)


class _ScaledLayer(torch.nn.Module):
    """A toy decoder layer whose forward reads a Python int of its own (as Beam's residual index): every layer is a
    structure of its own to Dynamo."""

    def __init__(self, scale: int) -> None:
        super().__init__()
        self.scale = scale
        self.register_buffer(LAYER_BUFFER, torch.tensor([scale]), persistent=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states * self.scale + 1


def test_layers_that_differ_by_a_constant_run_past_the_recompile_limit_eagerly_with_a_warning(caplog) -> None:
    """Ten toy layers, each reading its own int: compile_layers routes all ten, the compiled function traces one per
    layer up to torch's recompile limit (8) and warns once at it, naming trace_layers=False; the layers past it run
    eagerly, and the forward's values equal the layers' own."""
    layers = torch.nn.ModuleList(_ScaledLayer(k) for k in range(1, 11))
    view = torch.nn.Module()
    view.layers = layers
    traces: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs) -> object:
        traces.append(gm)
        return gm.forward

    assert compile_layers(view, backend, options={}, name="graphkv_toy_layer") == 10
    x = torch.arange(6.0).reshape(1, 3, 2)
    want = x.clone()
    for k in range(1, 11):
        want = want * k + 1
    with caplog.at_level(logging.WARNING, logger="graphkv.hf.layer_compile"):
        out = x
        for layer in layers:
            out = layer(out)
    assert torch.equal(out, want)
    assert len(traces) == 8
    warned = [r.getMessage() for r in caplog.records if "trace_layers" in r.getMessage()]
    assert len(warned) == 1 and "8 times" in warned[0] and "trace_layers=False" in warned[0]


class _XLayer(_ScaledLayer):
    def forward(self, x: torch.Tensor, layer_past: object = None) -> torch.Tensor:  # CTRL names its hidden states x
        return x * self.scale


class _Norm(torch.nn.Module):
    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return states / states.norm(dim=-1, keepdim=True)


def test_the_modules_around_the_layers_and_the_names_the_guard_filter_reads() -> None:
    """Around the layers: the other children of the module holding them, but embeddings and containers (a norm, here);
    a list of modules without a planned layer holds no layers. The step-sized inputs the guard filter drops shape
    guards of: the usual names, then the first parameter of every layer class (CTRL's ``x``) and module around them,
    once each, in order."""
    view = torch.nn.Module()
    view.embed = torch.nn.Embedding(4, 2)
    view.layers = torch.nn.ModuleList([_ScaledLayer(1), _XLayer(2), _XLayer(3)])
    view.norm = _Norm()
    view.heads = torch.nn.ModuleList([torch.nn.Linear(2, 2)])  # no planned layer
    view.heads[0].extra = torch.nn.Linear(2, 2)
    assert around_layers(view) == [view.embed, view.norm]
    assert layer_step_inputs(view) == ("hidden_states", "position_embeddings", "position_ids", "cache_position", "x",
                                       "input", "states")


def test_each_call_of_a_module_in_a_forward_has_a_graph_key_of_its_own() -> None:
    """A module the forward calls twice (nanochat's norm, before and after the layers) keys its graphs by the call:
    (index, 0) then (index, 1) in every forward, counted afresh when the next forward's step begins (outside a step,
    (index, 0)); the step's token dimension of its inputs is marked dynamic (dimension 1 of [1, tokens, ...],
    dimension 0 of a [tokens] tensor)."""
    keys = []
    call = CompiledLayer(lambda module, **kwargs: keys.append(_signature(())[0]), _Norm(), 5)
    norm = _Norm()
    for step in (object(), object()):
        with paged_step_context(step):
            for _ in range(2):
                states, positions = torch.ones(1, 3, 2), torch.arange(3)
                call(norm, states, cache_position=positions)
    call(norm, states)  # outside a forward's step: the first call's key
    assert keys == [(5, 0), (5, 1), (5, 0), (5, 1), (5, 0)]
    assert states._dynamo_weak_dynamic_indices == {1} and positions._dynamo_weak_dynamic_indices == {0}
