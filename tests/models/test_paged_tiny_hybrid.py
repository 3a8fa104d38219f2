"""The paged tiny hybrid model equals the dense reference over a continuous-batching run."""

from __future__ import annotations

import pytest
import torch

import graphkv
from graphkv.models.demo_engine import DemoEngine, DemoRequest
from graphkv.models.paged_tiny_hybrid import PagedTinyHybrid
from graphkv.models.tiny_hybrid import TinyHybridConfig, dense_forward, init_weights, model_kv
from graphkv.runtime.pool.allocate import allocate
from graphkv.runtime.step.step import Step


def _engine(pattern: str, *, num_blocks: int, max_num_seqs: int = 3, budget: int = 64, seed: int = 0):
    config = TinyHybridConfig(pattern=pattern)
    plan = graphkv.compile(model_kv(config), graphkv.Limits(max_model_len=128, max_num_seqs=max_num_seqs,
                                                            max_num_batched_tokens=budget,
                                                            num_blocks_override=num_blocks), None)
    weights = init_weights(config, seed=seed)
    model = PagedTinyHybrid(weights, allocate(plan))
    return DemoEngine(plan, Step(plan), model, record=True), weights


def _requests(lengths, new_tokens, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [DemoRequest(req_id=f"r{i}", prompt=torch.randint(0, 97, (n,), generator=gen).tolist(),
                        max_new_tokens=m) for i, (n, m) in enumerate(zip(lengths, new_tokens))]


@pytest.mark.parametrize("pattern", ["MAMA", "AAA", "MMM"])
def test_paged_logits_equal_dense_over_continuous_batching(pattern):
    """Paged logits equal the dense reference for every token of a run where requests join, leave and reuse pages."""
    # 6 requests, at most 3 running, a 64-token step budget (the 97-token prompt is chunked),
    # and a pool too small for all of them at once: finished requests' pages are reused.
    engine, weights = _engine(pattern, num_blocks=24)
    reqs = _requests([1, 54, 97, 5, 33, 17], [6, 3, 4, 8, 2, 5])
    stats = engine.run(reqs[:2], arrivals={2: reqs[2:4], 5: reqs[4:]})
    assert stats.finished == 6
    assert sorted(engine.finished) == [r.req_id for r in reqs]
    for r in reqs:
        assert len(engine.finished[r.req_id]) == len(r.prompt) + r.max_new_tokens
    if pattern != "MMM":  # attention pages are handed out again after a request finished
        assert stats.pages_reused > 0
    dense = {r.req_id: dense_forward(weights, engine.finished[r.req_id]) for r in reqs}
    # every token position of every request was computed exactly once, in some step
    positions = sorted((req, pos) for req, pos, _ in engine.records)
    assert positions == sorted((r.req_id, p) for r in reqs for p in range(len(engine.finished[r.req_id]) - 1))
    worst = max((row - dense[req][pos]).abs().max().item() for req, pos, row in engine.records)
    assert worst < 2e-4
    # greedy tokens follow the dense logits
    for r in reqs:
        toks = engine.finished[r.req_id]
        expect = dense[r.req_id][len(r.prompt) - 1:-1].argmax(-1).tolist()
        assert toks[len(r.prompt):] == expect


@pytest.mark.slow
def test_compiled_attention_equals_dense():
    """The GPU default (flex compiled) on CPU: same logits as the dense reference."""
    config = TinyHybridConfig()
    plan = graphkv.compile(model_kv(config), graphkv.Limits(max_model_len=128, max_num_seqs=2,
                                                            max_num_batched_tokens=64, num_blocks_override=24), None)
    weights = init_weights(config, seed=2)
    model = PagedTinyHybrid(weights, allocate(plan), compile_attention=True)
    engine = DemoEngine(plan, Step(plan), model, record=True)
    reqs = _requests([9, 40], [3, 2], seed=4)
    engine.run(reqs)
    dense = {r.req_id: dense_forward(weights, engine.finished[r.req_id]) for r in reqs}
    assert max((row - dense[req][pos]).abs().max().item() for req, pos, row in engine.records) < 2e-4


def test_requests_that_each_fit_the_pool_all_finish_when_they_do_not_fit_together():
    """Admission promises each request its lifetime pages, so running requests never all wait for pages."""
    # 4 usable pages; each request ends with 3 attention pages + 1 state page, and starts with 2:
    # admitting both at once would leave both waiting for a 3rd page forever (no preemption).
    config = TinyHybridConfig(pattern="MA")
    plan = graphkv.compile(model_kv(config), graphkv.Limits(max_model_len=48, max_num_seqs=2, max_num_batched_tokens=32,
                                                            num_blocks_override=5), None)
    engine = DemoEngine(plan, Step(plan), PagedTinyHybrid(init_weights(config), allocate(plan)))
    stats = engine.run(_requests([15, 15], [33, 33]), max_steps=200)
    assert stats.finished == 2 and stats.pages_reused == 4
