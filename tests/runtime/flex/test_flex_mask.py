"""Flex block masks built from block tables: block lists, inverse map, buffers, geometry."""

import pytest
import torch

import graphkv
from graphkv import ChunkedLocalSpec, FullAttentionSpec, Limits, ModelKV, PlanError, SlidingWindowSpec, SpecError
from graphkv.runtime.flex.geometry import FlexMaskGeometry
from graphkv.runtime.flex.mask import FlexMaskBuilder

from flex_reference import builder_for, listed_blocks, make_paged_batch, needed_blocks

# (query_lens, seq_lens, kernel_block_size, bpk, window, extra make_paged_batch kwargs)
CASES = {
    "prefill-1-54-97-232": ([1, 54, 97, 232], [1, 54, 97, 232], 16, 1, None, {}),
    "mixed-1000": ([1, 40, 97, 1, 232], [1000, 54, 200, 97, 232], 16, 1, None, {}),
    "decode-kbs32": ([1] * 6, [1, 54, 97, 232, 1000, 17], 32, 1, None, {}),
    "mixed-bpk2": ([1, 54, 3, 232], [1000, 54, 97, 500], 16, 2, None, {}),
    "window-100": ([1, 40, 97, 232], [1000, 54, 300, 232], 16, 1, 100, {}),
    "window-kbs32-bpk2-freed": ([1, 3, 200], [1000, 300, 700], 32, 2, 97,
                                {"null_pages_before": [10, 0, 3]}),
    "prefix-shared": ([1, 1, 130], [300, 300, 400], 16, 1, None, {"shared_prefix_pages": 10}),
}


def _batch(case, *, padded=None, seed=0, **overrides):
    q, s, kbs, bpk, window, extra = CASES[case]
    kw = dict(query_lens=q, seq_lens=s, kernel_block_size=kbs, bpk=bpk, max_num_seqs=8,
              num_tokens_padded=padded or sum(q) + 5, seed=seed, **extra)
    kw.update(overrides)
    return make_paged_batch(**kw), bpk, window


@pytest.mark.parametrize("case", sorted(CASES))
def test_block_lists_equal_create_block_mask(case):
    """Each query tile lists exactly the kernel blocks create_block_mask finds for the same mask, once each."""
    batch, bpk, window = _batch(case)
    builder = builder_for(batch, bpk=bpk, window=window)
    padded = batch.query.shape[0]
    builder.build(batch.num_reqs, num_tokens_padded=padded)
    g = builder.geometry
    want = needed_blocks(builder.mask_mod, num_tokens_padded=padded, kv_tokens=g.kv_tokens, q_tile=g.q_tile_tokens,
                         kernel_block_size=g.kernel_block_size, num_kernel_blocks=g.num_kernel_blocks)
    assert torch.equal(listed_blocks(builder, padded), want)
    for t in range(want.shape[0]):
        row = builder.kv_indices[t, :int(builder.kv_num_blocks[t])].tolist()
        assert len(set(row)) == len(row)
        assert not any(b < bpk for b in row)  # the null page


@pytest.mark.parametrize("case", ["decode-kbs32", "mixed-bpk2", "window-100"])
def test_a_step_rebuilds_only_its_own_query_tiles(case):
    """Under an 8192-token budget a step lists what it lists under a budget of its own size, and the
    tiles past its padded tokens are not touched (the build's work follows the step, not the budget)."""
    batch, bpk, window = _batch(case)
    padded = batch.query.shape[0]
    small = builder_for(batch, bpk=bpk, window=window)
    big = builder_for(batch, bpk=bpk, window=window, budget=8192)
    assert big.geometry.num_q_tiles == 64 and small.geometry.num_q_tiles == -(-padded // 128)
    big.kv_num_blocks.fill_(-3)
    for builder in (small, big):
        builder.build(batch.num_reqs, num_tokens_padded=padded)
    tiles = small.geometry.num_q_tiles
    assert torch.equal(listed_blocks(big, padded), listed_blocks(small, padded))
    assert (big.kv_num_blocks[tiles:] == -3).all()


def test_window_keeps_only_blocks_touching_the_window():
    """A decode at position 999 with window 100 lists kernel blocks of positions 900..999 only."""
    batch = make_paged_batch(query_lens=[1], seq_lens=[1000], kernel_block_size=16, num_pages=80, max_num_seqs=2,
                             width=64, num_tokens_padded=1)
    builder = builder_for(batch, window=100)
    builder.build(1, num_tokens_padded=1)
    # Positions 900..999 live in logical kernel blocks 56..62: 57..61 (912..991) whole, 56 (896..911, 900 on)
    # and 62 (992..1007, up to 999) in part.
    assert (int(builder.kv_num_blocks[0]), int(builder.full_kv_num_blocks[0])) == (2, 5)
    assert builder.kv_indices[0, :2].tolist() == sorted(batch.block_table[0, [56, 62]].tolist())
    assert builder.full_kv_indices[0, :5].tolist() == batch.block_table[0, 57:62].tolist()


def test_reused_page_maps_to_its_latest_logical_index():
    """A physical page at a stale (out-of-window) index and a live one maps to the live, higher index."""
    batch = make_paged_batch(query_lens=[1], seq_lens=[1000], kernel_block_size=16, bpk=2, num_pages=40,
                             max_num_seqs=2, width=64, num_tokens_padded=1, reuse=[(0, 3, 30)])
    builder = builder_for(batch, bpk=2, window=64)
    builder.build(1, num_tokens_padded=1)
    page_blocks = batch.block_table[0, 60:62].long()  # page index 30 = kernel blocks 60, 61
    assert torch.equal(batch.block_table[0, 6:8], batch.block_table[0, 60:62])
    assert builder.kernel_block_logical[page_blocks].tolist() == [60, 61]


def test_null_page_and_dead_rows_are_never_listed():
    """Kernel blocks of page 0 and rows past num_reqs (junk included) never reach the lists or the inverse map."""
    clean, _, _ = _batch("window-kbs32-bpk2-freed", junk_rows=False)
    junk, _, _ = _batch("window-kbs32-bpk2-freed", junk_rows=True)
    out = []
    for batch in (clean, junk):
        builder = builder_for(batch, bpk=2, window=97)
        builder.build(batch.num_reqs, num_tokens_padded=batch.query.shape[0])
        assert builder.kernel_block_logical[:2].tolist() == [-1, -1]
        out.append((builder.kv_num_blocks.clone(), builder.kv_indices.clone(), builder.token_pos.clone()))
    assert all(torch.equal(a, b) for a, b in zip(*out))


def test_padding_tokens_have_no_position():
    """Tokens past query_start_loc[num_reqs] get position -1, so they attend nothing."""
    batch, bpk, window = _batch("mixed-1000", padded=400)
    builder = builder_for(batch, bpk=bpk, window=window)
    builder.build(batch.num_reqs, num_tokens_padded=400)
    n = batch.num_tokens
    assert (builder.token_pos[n:] == -1).all()
    assert builder.token_pos[:n].tolist() == [p for q, s in zip([1, 40, 97, 1, 232], [1000, 54, 200, 97, 232])
                                              for p in range(s - q, s)]


def test_persistent_buffers_keep_their_storage_across_steps():
    """Every persistent buffer keeps its data_ptr over steps of different composition; masks view them."""
    batch, bpk, window = _batch("mixed-bpk2", padded=300)
    builder = builder_for(batch, bpk=bpk, window=window)
    before = {name: t.data_ptr() for name, t in builder.named_buffers().items()}
    for seed, num_reqs in ((1, 4), (2, 2), (3, 1)):
        fresh, _, _ = _batch("mixed-bpk2", padded=300, seed=seed)
        for dst, src in ((batch.block_table, fresh.block_table), (batch.query_start_loc, fresh.query_start_loc),
                         (batch.seq_lens, fresh.seq_lens)):
            dst.copy_(src)
        mask = builder.build(num_reqs, num_tokens_padded=300)
        assert {name: t.data_ptr() for name, t in builder.named_buffers().items()} == before
        assert mask.kv_indices.data_ptr() == builder.kv_indices.data_ptr()
        assert mask.kv_num_blocks.data_ptr() == builder.kv_num_blocks.data_ptr()


def test_build_allocates_no_buffers():
    """A warm build allocates nothing larger than a wrapped Python scalar (no per-step tensors)."""
    from torch.profiler import ProfilerActivity, profile

    batch, bpk, window = _batch("window-100")
    builder = builder_for(batch, bpk=bpk, window=window)
    builder.build(batch.num_reqs, num_tokens_padded=batch.query.shape[0])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        builder.build(batch.num_reqs, num_tokens_padded=batch.query.shape[0])
    sizes = [e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0]
    assert max(sizes, default=0) <= 8


def test_num_reqs_may_be_a_tensor():
    """A 0-d tensor num_reqs (what compiled callers pass) gives the same buffers as an int."""
    batch, bpk, window = _batch("prefill-1-54-97-232")
    builder = builder_for(batch, bpk=bpk, window=window)
    builder.build(batch.num_reqs, num_tokens_padded=batch.query.shape[0])
    first = builder.kv_indices.clone(), builder.token_row.clone()
    builder.build(torch.tensor(batch.num_reqs), num_tokens_padded=batch.query.shape[0])
    assert torch.equal(first[0], builder.kv_indices) and torch.equal(first[1], builder.token_row)


def _flex_plan(spec, **limits):
    return graphkv.compile(ModelKV.from_specs("m", [(spec, "flex")]), Limits(**limits))


def test_geometry_reads_the_plan():
    """Tiles, widths, pool and window come from the plan; on CPU kv_indices spans the pool."""
    spec = SlidingWindowSpec(num_kv_heads=1, head_size=16, window=300, dtype="float32")
    plan = _flex_plan(spec, max_model_len=512, max_num_batched_tokens=8192, max_num_seqs=16, num_blocks_override=2000)
    g = FlexMaskGeometry.from_plan(plan, 0)
    assert (g.num_q_tiles, g.q_tile_tokens, g.max_padded_tokens) == (64, 128, 8192)
    assert g.kv_indices_width == plan.buffers["flex.0.kv_indices"].shape[1] == 16 * 32
    assert (g.num_kernel_blocks, g.window, g.block_table_width) == (2000, 300, plan.groups[0].block_table_width)
    assert g.for_device("cpu").kv_indices_width == 2000
    assert g.for_device("meta").kv_indices_width == 16 * 32


def test_geometry_rejects_groups_flex_does_not_serve():
    """A non-flex group or a chunked-local group is a PlanError naming the group."""
    full = FullAttentionSpec(num_kv_heads=1, head_size=16)
    limits = Limits(max_model_len=64, max_num_batched_tokens=128, num_blocks_override=64, max_num_seqs=4)
    other = graphkv.compile(ModelKV.from_specs("m", [(full, "triton_paged")]), limits)
    with pytest.raises(PlanError, match=r"groups\[0\]\.backends.*'flex' backend"):
        FlexMaskGeometry.from_plan(other, 0)
    chunked = _flex_plan(ChunkedLocalSpec(num_kv_heads=1, head_size=16, chunk=64), max_model_len=64,
                         max_num_batched_tokens=128, num_blocks_override=64, max_num_seqs=4)
    with pytest.raises(PlanError, match=r"groups\[0\]\.kind.*full and sliding-window"):
        FlexMaskGeometry.from_plan(chunked, 0)


def test_builder_rejects_inputs_of_the_wrong_shape():
    """Bound inputs must match the plan; every wrong one is named in one SpecError."""
    plan = _flex_plan(FullAttentionSpec(num_kv_heads=1, head_size=16), max_model_len=64, max_num_batched_tokens=128,
                      num_blocks_override=64, max_num_seqs=4)
    with pytest.raises(SpecError, match=r"2 problems:(.|\n)*block_table(.|\n)*seq_lens=.*\(4,\)"):
        FlexMaskBuilder.from_plan(plan, 0, block_table=torch.zeros(3, 4, dtype=torch.int32),
                                  query_start_loc=torch.zeros(5, dtype=torch.int32),
                                  seq_lens=torch.zeros(4, dtype=torch.int64))


def test_padded_size_beyond_the_tiles_is_refused():
    """num_tokens_padded past the planned query tiles is a SpecError naming the limit."""
    batch, bpk, window = _batch("prefill-1-54-97-232", padded=400)
    builder = builder_for(batch, bpk=bpk, window=window)
    with pytest.raises(SpecError, match=r"num_tokens_padded=513: must be in 1\.\.512"):
        builder.build(batch.num_reqs, num_tokens_padded=513)


def test_group_mixing_windows_is_refused_before_any_allocation():
    """A plan that allocates a sliding-window layer as full attention beside a full one (disable_hybrid_kv_cache_manager)
    puts two windows in one group; flex masks take one per group, so the step refuses it naming both windows."""
    from graphkv import Budget, FullAttentionSpec, Limits, ModelKV, PlanError, SlidingWindowSpec, compile_plan
    from graphkv.runtime import Step

    model = ModelKV.from_specs("m", [(SlidingWindowSpec(num_kv_heads=2, head_size=64, window=32), "flex"),
                                     (FullAttentionSpec(num_kv_heads=2, head_size=64), "flex")])
    limits = Limits(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64, disable_hybrid_kv_cache_manager=True)
    plan = compile_plan(model, limits, Budget.kv_bytes("4MiB"))
    with pytest.raises(PlanError, match=r"groups\[0\]=\{'layers.0': 32, 'layers.1': None\}: flex masks take one "
                                        "sliding window and no chunk per group"):
        Step(plan, "cpu")


def test_group_with_promoted_chunked_layers_is_refused():
    """Chunked-local layers allocated as full attention (vLLM 0.33's automatic choice) would run as plain causal
    attention in a flex mask: the geometry refuses the group, naming the chunked layer."""
    model = ModelKV.from_specs("l4", [(ChunkedLocalSpec(num_kv_heads=2, head_size=64, chunk=64), "flex"),
                                      (FullAttentionSpec(num_kv_heads=2, head_size=64), "flex")])
    plan = graphkv.compile_plan(model, Limits(max_model_len=1024, max_num_seqs=4, max_num_batched_tokens=256),
                                graphkv.Budget.kv_bytes("4MiB"))
    with pytest.raises(PlanError, match=r"chunked-local layers \(layers.0\) allocated as full attention"):
        FlexMaskGeometry.from_plan(plan, 0)
