"""Full blocks of flex masks: exactly the blocks every query of a one-request tile sees whole, never listed twice."""

import pytest
import torch

from graphkv.runtime.flex.attention import paged_flex_attention
from graphkv.runtime.flex.geometry import FlexMaskGeometry

from flex_reference import (block_lists, block_sparse_reference, builder_for, dense_reference, make_paged_batch,
                            needed_blocks, wholly_visible_blocks)
from torch_support import compiled_cpu_flex

SCALE = 0.3

# (query_lens, seq_lens, kernel_block_size, bpk, window, q_tile, extra make_paged_batch kwargs). Pools are
# larger than the plan's kv_indices width, so the CPU and CUDA geometries differ.
CASES = {
    "prompt-40-kbs16-tile16": ([40], [40], 16, 1, None, 16, {}),
    "prompts-ending-mid-block-tile32": ([37, 50, 9, 70], [37, 50, 9, 70], 16, 1, None, 32, {}),
    "prefix-cached-kbs32": ([45, 80], [145, 117], 32, 1, None, 16, {}),
    "chunk-continuing-a-request-bpk2": ([64, 1, 33], [194, 500, 97], 16, 2, None, 32, {}),
    "window-8-below-block": ([100, 60], [100, 160], 16, 1, 8, 16, {}),
    "window-40-above-block": ([120, 1, 70], [200, 300, 70], 16, 1, 40, 16, {}),
    "window-64-kbs32": ([120, 70], [200, 70], 32, 1, 64, 16, {}),
    # Window 20 < q_tile + kbs - 1: a whole tile (positions 15..46) has none; the 2-query last tile (47, 48) has one.
    "window-20-short-last-tile": ([34], [49], 16, 1, 20, 32, {}),
    # Window 47: a tile's last query (position 16t + 15) keeps keys from 16t - 31 on, so block t - 2 is just out.
    "window-47-edge": ([160, 40], [160, 100], 16, 1, 47, 16, {}),
    "window-100-freed-pages-bpk2": ([1, 3, 200], [1000, 300, 700], 32, 2, 97, 32, {"null_pages_before": [10, 0, 3]}),
    "prefix-shared-window": ([1, 1, 130], [300, 300, 400], 16, 1, 100, 32, {"shared_prefix_pages": 10}),
    "decode-batch-kbs32": ([1] * 6, [1, 54, 97, 232, 1000, 17], 32, 1, None, 16, {}),
    "one-decode": ([1], [300], 16, 1, None, 16, {}),
    # Every batch row live: padding queries get the last row's index (clamped), yet see nothing.
    "every-row-live": ([20, 50], [20, 70], 16, 1, None, 16, {"max_num_seqs": 2}),
}
PADS = {"unpadded": 0, "padded-7": 7, "padded-to-a-tile": None}  # None: up to a whole query tile more


@pytest.fixture(params=["cpu", "cuda"])
def geometry(request, monkeypatch):
    """The mask geometry of a device kind: on CPU kv_indices spans the pool (searched over the plan's width);
    "cuda" keeps the plan's width, searched in place (FlexMaskGeometry.for_device leaves it as planned)."""
    if request.param == "cuda":
        monkeypatch.setattr(FlexMaskGeometry, "for_device", lambda self, device: self)
    return request.param


def _step(case, pad, *, seed=0, mark_full_blocks=True, **overrides):
    q, s, kbs, bpk, window, q_tile, extra = CASES[case]
    real = sum(q)
    padded = real + (pad if pad is not None else q_tile - real % q_tile)
    pages = [-(-n // (kbs * bpk)) for n in s]
    # More pool kernel blocks than the plan's kv_indices width, min(8 rows, q_tile) x (longest + 1 page) x bpk.
    kw = dict(query_lens=q, seq_lens=s, kernel_block_size=kbs, bpk=bpk, max_num_seqs=8, num_tokens_padded=padded,
              num_pages=sum(pages) + 8 * (max(pages) + 1) + 1, seed=seed)
    kw.update(extra, **overrides)
    batch = make_paged_batch(**kw)
    builder = builder_for(batch, bpk=bpk, window=window, q_tile=q_tile, mark_full_blocks=mark_full_blocks)
    return batch, builder, window, padded


def _check_geometry(builder, geometry):
    g = builder.geometry
    assert g.kv_indices_width < g.num_kv_blocks if geometry == "cuda" else g.searched_width is not None


def _needed(builder, padded):
    """create_block_mask's blocks (partial or full) of the builder's mask_mod, per tile."""
    g = builder.geometry
    return needed_blocks(builder.mask_mod, num_tokens_padded=padded, kv_tokens=g.kv_tokens, q_tile=g.q_tile_tokens,
                         kernel_block_size=g.kernel_block_size, num_kernel_blocks=g.num_kernel_blocks)


@pytest.mark.parametrize("pad", sorted(PADS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_full_blocks_are_the_wholly_visible_ones(case, pad, geometry):
    """Full lists equal a brute-force scan of the mask_mod; partial ∪ full is create_block_mask's set, disjoint."""
    batch, builder, _, padded = _step(case, PADS[pad])
    _check_geometry(builder, geometry)
    builder.build(batch.num_reqs, num_tokens_padded=padded)
    g = builder.geometry
    lists = block_lists(builder, padded)
    assert lists.repeats == 0
    assert not (lists.partial & lists.full).any()
    tiles = lists.full.shape[0]
    assert (builder.full_kv_num_blocks[:tiles] >= 0).all() and (builder.kv_num_blocks[:tiles] >= 0).all()
    assert torch.equal(lists.full, wholly_visible_blocks(builder, padded))
    assert torch.equal(lists.partial | lists.full, _needed(builder, padded))
    assert not (lists.partial | lists.full)[:, :g.bpk].any()  # the null page
    # A tile holding a padding query (below num_tokens_padded) has no full blocks.
    tile = g.q_tile_tokens
    for t in range(lists.full.shape[0]):
        if (builder.token_pos[t * tile:min((t + 1) * tile, padded)] < 0).any():
            assert int(builder.full_kv_num_blocks[t]) == 0


def test_cases_mark_full_blocks_where_expected():
    """The cases exercise full blocks (prefills, chunks, windows, a lone decode) and steps that can have none: a
    decode batch (every tile spans requests) and a window narrower than a kernel block."""
    marked = {}
    for case in CASES:
        batch, builder, _, padded = _step(case, 0)
        builder.build(batch.num_reqs, num_tokens_padded=padded)
        marked[case] = int(builder.full_kv_num_blocks[:-(-padded // builder.geometry.q_tile_tokens)].sum())
    none = {"decode-batch-kbs32", "window-8-below-block"}
    assert all((n == 0) == (case in none) for case, n in marked.items()), marked


@pytest.mark.parametrize("padded, partial, full", [
    (40, [1, 1, 1], [0, 1, 2]),  # tile 2 holds queries 32..39 of 40: blocks 0, 1 whole, block 2 in part
    (48, [1, 1, 3], [0, 1, 0]),  # padding queries 40..47 in tile 2 see nothing: no full blocks there
])
def test_hand_worked_prompt_of_40_tokens(padded, partial, full, geometry):
    """One 40-token prompt, kernel block 16, query tile 16: tile t sees blocks 0..t-1 whole and block t in part."""
    batch, builder, _, _ = _step("prompt-40-kbs16-tile16", padded - 40)
    _check_geometry(builder, geometry)
    builder.build(1, num_tokens_padded=padded)
    assert builder.kv_num_blocks[:3].tolist() == partial
    assert builder.full_kv_num_blocks[:3].tolist() == full
    table = batch.block_table[0].tolist()
    assert [builder.full_kv_indices[t, :full[t]].tolist() for t in range(3)] == [table[:n] for n in full]
    want_partial = [[table[0]], [table[1]], [table[2]] if padded == 40 else sorted(table[:3])]
    assert [sorted(builder.kv_indices[t, :partial[t]].tolist()) for t in range(3)] == want_partial


@pytest.mark.parametrize("pad", sorted(PADS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_block_sparse_outputs_match_the_reference(case, pad, geometry):
    """Attention with BlockMask semantics (full blocks unmasked) equals the dense reference and the output
    without full blocks to 1e-5 in float32; padding queries give zeros."""
    batch, builder, window, padded = _step(case, PADS[pad])
    _check_geometry(builder, geometry)
    builder.build(batch.num_reqs, num_tokens_padded=padded)
    with_full = block_sparse_reference(batch, builder, num_tokens_padded=padded, scale=SCALE).float()
    builder.mark_full_blocks = False
    builder.build(batch.num_reqs, num_tokens_padded=padded)
    assert int(builder.full_kv_num_blocks[:-(-padded // builder.geometry.q_tile_tokens)].sum()) == 0
    without = block_sparse_reference(batch, builder, num_tokens_padded=padded, scale=SCALE).float()
    torch.testing.assert_close(with_full, dense_reference(batch, window=window, scale=SCALE).float(), atol=1e-5,
                               rtol=1e-5)
    torch.testing.assert_close(with_full, without, atol=1e-5, rtol=1e-5)
    assert (with_full[batch.num_tokens:] == 0).all()


def test_a_stale_index_inside_a_range_leaves_that_tile_without_full_blocks(geometry):
    """A block also listed at a stale logical index inside a tile's range (its page reused while still visible, which
    a scheduler never does) is read by the mask_mod at its live index: that tile gets no full blocks, the others
    theirs, and attention is unchanged."""
    batch, builder, _, padded = _step("prefix-cached-kbs32", 0, reuse=[(0, 1, 4)])  # row 0: entry 1 = entry 4
    builder.build(batch.num_reqs, num_tokens_padded=padded)
    assert int(builder.kernel_block_logical[int(batch.block_table[0, 1])]) == 4
    lists, wholly = block_lists(builder, padded), wholly_visible_blocks(builder, padded)
    # Row 0's queries (positions 100..144) fill tiles 0 and 1, whose ranges [0, 2] hold entry 1; tile 2 spans rows.
    assert wholly[:2].any() and not lists.full[:3].any()
    assert torch.equal(lists.full[3:], wholly[3:]) and lists.full[3:].any()
    assert not (lists.partial & lists.full).any()
    with_full = block_sparse_reference(batch, builder, num_tokens_padded=padded, scale=SCALE)
    builder.mark_full_blocks = False
    builder.build(batch.num_reqs, num_tokens_padded=padded)
    torch.testing.assert_close(with_full, block_sparse_reference(batch, builder, num_tokens_padded=padded,
                                                                 scale=SCALE), atol=1e-12, rtol=1e-12)


def test_build_with_full_blocks_allocates_nothing():
    """A warm build that marks full blocks allocates nothing larger than a wrapped Python scalar."""
    from torch.profiler import ProfilerActivity, profile

    batch, builder, _, padded = _step("chunk-continuing-a-request-bpk2", 7)
    builder.build(batch.num_reqs, num_tokens_padded=padded)
    assert int(builder.full_kv_num_blocks.sum()) > 0
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        builder.build(batch.num_reqs, num_tokens_padded=padded)
    assert max((e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0), default=0) <= 8


def test_one_builder_serves_steps_of_every_size():
    """Steps of 1, 3 and 2 query tiles through one builder (its per-size views reused) list what a brute-force
    scan finds, the persistent buffers unchanged."""
    first, builder, _, _ = _step("prompt-40-kbs16-tile16", 0, max_num_seqs=4, num_pages=40, width=8)
    before = {name: t.data_ptr() for name, t in builder.named_buffers().items()}
    for seed, (query_lens, seq_lens) in enumerate([([16], [40]), ([20, 20], [70, 20]), ([9, 1, 15], [9, 90, 30]),
                                                   ([40], [40])]):
        batch = make_paged_batch(query_lens=query_lens, seq_lens=seq_lens, kernel_block_size=16, max_num_seqs=4,
                                 num_pages=40, width=8, num_tokens_padded=48, seed=seed)
        for dst, src in ((first.block_table, batch.block_table), (first.query_start_loc, batch.query_start_loc),
                         (first.seq_lens, batch.seq_lens)):
            dst.copy_(src)
        padded = sum(query_lens)
        builder.build(len(query_lens), num_tokens_padded=padded)
        lists = block_lists(builder, padded)
        assert torch.equal(lists.full, wholly_visible_blocks(builder, padded))
        assert torch.equal(lists.partial | lists.full, _needed(builder, padded))
    assert {name: t.data_ptr() for name, t in builder.named_buffers().items()} == before


@pytest.mark.slow
def test_compiled_build_lists_what_the_eager_build_lists():
    """The build compiled whole (fullgraph, num_reqs a 0-d tensor) writes the same partial and full lists as eager."""
    import torch._dynamo

    torch._dynamo.reset()
    batch, builder, _, padded = _step("window-47-edge", 7)
    builder.build(batch.num_reqs, num_tokens_padded=padded)
    eager = block_lists(builder, padded)
    for t in (builder.kv_num_blocks, builder.kv_indices, builder.full_kv_num_blocks, builder.full_kv_indices):
        t.zero_()
    build = torch.compile(lambda n: builder.build(n, num_tokens_padded=padded).kv_num_blocks, fullgraph=True)
    build(torch.tensor(batch.num_reqs))
    compiled = block_lists(builder, padded)
    assert torch.equal(eager.partial, compiled.partial) and torch.equal(eager.full, compiled.full)
    assert eager.full.any()


@compiled_cpu_flex
@pytest.mark.slow
@pytest.mark.parametrize("case, pad", [("prefix-cached-kbs32", 7), ("window-47-edge", 7),
                                       ("chunk-continuing-a-request-bpk2", None), ("every-row-live", 7)])
def test_compiled_flex_with_full_blocks_matches_the_reference(case, pad):
    """Compiled CPU flex (which skips the mask_mod on full blocks) matches the dense reference and its own
    output without full blocks to 1e-5 in float32, padding queries zero."""
    import torch._dynamo

    torch._dynamo.reset()
    batch, builder, window, padded = _step(case, pad)
    attention = torch.compile(paged_flex_attention, fullgraph=True)
    out = attention(batch.query, batch.kv_cache, builder.build(batch.num_reqs, num_tokens_padded=padded), scale=SCALE)
    assert int(builder.full_kv_num_blocks.sum()) > 0
    builder.mark_full_blocks = False
    without = attention(batch.query, batch.kv_cache, builder.build(batch.num_reqs, num_tokens_padded=padded),
                        scale=SCALE)
    torch.testing.assert_close(out, dense_reference(batch, window=window, scale=SCALE).float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, without, atol=1e-5, rtol=1e-5)
    assert (out[batch.num_tokens:] == 0).all()
