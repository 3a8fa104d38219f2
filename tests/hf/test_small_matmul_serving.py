"""graphkv.hf with ``small_matmul=True``: a split forward's matmuls of a few tokens run graphkv's small-matmul kernel
(here in Triton's interpreter, the GPU's code path) and the served tokens are ``model.generate``'s."""

from __future__ import annotations

import pytest
import torch

import graphkv.runtime.ops.small_linear_op as small_linear_op
from graphkv.errors import SpecError
from graphkv.hf import ServingLoop
from graphkv.hf.declare import model_kv
from graphkv.hf.generation import workload_budget
from graphkv.hf.model import PagedModel
from graphkv.hf.tiny import tiny_model
from graphkv.models.demo_engine import DemoRequest

from hf_harness import LIMITS, NEW_TOKENS, generate_alone, prompts


def test_small_matmul_needs_a_split_forward():
    """small_matmul=True where the forward is not traced and split is refused naming the field and the modes that
    take it; so is a non-bool."""
    model = tiny_model("llama")
    loop = ServingLoop(model, limits=LIMITS, budget=workload_budget(model_kv(model), LIMITS), capture_graphs=False)
    for compile in (True, "model", False):
        with pytest.raises(SpecError, match=r"small_matmul.*compile='piecewise' or 'fused'"):
            PagedModel(model, loop.pool, compile=compile, small_matmul=True)
    with pytest.raises(SpecError, match="small_matmul.*must be a bool"):
        PagedModel(model, loop.pool, compile="fused", small_matmul=1)


@pytest.mark.slow
def test_decode_steps_multiply_through_the_kernel_and_serve_generates_tokens(device, monkeypatch):
    """qwen3, 2 layers, float32, merged projections, compiled with Inductor: its one trace routes 9 matmuls (qkv, o,
    gate_up, down per layer and the head); four prompts served together give generate's tokens. On a CPU (the
    rehearsal runs every step) the kernel ran the 4-request decode steps and the head's single row of the prefill
    step that finished a prompt, torch's matmul the prefill steps' 32 tokens; on a GPU it ran while the graphs of
    at most 8 tokens were captured, and their replays launch it without Python."""
    launched: list[int] = []

    def counting(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        launched.append(x.shape[0])
        return small_linear_op_kernel(x, *args, **kwargs)

    small_linear_op_kernel = small_linear_op.small_matmul
    monkeypatch.setattr(small_linear_op, "small_matmul", counting)
    model = tiny_model("qwen3").to(device)
    batch = prompts((5, 40, 17, 9), seed=1)
    expected = [generate_alone(model, p) for p in batch]
    loop = ServingLoop(model, limits=LIMITS, budget=workload_budget(model_kv(model), LIMITS), compile="fused",
                       kernels="triton", merge_projections=True, small_matmul=True)
    assert loop.model.piecewise.num_small_matmuls == 9, loop.model.size_guards.kept  # 18: traced twice
    if device == "cuda":
        assert launched and max(launched) <= 8
    launched.clear()
    engine = loop.engine()
    engine.run([DemoRequest(req_id=i, prompt=p, max_new_tokens=NEW_TOKENS) for i, p in enumerate(batch)])
    assert [engine.finished[i] for i in range(len(batch))] == expected
    if device == "cpu":
        assert set(launched) == {1, 4}  # a 32-token step's one finished prompt (its head row); 4-request decode steps
