"""Paged flex attention vs a dense SDPA reference: eager, full capacity, buffer edges, compiled."""

import pytest
import torch

import graphkv
from graphkv import FullAttentionSpec, Limits, ModelKV, SlidingWindowSpec, SpecError
from graphkv.runtime.flex.attention import paged_flex_attention
from graphkv.runtime.flex.views import paged_kv_views
from graphkv.runtime.flex.mask import FlexMaskBuilder

from flex_reference import builder_for, dense_reference, make_paged_batch
from torch_support import compiled_cpu_flex

SCALE = 0.3

# (query_lens, seq_lens, kernel_block_size, bpk, window, hq, hkv, extra make_paged_batch kwargs)
CASES = {
    "prefill-1-54-97-232": ([1, 54, 97, 232], [1, 54, 97, 232], 16, 1, None, 4, 2, {}),
    "mixed-prefill-decode": ([1, 40, 97, 1, 232], [1000, 54, 200, 97, 232], 16, 1, None, 4, 2, {}),
    "decode-only-kbs32": ([1] * 6, [1, 54, 97, 232, 1000, 17], 32, 1, None, 8, 1, {}),
    "mixed-bpk2": ([1, 54, 3, 232], [1000, 54, 97, 500], 16, 2, None, 4, 2, {}),
    "window-100": ([1, 40, 97, 232], [1000, 54, 300, 232], 16, 1, 100, 4, 2, {}),
    "window-kbs32-bpk2-freed-reused": ([1, 3, 200], [1000, 300, 700], 32, 2, 97, 4, 4,
                                       {"null_pages_before": [10, 0, 3], "reuse": [(0, 2, 15)]}),
    "prefix-shared": ([1, 1, 130], [300, 300, 400], 16, 1, None, 6, 2, {"shared_prefix_pages": 10}),
}


def _batch(case, *, seed=0, pad=7):
    q, s, kbs, bpk, window, hq, hkv, extra = CASES[case]
    kw = dict(query_lens=q, seq_lens=s, kernel_block_size=kbs, bpk=bpk, max_num_seqs=8, hq=hq, hkv=hkv,
              num_tokens_padded=sum(q) + pad, seed=seed, **extra)
    return make_paged_batch(**kw), bpk, window


@pytest.mark.parametrize("case", sorted(CASES))
def test_eager_matches_dense_reference(case):
    """Packed varlen queries over shuffled pages match per-request SDPA; padding tokens give zeros."""
    batch, bpk, window = _batch(case)
    builder = builder_for(batch, bpk=bpk, window=window)
    padded = batch.query.shape[0]
    out = paged_flex_attention(batch.query, batch.kv_cache, builder.build(batch.num_reqs, num_tokens_padded=padded),
                               scale=SCALE)
    assert out.shape == batch.query.shape
    torch.testing.assert_close(out.double(), dense_reference(batch, window=window, scale=SCALE), atol=2e-5, rtol=1e-4)
    assert (out[batch.num_tokens:] == 0).all()


def test_kv_views_are_views_of_the_cache():
    """K and V are [1, Hkv, num_kernel_blocks * kbs, D] views sharing the cache's storage."""
    cache = torch.randn(2, 5, 16, 2, 8)
    k, v = paged_kv_views(cache)
    assert k.shape == v.shape == (1, 2, 80, 8)
    assert k.data_ptr() == cache.data_ptr() and v.data_ptr() == cache[1].data_ptr()
    assert torch.equal(k[0, 1, 37], cache[0, 2, 5, 1])


def test_kv_views_reject_a_cache_without_a_token_stride():
    """HND kernel blocks, or a kernel-block stride that is not whole K halves, have no token stride; errors name it."""
    hnd = torch.randn(2, 5, 2, 16, 8).transpose(2, 3)  # (2, N, kbs, H, D) stored as (2, N, H, kbs, D)
    with pytest.raises(SpecError, match=r"kv_cache\.stride\(\)=.*NHD inside each kernel block"):
        paged_kv_views(hnd)
    padded = torch.randn(5, 2 * 16 * 2 * 8 + 8).as_strided((2, 5, 16, 2, 8), (256, 520, 16, 8, 1))
    with pytest.raises(SpecError, match=r"kv_cache\.stride\(1\)=520: .*multiple of kbs x heads x head_size = 256"):
        paged_kv_views(padded)


def _plan(max_model_len, max_num_batched_tokens, max_num_seqs, num_blocks, spec=None):
    spec = spec or FullAttentionSpec(num_kv_heads=1, head_size=16, dtype="float32")
    return graphkv.compile(ModelKV.from_specs("flex-model", [(spec, "flex")]),
                           Limits(max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
                                  max_num_seqs=max_num_seqs, num_blocks_override=num_blocks))


def _run_plan_step(plan, query_lens, seq_lens, *, hq=2, window=None):
    """Allocate the plan's flex buffers, fill one step, compare with the reference; returns the builder."""
    group = plan.groups[0]
    seqs, tokens = plan.limits.max_num_seqs, plan.limits.max_num_batched_tokens
    batch = make_paged_batch(query_lens=query_lens, seq_lens=seq_lens, kernel_block_size=group.kernel_block_size,
                             bpk=group.bpk, num_pages=plan.num_blocks, max_num_seqs=seqs,
                             width=group.block_table_width, num_tokens_padded=tokens, hq=hq, hkv=1)
    bufs = plan.buffers
    allocated = {a.name: a for a in plan.ledger.allocations("cuda")}
    assert batch.block_table.shape == (seqs, group.block_table_width)
    assert (batch.block_table.numel(),) == allocated["tables.device"].part("step_rows").shape  # one group
    assert tuple(batch.query_start_loc.shape) == allocated["staging.int32"].part("query_start_loc").shape
    builder = FlexMaskBuilder.from_plan(plan, 0, block_table=batch.block_table,
                                        query_start_loc=batch.query_start_loc, seq_lens=batch.seq_lens)
    assert builder.kv_num_blocks.shape == bufs["flex.0.kv_num_blocks"].shape
    mask = builder.build(batch.num_reqs, num_tokens_padded=tokens)
    out = paged_flex_attention(batch.query, batch.kv_cache, mask, scale=SCALE)
    torch.testing.assert_close(out.double(), dense_reference(batch, window=window, scale=SCALE), atol=2e-5, rtol=1e-4)
    return builder


def test_full_capacity_step_with_more_step_tokens_than_max_model_len():
    """max_model_len 512 with 8192 tokens per step (the upstream crash shape) runs a full 8192-token step."""
    plan = _plan(512, 8192, 32, 600)
    assert plan.buffers["flex.0.kv_num_blocks"].shape == (64,)
    assert plan.buffers["flex.0.kv_indices"].shape == (64, 600)  # min(32 seqs x 32 blocks, 600 pool blocks)
    query_lens = [512] * 15 + [496] + [1] * 16
    seq_lens = [512] * 16 + [20 + i for i in range(16)]
    assert sum(query_lens) == 8192
    builder = _run_plan_step(plan, query_lens, seq_lens)
    assert int(builder.kv_num_blocks[-1]) > 0  # the last tile is used


@pytest.mark.parametrize("max_num_batched_tokens, max_model_len, query_lens, seq_lens", [
    (128, 64, [64, 63, 1], [64, 63, 30]),  # exactly one query tile
    (129, 64, [64, 64, 1], [64, 64, 50]),  # a second tile holding one token
    (129, 16, [16] * 8 + [1], [16] * 8 + [16]),  # max_model_len == kernel block size
])
def test_buffer_edges(max_num_batched_tokens, max_model_len, query_lens, seq_lens):
    """The smallest step / length combinations at the edges of the flex buffers run at full capacity."""
    plan = _plan(max_model_len, max_num_batched_tokens, 9, 40)
    assert sum(query_lens) == max_num_batched_tokens
    tiles = -(-max_num_batched_tokens // 128)
    assert plan.buffers["flex.0.kv_num_blocks"].shape == (tiles,)
    _run_plan_step(plan, query_lens, seq_lens)


def test_sliding_window_plan_step():
    """A sliding-window flex group from a plan attends only its window."""
    spec = SlidingWindowSpec(num_kv_heads=1, head_size=16, window=48, dtype="float32")
    plan = _plan(256, 256, 4, 64, spec=spec)
    _run_plan_step(plan, [1, 100, 1], [256, 200, 77], window=48)


@compiled_cpu_flex
@pytest.mark.slow
def test_compiled_attention_does_not_recompile_when_the_batch_changes():
    """Compiled once at a fixed padded size, mixed, decode and fewer-request steps reuse the graph and match SDPA."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    kbs, bpk, seqs, width, pages, padded = 16, 2, 8, 72, 96, 256
    first = make_paged_batch(query_lens=[1, 54, 97], seq_lens=[1, 54, 97], kernel_block_size=kbs, bpk=bpk,
                             num_pages=pages, max_num_seqs=seqs, width=width, num_tokens_padded=padded)
    builder = builder_for(first, bpk=bpk)
    counter = CompileCounterWithBackend("inductor")
    attention = torch.compile(paged_flex_attention, backend=counter, fullgraph=True)
    steps = [([1, 54, 97], [1, 54, 97]), ([1] * 8, [300, 1, 17, 1000, 40, 41, 232, 2]), ([200, 1], [232, 1000])]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed, (query_lens, seq_lens) in enumerate(steps):
            batch = make_paged_batch(query_lens=query_lens, seq_lens=seq_lens, kernel_block_size=kbs, bpk=bpk,
                                     num_pages=pages, max_num_seqs=seqs, width=width, num_tokens_padded=padded,
                                     seed=seed, kv_cache=first.kv_cache)
            for dst, src in ((first.block_table, batch.block_table), (first.query_start_loc, batch.query_start_loc),
                             (first.seq_lens, batch.seq_lens), (first.query, batch.query)):
                dst.copy_(src)
            mask = builder.build(torch.tensor(batch.num_reqs), num_tokens_padded=padded)
            out = attention(first.query, first.kv_cache, mask, scale=SCALE)
            torch.testing.assert_close(out.double(), dense_reference(batch, scale=SCALE), atol=2e-5, rtol=1e-4)
    assert counter.frame_count == 1


@compiled_cpu_flex
@pytest.mark.slow
def test_compiled_single_token_decode():
    """A compiled one-token decode over a long cache works (its tile lists most blocks as full)."""
    import torch._dynamo

    torch._dynamo.reset()
    batch = make_paged_batch(query_lens=[1], seq_lens=[1000], kernel_block_size=16, num_pages=80, max_num_seqs=2,
                             width=64, num_tokens_padded=1, hq=4, hkv=2)
    builder = builder_for(batch)
    out = torch.compile(paged_flex_attention, fullgraph=True)(
        batch.query, batch.kv_cache, builder.build(1, num_tokens_padded=1), scale=SCALE)
    torch.testing.assert_close(out.double(), dense_reference(batch, scale=SCALE), atol=2e-5, rtol=1e-4)


def test_the_one_call_form_is_refused_compiled_on_cuda_only() -> None:
    """Compiled CUDA flex over as_strided views built inside the compiled function was wrong on an H200 (torch 2.11):
    that form is refused with the fix; eager calls and CPU compiles pass the check."""
    from graphkv.errors import SpecError
    from graphkv.runtime.flex.attention import _refuse_compiled_views

    _refuse_compiled_views("cuda", False)
    _refuse_compiled_views("cpu", True)
    with pytest.raises(SpecError, match="compile through graphkv.runtime.flex.region.FlexRegions"):
        _refuse_compiled_views("cuda", True)


@pytest.mark.parametrize("case", ["mixed-prefill-decode", "window-100"])
def test_regions_soft_cap_the_scores_as_the_reference(case):
    """A region with ``softcap`` (Gemma-2's attention-logit soft-capping) matches the reference that caps
    ``scale * q.k`` with ``softcap * tanh(score / softcap)``, and differs from the uncapped result (the scores are
    scaled up so the cap bites); capped and uncapped regions of one builder are two regions."""
    from graphkv.runtime.flex.region import FlexRegions

    batch, bpk, window = _batch(case)
    batch.query.mul_(8.0)  # scores of a few units, well past a 2.0 cap
    builder = builder_for(batch, bpk=bpk, window=window)
    builder.build(batch.num_reqs, num_tokens_padded=batch.query.shape[0])
    key, value = paged_kv_views(batch.kv_cache)
    regions = FlexRegions(compile=False)
    capped = regions.attend(batch.query, key, value, builder, scale=SCALE, softcap=2.0)
    plain = regions.attend(batch.query, key, value, builder, scale=SCALE)
    assert regions.num_regions == 2
    n = batch.num_tokens
    torch.testing.assert_close(capped[:n].double(), dense_reference(batch, window=window, scale=SCALE, softcap=2.0)[:n],
                               atol=2e-5, rtol=1e-4)
    assert (capped[:n] - plain[:n]).abs().max() > 0.05
