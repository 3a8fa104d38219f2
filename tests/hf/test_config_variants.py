"""Config variants transformers runs, served by graphkv.hf equal to the model's own forward.

Each was refused or failed at the first step: Qwen3-Next with key and value head sizes that differ (the plan lays a
recurrent state out [H, value_dim, key_dim], the mixer read it [H, key_dim, value_dim]: a raw einsum error), Gemma-3
with an ``attn_logit_softcapping`` its attention never applies (graphkv applied it, then refused the step), and
Gemma-4 with KV-shared layers (the plan holds no cache for them: "has no cache layer for the model's layers").
"""

import pytest
import torch

from graphkv.hf import tiny_model
from graphkv.runtime import Batch

from hf_harness import own_logits, prompts, serving_loop

LENGTHS = (12, 18)  # one step of 30 tokens (the test limits' 32), both past an 8-token window
NUM_DECODES = 2


def check_served(model, **loop_kwargs) -> None:
    """Prefill :data:`LENGTHS` prompts in one step, then :data:`NUM_DECODES` greedy decode steps: every logits row
    equals the model's own forward."""
    loop = serving_loop(model, logits="all", **loop_kwargs)
    tokens = prompts(LENGTHS)
    pages = iter(range(1, 1 << 16))  # each group its own pages (page IDs are distinct across groups)
    new_pages = tuple(tuple(tuple(next(pages) for _ in range(1 if g.is_ssm else -(-(n + NUM_DECODES) // g.block_size)))
                            for g in loop.plan.groups) for n in LENGTHS)
    ids = tuple(range(len(LENGTHS)))
    logits = loop.run(Batch(req_ids=ids, query_lens=LENGTHS, seq_lens=LENGTHS, new_pages=new_pages),
                      input_ids=[t for p in tokens for t in p])
    start, last = 0, []
    for p in tokens:
        torch.testing.assert_close(logits[start:start + len(p)], own_logits(model, p), atol=1e-4, rtol=1e-4)
        start += len(p)
        last.append(logits[start - 1])
    for _ in range(NUM_DECODES):
        for p, row in zip(tokens, last):
            p.append(int(row.argmax()))
        logits = loop.run(Batch(req_ids=ids, query_lens=(1,) * len(ids), seq_lens=tuple(len(p) for p in tokens)),
                          input_ids=[p[-1] for p in tokens])
        last = [logits[i] for i in range(len(ids))]
        for p, row in zip(tokens, last):
            torch.testing.assert_close(row, own_logits(model, p)[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("key_dim", "value_dim", "kernels"), [
    (8, 16, "auto"), (16, 8, "auto"),
    pytest.param(8, 16, "triton", marks=pytest.mark.slow),  # the K/V write and decode kernels in Triton's interpreter
])
def test_gated_delta_with_key_and_value_head_sizes_that_differ(key_dim: int, value_dim: int, kernels: str) -> None:
    """Qwen3-Next with linear_key_head_dim != linear_value_head_dim (either way round, on the torch and the Triton
    path) serves its own logits; the recurrent state pages are the plan's [H, value_dim, key_dim]."""
    model = tiny_model("qwen3_next", linear_key_head_dim=key_dim, linear_value_head_dim=value_dim)
    check_served(model, kernels=kernels)
    loop = serving_loop(model)
    assert tuple(loop.pool.mamba_states(loop.plan.layers[0].name)[1].shape[1:]) == (4, value_dim, key_dim)


def test_gemma3_keeps_a_softcap_it_does_not_apply() -> None:
    """Gemma-3 with attn_logit_softcapping=0.5: transformers' Gemma-3 keeps the attribute and never caps its scores;
    graphkv serves it uncapped, as transformers computes it (the first step was refused, asking to set it)."""
    model = tiny_model("gemma3_text", attn_logit_softcapping=0.5, sliding_window=8)
    assert model.model.layers[0].self_attn.attn_logit_softcapping == 0.5
    check_served(model)


@pytest.mark.slow
@pytest.mark.parametrize("layer_types, shared", [
    (["sliding_attention", "full_attention", "full_attention"], 1),
    (["sliding_attention", "full_attention", "sliding_attention", "full_attention"], 2),
])
def test_gemma4_kv_shared_layers_read_their_source_layers_cache(layer_types: list, shared: int) -> None:
    """Gemma-4 with num_kv_shared_layers: each shared layer attends over the pages of the last earlier layer of its
    type (a sliding one with its 8-token window) and serves the model's own logits."""
    model = tiny_model("gemma4_text", num_hidden_layers=len(layer_types), layer_types=layer_types,
                       num_kv_shared_layers=shared, sliding_window=8)
    assert sum(m.is_kv_shared_layer for m in model.modules() if type(m).__name__ == "Gemma4TextAttention") == shared
    check_served(model)


def test_a_rope_that_follows_the_longest_position_of_a_call_is_said(caplog):
    """Dynamic NTK and longrope rotary embeddings pick their frequencies from the longest position of each forward
    call (transformers' dynamic_rope_update): a step packs its requests into one call, so the paged model says so at
    set-up (step_dependent_rope and a warning naming the rope type); default rope says nothing."""
    import logging

    dynamic = tiny_model("llama", max_position_embeddings=128,
                         rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))
    with caplog.at_level(logging.WARNING, logger="graphkv.hf.model"):
        loop = serving_loop(dynamic)
    assert loop.model.step_dependent_rope == "dynamic"
    assert "rotary embedding is 'dynamic'" in caplog.text and "longest request of its step" in caplog.text
    assert serving_loop(tiny_model("llama")).model.step_dependent_rope is None
