"""graphkv.hf with ``compile="piecewise"``: mixed steps go through PIECEWISE graph keys, not eagerly.

The forward is traced once and split at ``graphkv::attention`` and ``graphkv::state_mixer``; on
the GPU path on a CPU (``kernels="triton"``) capture is rehearsed, so every mixed key's pieces run
where a GPU would replay them. With ``compile="model"`` (one Inductor graph, no runners) the same
plan's mixed keys are skipped and mixed steps run eagerly.
"""

from __future__ import annotations

import pytest

from graphkv import CudaGraphMode, Limits
from graphkv.hf import ServingLoop
from graphkv.hf.declare import model_kv
from graphkv.hf.generation import workload_budget
from graphkv.hf.tiny import tiny_model
from graphkv.models.demo_engine import DemoRequest

from hf_harness import NEW_TOKENS, generate_alone, prompts

LIMITS = Limits(max_model_len=96, max_num_seqs=4, max_num_batched_tokens=32,
                cudagraph_mode=CudaGraphMode.FULL_AND_PIECEWISE)


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
