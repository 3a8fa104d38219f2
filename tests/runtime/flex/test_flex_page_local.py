"""Flex attention over page-local kv-first caches: a hybrid pool whose attention pages share slots with Mamba states."""

from __future__ import annotations

import attrs
import pytest
import torch
from flex_reference import PagedBatch, dense_reference, needed_blocks

import graphkv
from graphkv import (Backend, CacheOrder, CudaGraphSupport, FullAttentionSpec, KVLayout, Limits, MambaSpec, ModelKV,
                     PlanError, SpecError, StrideOrder)
from graphkv.kernels.reshape_and_cache import reshape_and_cache
from graphkv.models.tiny_hybrid import TinyHybridConfig, model_kv
from graphkv.runtime import allocate
from graphkv.runtime.flex.attention import paged_flex_attention
from graphkv.runtime.flex.views import flex_kv_block_stride, paged_kv_views
from graphkv.runtime.flex.geometry import FlexMaskGeometry, plan_kv_block_stride
from graphkv.runtime.flex.mask import FlexMaskBuilder
from graphkv.runtime.pool.allocate import KVPool, page_local_slots
from graphkv.runtime.ops.reference import reshape_and_cache_ref
from torch_support import compiled_cpu_flex

SCALE = 0.25
QUERY_LENS = (1, 54, 30, 1)  # a one-token prefill, a prefill, a chunked prefill and a decode in one step
SEQ_LENS = (1, 54, 97, 97)
# Kernel blocks of 16 tokens only, so a 48-token page holds bpk = 3 of them.
FLEX_K16 = Backend(name="flex_k16", supported_kernel_block_sizes=(16,), cudagraph_support=CudaGraphSupport.ALWAYS,
                   kv_layout=KVLayout(order=CacheOrder.KV_FIRST, stride=StrideOrder.NHD), q_tile_tokens=64)


def _tiny_hybrid_plan(*, window: int | None = None, bpk: int = 1, num_blocks: int = 40) -> graphkv.Plan:
    """The tiny hybrid model ("MAMA": slot j holds Mamba layer 2j and attention layer 2j+1)."""
    model = model_kv(TinyHybridConfig(sliding_window=window))
    if bpk > 1:
        model = attrs.evolve(model, layers=tuple(d if d.spec.is_ssm else attrs.evolve(d, backend=FLEX_K16)
                                                 for d in model.layers))
    return graphkv.compile(model, Limits(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=128,
                                         block_size=16 * bpk, num_blocks_override=num_blocks), None)


def _attention_plan(*, page_size_padded: int | None = None) -> graphkv.Plan:
    """Two flex full-attention layers alone in the pool (16-token pages, 2 KV heads of 16)."""
    spec = FullAttentionSpec(num_kv_heads=2, head_size=16, dtype="float32", page_size_padded=page_size_padded)
    return graphkv.compile(ModelKV.from_specs("attn", [(spec, "flex")] * 2),
                           Limits(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=128,
                                  num_blocks_override=40), None)


def _flex_group(plan: graphkv.Plan) -> graphkv.GroupPlan:
    return next(g for g in plan.groups if not g.is_ssm)


@attrs.frozen(kw_only=True)
class _Step:
    """One filled step of a plan's pool: tables, step inputs and the pages each group owns."""

    pool: KVPool
    block_table: torch.Tensor  # [max_num_seqs, width] int32, kernel blocks of the flex group
    query_start_loc: torch.Tensor  # [max_num_seqs + 1] int32
    seq_lens: torch.Tensor  # [max_num_seqs] int32
    query: torch.Tensor  # [num_tokens_padded, Hq, D]
    attention_pages: tuple[int, ...]
    other_pages: tuple[int, ...]  # every page the flex group does not own (null, Mamba, free)

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[len(QUERY_LENS)])

    def batch(self, layer: str) -> PagedBatch:
        """The step as the shared reference's batch, over ``layer``'s pool view."""
        kbs = self.pool.kv_cache(layer).shape[2]
        return PagedBatch(query=self.query, kv_cache=self.pool.kv_cache(layer), block_table=self.block_table,
                          query_start_loc=self.query_start_loc, seq_lens=self.seq_lens, num_reqs=len(QUERY_LENS),
                          kernel_block_size=kbs)

    def builder(self, plan: graphkv.Plan) -> FlexMaskBuilder:
        return FlexMaskBuilder.from_plan(plan, _flex_group(plan).index, block_table=self.block_table,
                                         query_start_loc=self.query_start_loc, seq_lens=self.seq_lens)


def _page_bytes(pool: KVPool, pages) -> list[torch.Tensor]:
    """Copies of the raw bytes of ``pages`` in every slot, one ``[len(pages), P]`` tensor per slot."""
    return [slot.view(-1, p.page_size_bytes)[list(pages)].clone() for slot, p in zip(pool.slots, pool.plan.slots)]


def _fill_step(plan: graphkv.Plan, *, window: int | None = None, seed: int = 0, pad: int = 7,
               kernel: bool = True) -> _Step:
    """Random bytes everywhere, distinct Mamba states on Mamba pages, and every request's K/V written
    through the reshape_and_cache kernel (``kernel=False``: its reference, faster under the
    interpreter); out-of-window pages are then freed to the null page."""
    gen = torch.Generator().manual_seed(seed)
    pool = allocate(plan)
    for slot in pool.slots:
        slot.view(torch.float32).copy_(torch.randn(slot.numel() // 4, generator=gen))
    group = _flex_group(plan)
    page_tokens, bpk, kbs = group.block_size, group.bpk, group.kernel_block_size
    free = (torch.randperm(plan.num_blocks - 1, generator=gen) + 1).tolist()
    rows = [[free.pop() for _ in range(-(-n // page_tokens))] for n in SEQ_LENS]
    state_layers = [d.name for d in plan.layers if d.spec.is_ssm]
    mamba_pages = [free.pop() for _ in SEQ_LENS] if state_layers else []
    for name in state_layers:
        for state in pool.mamba_states(name):
            state[mamba_pages] = (100 * torch.randn(state[mamba_pages].shape, generator=gen)).to(state.dtype)

    seqs, width = plan.limits.max_num_seqs, group.block_table_width
    table = torch.randint(0, plan.num_blocks * bpk, (seqs, width), generator=gen, dtype=torch.int32)  # junk rows
    for r, pages in enumerate(rows):
        table[r].zero_()
        for i, p in enumerate(pages):
            table[r, i * bpk:(i + 1) * bpk] = torch.arange(p * bpk, (p + 1) * bpk, dtype=torch.int32)
    slots = torch.cat([table[r, torch.arange(n) // kbs].long() * kbs + torch.arange(n) % kbs
                       for r, n in enumerate(SEQ_LENS)])
    owned = [p for pages in rows for p in pages]
    others = tuple(p for p in range(plan.num_blocks) if p not in owned)
    others_before = _page_bytes(pool, others)
    for name in group.layer_names:
        cache = pool.kv_cache(name)
        k, v = torch.randn(2, slots.numel(), *cache.shape[-2:], generator=gen)
        (reshape_and_cache if kernel else reshape_and_cache_ref)(k, v, cache, slots, layout=pool.layout(name))
    assert all(torch.equal(a, b) for a, b in zip(others_before, _page_bytes(pool, others)))  # states untouched
    if window is not None:  # free kernel blocks no query of the row can see any more, as a scheduler would
        for r, (q, n) in enumerate(zip(QUERY_LENS, SEQ_LENS)):
            first_visible = max(n - q - window + 1, 0)
            table[r, :first_visible // kbs] = 0

    qsl = torch.randint(0, 50, (seqs + 1,), generator=gen, dtype=torch.int32)
    qsl[:len(QUERY_LENS) + 1] = torch.tensor([0, *torch.tensor(QUERY_LENS).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.randint(1, 50, (seqs,), generator=gen, dtype=torch.int32)
    lens[:len(SEQ_LENS)] = torch.tensor(SEQ_LENS, dtype=torch.int32)
    query = torch.randn(sum(QUERY_LENS) + pad, 2 * group.spec.num_kv_heads, group.spec.head_size, generator=gen)
    return _Step(pool=pool, block_table=table, query_start_loc=qsl, seq_lens=lens, query=query,
                 attention_pages=tuple(owned), other_pages=others)


CASES = {"full-bpk1": (None, 1), "window40-bpk1": (40, 1), "full-bpk3": (None, 3), "window40-bpk3": (40, 3)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hybrid_pool_flex_matches_dense_reference(case):
    """Mixed prefill + decode over page-local caches shared with Mamba states matches per-request SDPA."""
    window, bpk = CASES[case]
    plan = _tiny_hybrid_plan(window=window, bpk=bpk)
    assert _flex_group(plan).bpk == bpk
    step = _fill_step(plan, window=window)
    builder = step.builder(plan)
    assert builder.kv_block_stride == 2
    mask = builder.build(len(QUERY_LENS), num_tokens_padded=step.query.shape[0])
    for name in _flex_group(plan).layer_names:
        out = paged_flex_attention(step.query, step.pool.kv_cache(name), mask, scale=SCALE)
        torch.testing.assert_close(out.double(), dense_reference(step.batch(name), window=window, scale=SCALE),
                                   atol=2e-5, rtol=1e-4)
        assert (out[step.num_tokens:] == 0).all()


@pytest.mark.parametrize("case", ["full-bpk1", "window40-bpk3"])
def test_flex_never_reads_mamba_states(case):
    """Rewriting every page the flex group does not own (Mamba states, free and null pages) leaves the output equal."""
    window, bpk = CASES[case]
    plan = _tiny_hybrid_plan(window=window, bpk=bpk)
    step = _fill_step(plan, window=window, seed=1, kernel=False)
    mask = step.builder(plan).build(len(QUERY_LENS), num_tokens_padded=step.query.shape[0])
    names = _flex_group(plan).layer_names
    before = [paged_flex_attention(step.query, step.pool.kv_cache(n), mask, scale=SCALE) for n in names]
    kv_before = _page_bytes(step.pool, step.attention_pages)
    gen = torch.Generator().manual_seed(7)
    for name in (d.name for d in plan.layers if d.spec.is_ssm):
        for state in step.pool.mamba_states(name):
            idx = list(step.other_pages)
            state[idx] = (1e4 * torch.randn(state[idx].shape, generator=gen)).to(state.dtype)
    assert all(torch.equal(a, b) for a, b in zip(kv_before, _page_bytes(step.pool, step.attention_pages)))
    after = [paged_flex_attention(step.query, step.pool.kv_cache(n), mask, scale=SCALE) for n in names]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_kv_block_stride_is_one_split_and_two_page_local():
    """A pure-attention flex plan is split (r = 1); the tiny hybrid is page-local (r = 2); plan and views agree."""
    for plan, want in ((_attention_plan(), 1), (_tiny_hybrid_plan(), 2), (_tiny_hybrid_plan(bpk=3), 2)):
        pool, group = allocate(plan), _flex_group(plan)
        assert plan_kv_block_stride(plan, group.index) == want
        assert FlexMaskGeometry.from_plan(plan, group.index).kv_block_stride == want
        for name in group.layer_names:
            cache = pool.kv_cache(name)
            assert flex_kv_block_stride(cache) == want
            assert pool.geometry[name].page_local == (want != 1)


def test_page_local_views_address_the_pool_without_copies():
    """Kernel block b's K token t is flex key b*r*kbs + t of a view into the slot; V the same; the view ends at N."""
    plan = _tiny_hybrid_plan()
    pool = allocate(plan)
    cache = pool.kv_cache("layers.1")
    cache.copy_(torch.randn(cache.shape))
    k, v = paged_kv_views(cache)
    n, kbs = cache.shape[1], cache.shape[2]
    assert k.shape == v.shape == (1, 2, (2 * (n - 1) + 1) * kbs, 16)
    assert k.untyped_storage().data_ptr() == pool.slots[0].untyped_storage().data_ptr()
    for b, t in ((1, 0), (7, 5), (n - 1, kbs - 1)):
        assert torch.equal(k[0, :, b * 2 * kbs + t], cache[0, b, t]) and torch.equal(v[0, :, b * 2 * kbs + t],
                                                                                      cache[1, b, t])
    last = v[0, -1, -1, -1]  # the last element of the view is the last element of the slot
    assert last.data_ptr() + 4 == pool.slots[0].data_ptr() + pool.slots[0].numel()


def test_padded_pages_give_a_larger_stride_or_a_plan_error():
    """Padding by whole kernel-block halves gives r = 4 and correct attention; other padding is a PlanError."""
    plan = _attention_plan(page_size_padded=2 * 4096)  # real page 4096 bytes = 2 halves of 2048
    assert page_local_slots(plan) == (True, True)
    step = _fill_step(plan, seed=2, kernel=False)
    builder = step.builder(plan)
    assert builder.kv_block_stride == 4
    mask = builder.build(len(QUERY_LENS), num_tokens_padded=step.query.shape[0])
    out = paged_flex_attention(step.query, step.pool.kv_cache("layers.0"), mask, scale=SCALE)
    torch.testing.assert_close(out.double(), dense_reference(step.batch("layers.0"), scale=SCALE), atol=2e-5,
                               rtol=1e-4)
    odd = _attention_plan(page_size_padded=4096 + 64)
    with pytest.raises(PlanError, match=r"layers\.0\.kv_cache\.stride\(1\)=1040: .*= 512 elements"):
        FlexMaskGeometry.from_plan(odd, 0)


def test_block_lists_use_every_r_th_flex_block_and_equal_create_block_mask():
    """With r = 2 each tile lists flex blocks b*2 exactly where create_block_mask over the flat view finds keys."""
    plan = _tiny_hybrid_plan(window=40)
    step = _fill_step(plan, window=40, kernel=False)
    builder = step.builder(plan)
    padded = step.query.shape[0]
    builder.build(len(QUERY_LENS), num_tokens_padded=padded)
    g = builder.geometry
    want = needed_blocks(builder.mask_mod, num_tokens_padded=padded, kv_tokens=g.kv_tokens, q_tile=g.q_tile_tokens,
                         kernel_block_size=g.kernel_block_size, num_kernel_blocks=g.num_kv_blocks)
    listed = torch.zeros_like(want)
    for t in range(want.shape[0]):
        row = builder.kv_indices[t, :int(builder.kv_num_blocks[t])].long()
        assert (row % 2 == 0).all() and len(set(row.tolist())) == row.numel()
        listed[t, row] = True
    assert torch.equal(listed, want) and want.any()


def test_a_mask_for_another_stride_is_rejected():
    """A split-layout mask (r = 1) on a page-local cache is a SpecError naming both key lengths."""
    plan = _tiny_hybrid_plan()
    step = _fill_step(plan, kernel=False)
    group = _flex_group(plan)
    geometry = attrs.evolve(FlexMaskGeometry.from_plan(plan, group.index), kv_block_stride=1)
    builder = FlexMaskBuilder(geometry, block_table=step.block_table, query_start_loc=step.query_start_loc,
                              seq_lens=step.seq_lens)
    mask = builder.build(len(QUERY_LENS), num_tokens_padded=step.query.shape[0])
    n = plan.num_blocks
    with pytest.raises(SpecError, match=rf"block_mask=.*'kv_tokens': {n * 16}.*kv_tokens={(2 * n - 1) * 16} "
                                        rf".*kv_block_stride=2"):
        paged_flex_attention(step.query, step.pool.kv_cache(group.layer_names[0]), mask)
    with pytest.raises(SpecError, match=r"kv_block_stride=0: must be an int >= 1"):
        attrs.evolve(geometry, kv_block_stride=0)


def test_page_locality_is_one_decision_per_group():
    """Slot 3 holds only an unpadded flex layer (split on its own) but its group is page-local elsewhere: all local."""
    attn = FullAttentionSpec(num_kv_heads=2, head_size=16, dtype="float32")
    mamba = MambaSpec(shapes=((3, 64), (2, 8, 16)), dtypes=("float32", "float32"))
    model = ModelKV.from_specs("aaaammm", [(attn, "flex")] * 4 + [(mamba, "mamba")] * 3)
    plan = graphkv.compile(model, Limits(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=128,
                                         num_blocks_override=40), None)
    assert [s.layers for s in plan.slots] == [(0, 4), (1, 5), (2, 6), (3,)]
    assert plan.slots[3].page_size_bytes == plan.groups[0].real_page_size_bytes  # split if decided per slot
    assert page_local_slots(plan) == (True, True, True, True)
    pool = allocate(plan)
    assert all(pool.geometry[f"layers.{i}"].page_local for i in range(4))
    assert {flex_kv_block_stride(pool.kv_cache(i)) for i in range(4)} == {2}


def test_page_locality_stays_split_without_a_page_local_slot():
    """A flex group alone in the pool (two layers, two slots) stays split in both slots."""
    plan = _attention_plan()
    assert len(plan.slots) == 2 and page_local_slots(plan) == (False, False)


@compiled_cpu_flex
@pytest.mark.slow
def test_compiled_flex_over_a_hybrid_pool_reads_only_listed_blocks():
    """Compiled flex on the page-local hybrid pool matches SDPA, also after Mamba pages are filled with NaN."""
    import torch._dynamo

    torch._dynamo.reset()
    plan = _tiny_hybrid_plan()
    step = _fill_step(plan, seed=3, kernel=False)
    mask = step.builder(plan).build(torch.tensor(len(QUERY_LENS)), num_tokens_padded=step.query.shape[0])
    attention = torch.compile(paged_flex_attention, fullgraph=True)
    name = _flex_group(plan).layer_names[0]
    want = dense_reference(step.batch(name), scale=SCALE)
    torch.testing.assert_close(attention(step.query, step.pool.kv_cache(name), mask, scale=SCALE).double(), want,
                               atol=2e-5, rtol=1e-4)
    for state in step.pool.mamba_states("layers.0"):
        state[list(step.other_pages)] = float("nan")
    torch.testing.assert_close(attention(step.query, step.pool.kv_cache(name), mask, scale=SCALE).double(), want,
                               atol=2e-5, rtol=1e-4)
