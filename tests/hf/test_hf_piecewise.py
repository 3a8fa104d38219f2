"""graphkv.hf with ``compile="piecewise"``: mixed steps go through PIECEWISE graph keys, not eagerly.

The forward is traced once and split at ``graphkv::attention`` and ``graphkv::state_mixer``; on
the GPU path on a CPU (``kernels="triton"``) capture is rehearsed, so every mixed key's pieces run
where a GPU would replay them. With ``compile="model"`` (one Inductor graph, no runners) the same
plan's mixed keys are skipped and mixed steps run eagerly. With ``compile="fused"`` the same keys hold
Inductor-compiled pieces: a decode step's norms, rotary, activations and residual adds run in fused kernels.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from graphkv import CudaGraphMode, Limits
from graphkv.hf import ServingLoop
from graphkv.hf.declare import model_kv
from graphkv.hf.generation import workload_budget
from graphkv.hf.tiny import CORE_FAMILIES, tiny_model
from graphkv.models.demo_engine import DemoRequest
from graphkv.runtime.step.batch import Batch

from hf_harness import NEW_TOKENS, generate_alone, prompts, serving_loop

LIMITS = Limits(max_model_len=96, max_num_seqs=4, max_num_batched_tokens=32, max_cudagraph_capture_size=32,
                cudagraph_mode=CudaGraphMode.FULL_AND_PIECEWISE)  # prefill chunks captured too, not vLLM's 8 tokens


def _loop(model, compile: str) -> ServingLoop:  # noqa: A002 - the torch verb
    return ServingLoop(model, limits=LIMITS, budget=workload_budget(model_kv(model), LIMITS), compile=compile,
                       kernels="triton")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "qwen3_next"])
def test_piecewise_captures_mixed_keys_and_serves_generates_tokens(family: str, device: str) -> None:
    """qwen3 (attention only) and qwen3_next (gated-delta mixers too): 'piecewise' holds the plan's 3 decode keys and
    its 7 mixed keys (1, 2, 4, 8, 16, 24, 32 tokens), 'model' only the decode keys; prompts of 5, 40, 17 and 9 tokens
    (one longer than a 32-token step) served 4 at a time give generate's tokens."""
    model = tiny_model(family).to(device)
    loop = _loop(model, "piecewise")
    keys = loop.capture_report.keys
    assert sorted(k.num_tokens for k in keys if not k.uniform) == [1, 2, 4, 8, 16, 24, 32]
    assert sorted(k.num_tokens for k in keys if k.uniform) == [1, 2, 4]
    batch = prompts((5, 40, 17, 9), seed=1)
    engine = loop.engine()
    engine.run([DemoRequest(req_id=i, prompt=p, max_new_tokens=NEW_TOKENS) for i, p in enumerate(batch)])
    assert [engine.finished[i] for i in range(len(batch))] == [generate_alone(model, p) for p in batch]
    if family == "qwen3":
        whole = _loop(model, "model").capture_report.keys
        assert [k for k in whole if not k.uniform] == [] and len(whole) == 3


# Elementwise ops and reductions of a Qwen3 layer (RMSNorm's pow / mean / rsqrt / mul, rotary's neg / cat / mul / add,
# the MLP's silu / mul, residual adds): a traced piece dispatches each as its own aten op (one kernel each on a GPU);
# Inductor fuses them into its own kernels.
FUSED_AWAY = frozenset({"aten::pow", "aten::mean", "aten::rsqrt", "aten::neg", "aten::silu", "aten::mul", "aten::add",
                        "aten::cat"})


def _decode_step_ops(loop: ServingLoop) -> dict[str, int]:
    """Top-level aten ops (not nested in another aten op) a one-token decode step dispatches, by name (a request on
    page 1 of the plan's one group, finished afterwards)."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 128, (6,), generator=gen).tolist()
    loop.run(Batch(req_ids=("p",), query_lens=(5,), seq_lens=(5,), new_pages=(((1,),),)), input_ids=ids[:5])
    loop.run(Batch(req_ids=("p",), query_lens=(1,), seq_lens=(6,), new_pages=(None,)), input_ids=ids[5:])  # compiles
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loop.run(Batch(req_ids=("p",), query_lens=(1,), seq_lens=(7,), new_pages=(None,)), input_ids=ids[:1])
    loop.finish("p")
    counts: dict[str, int] = {}
    for event in prof.events():
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if event.name.startswith("aten::") and parent is None:
            counts[event.name] = counts.get(event.name, 0) + 1
    return counts


@pytest.mark.slow
def test_fused_pieces_fuse_a_decode_steps_elementwise_ops_and_serve_generates_tokens(device: str) -> None:
    """qwen3 (3 layers) with 'fused': the same 3 decode and 7 mixed keys as 'piecewise'; a decode step dispatches none
    of the norms' / rotary's / MLP's elementwise aten ops that 'piecewise' dispatches (about 43 per layer), and the
    same 22 matmuls (7 per layer and the head; counted on a CPU, where no graph replays); every graph piece is
    Inductor's, the two middle pieces one compile; prompts served 4 at a time give generate's tokens."""
    model = tiny_model("qwen3", num_hidden_layers=3).to(device)
    fused, traced = _loop(model, "fused"), _loop(model, "piecewise")
    assert [(k.num_tokens, k.uniform) for k in fused.capture_report.keys] == \
        [(k.num_tokens, k.uniform) for k in traced.capture_report.keys]
    assert len(fused.capture_report.keys) == 10
    # one trace for every step size, 1-token steps included (the step's sizes are backed, so Inductor sizes its
    # kernels by them; the shape guard Dynamo's specialisation at 1 wrote is dropped): its 4 graph pieces (before,
    # between and after the 3 attention layers) fused by Inductor in 3 compiles (the two pieces between attention
    # layers are one function of their weights), on any device; the traced mode compiles none
    splits = fused.model.piecewise.splits
    assert [len(split.graph_pieces) for split in splits] == [4], fused.model.size_guards.kept  # why it retraced
    assert (fused.model.piecewise.num_fused, fused.model.piecewise.num_compiles) == (4, 3)
    assert traced.model.piecewise.num_fused == traced.model.piecewise.num_compiles == 0
    runners = fused.model.piecewise.runners
    assert runners[1].piece.fn is runners[2].piece.fn and runners[0].piece.fn is not runners[1].piece.fn
    assert [len(split.graph_pieces) for split in traced.model.piecewise.splits] == [4]
    if device == "cpu":  # on a GPU the decode step replays a CUDA graph: no op is dispatched
        ops_fused, ops_traced = _decode_step_ops(fused), _decode_step_ops(traced)
        # transformers 5.24 here: 86 for 2 layers (pow 9, mean 9, rsqrt 9, neg 4, silu 2, mul 31, add 17, cat 5);
        # other versions may count differently, but each runs
        assert all(ops_traced.get(name, 0) > 0 for name in FUSED_AWAY) and sum(map(ops_traced.get, FUSED_AWAY)) >= 120
        assert FUSED_AWAY.isdisjoint(ops_fused)
        assert ops_fused["aten::mm"] == ops_traced["aten::linear"] == 22  # Inductor calls mm; traced, nn.Linear
    batch = prompts((5, 40, 17, 9), seed=1)
    engine = fused.engine()
    engine.run([DemoRequest(req_id=i, prompt=p, max_new_tokens=NEW_TOKENS) for i, p in enumerate(batch)])
    assert [engine.finished[i] for i in range(len(batch))] == [generate_alone(model, p) for p in batch]


def test_a_compiled_forward_run_eagerly_reads_its_step_from_the_context() -> None:
    """A forward compiled whole passes no step object (the layer ops read the step's context); where Dynamo runs it
    eagerly instead (``set_stance("force_eager")``, as with TORCHDYNAMO_DISABLE or past the recompile limit), the
    attention layers and the gated-delta mixers read the same context, and qwen3_next gives generate's tokens."""
    model = tiny_model("qwen3_next")
    batch = prompts((5, 17), seed=4)
    expected = [generate_alone(model, p) for p in batch]
    with torch.compiler.set_stance("force_eager"):
        loop = serving_loop(model, compile="piecewise", capture_graphs=False)
        engine = loop.engine()
        engine.run([DemoRequest(req_id=i, prompt=p, max_new_tokens=NEW_TOKENS) for i, p in enumerate(batch)])
    assert loop.model.piecewise.splits == []  # nothing was traced
    assert [engine.finished[i] for i in range(len(batch))] == expected


@pytest.mark.slow
@pytest.mark.parametrize("family", CORE_FAMILIES)
def test_one_trace_serves_a_requests_one_token_decode_steps(family: str) -> None:
    """Each core family under 'piecewise', a prompt served alone: its prefill traced the forward once (2 tokens or
    more), and its batch-1 decode steps ran that trace (the shape guard of the specialisation at 1 dropped), with
    the layers as nested compile regions where this torch reuses them: generate's tokens, one trace."""
    model = tiny_model(family)
    prompt = prompts((9,), seed=5)[0]
    loop = serving_loop(model, compile="piecewise", capture_graphs=False)
    engine = loop.engine()
    engine.run([DemoRequest(req_id="alone", prompt=prompt, max_new_tokens=NEW_TOKENS)])
    assert engine.finished["alone"] == generate_alone(model, prompt)
    assert len(loop.model.piecewise.splits) == 1
