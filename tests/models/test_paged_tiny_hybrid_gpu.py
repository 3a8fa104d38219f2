"""The paged hybrid model under CUDA graphs: replays equal eager, and replay allocates nothing."""

from __future__ import annotations

import pytest
import torch

import graphkv
from graphkv.models.demo_engine import DemoEngine, DemoRequest
from graphkv.models.paged_tiny_hybrid import PagedTinyHybrid
from graphkv.models.tiny_hybrid import TinyHybridConfig, dense_forward, init_weights, model_kv
from graphkv.runtime.capture.graphs import capture
from graphkv.runtime.pool.allocate import allocate
from graphkv.runtime.step.batch import Batch
from graphkv.runtime.step.step import Step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: CUDA graphs cannot be captured on CPU")


def _setup(num_blocks=64, max_num_seqs=8):
    config = TinyHybridConfig()
    limits = graphkv.Limits(max_model_len=256, max_num_seqs=max_num_seqs, max_num_batched_tokens=128,
                            num_blocks_override=num_blocks, cudagraph_mode=graphkv.CudaGraphMode.FULL_DECODE_ONLY)
    plan = graphkv.compile(model_kv(config), limits, None)
    weights = init_weights(config, seed=3)
    model = PagedTinyHybrid(weights.to("cuda"), allocate(plan, "cuda"))
    step = Step(plan, "cuda")
    fwd = capture(plan, static_inputs={"input_ids": step.input_ids})(model.forward)
    return plan, weights, model, step, fwd


def test_captured_decode_steps_equal_the_dense_reference_over_continuous_batching():
    plan, weights, model, step, fwd = _setup()
    report = fwd.capture(progress=False, prepare=step.capture_context)
    assert [k.num_tokens for k in report.keys] == sorted(plan.cudagraph.capture_sizes.decode, reverse=True)
    gen = torch.Generator().manual_seed(5)
    reqs = [DemoRequest(req_id=i, prompt=torch.randint(0, 97, (n,), generator=gen).tolist(), max_new_tokens=m)
            for i, (n, m) in enumerate([(1, 9), (54, 5), (97, 7), (5, 12), (33, 4), (17, 6)])]
    engine = DemoEngine(plan, step, fwd, record=True)
    stats = engine.run(reqs[:3], arrivals={3: reqs[3:5], 7: reqs[5:]})
    assert stats.finished == 6 and stats.pages_reused > 0
    for r in reqs:
        dense = dense_forward(weights, engine.finished[r.req_id])
        rows = [(pos, row) for req, pos, row in engine.records if req == r.req_id]
        assert max((row - dense[pos]).abs().max().item() for pos, row in rows) < 1e-3


def test_replay_allocates_nothing_and_follows_changed_tables():
    plan, weights, model, step, fwd = _setup()
    fwd.capture(progress=False, prepare=step.capture_context)
    ssm = next(g.index for g in plan.groups if g.is_ssm)
    pages = [tuple((1 + 2 * i,) if g.index != ssm else (2 + 2 * i,) for g in plan.groups) for i in range(3)]
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7]]
    prefill = Batch(req_ids=(0, 1, 2), query_lens=tuple(map(len, prompts)), seq_lens=tuple(map(len, prompts)),
                    new_pages=tuple(pages))
    step.run(fwd, prefill, input_ids=[t for p in prompts for t in p])
    tokens = [list(p) for p in prompts]
    ids = torch.zeros(3, dtype=torch.int64, device="cuda")
    for i in range(3):
        tokens[i].append(7 + i)
    before = None
    for n in range(6):
        batch = Batch(req_ids=(0, 1, 2), query_lens=(1, 1, 1), seq_lens=tuple(len(t) for t in tokens))
        ids.copy_(torch.tensor([t[-1] for t in tokens]))
        torch.cuda.synchronize()
        if n == 2:
            before = torch.cuda.memory_allocated()
        logits = step.run(fwd, batch, input_ids=ids)
        torch.cuda.synchronize()
        if n >= 2:
            assert torch.cuda.memory_allocated() == before
        for i in range(3):
            dense = dense_forward(weights, tokens[i])
            assert (logits[i].cpu() - dense[-1]).abs().max().item() < 1e-3
            tokens[i].append(int(logits[i].argmax()))
