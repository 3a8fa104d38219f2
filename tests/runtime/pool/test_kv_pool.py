"""KV pool: exact bytes, per-layer views through declared layouts, Mamba state views."""

from __future__ import annotations

import pytest
import torch
from runtime_plans import attention_plan, backend, hybrid_plan, mla_plan

import graphkv
from graphkv import Budget, FullAttentionSpec, Limits, MambaSpec, ModelKV, PlanError, SpecError
from graphkv.runtime import allocate

LAYOUTS = [("blocks_first", "NHD"), ("blocks_first", "HND"), ("kv_first", "NHD"), ("kv_first", "HND")]


def _changed_bytes(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    return torch.nonzero(before != after).flatten()


def test_pool_bytes_equal_plan_and_ledger():
    """Allocated bytes equal plan.pool_bytes, and pool bytes + unallocated remainder == budget."""
    attn = FullAttentionSpec(num_kv_heads=2, head_size=8, dtype="float32")
    mamba = MambaSpec(shapes=((3, 20), (2, 4, 8)), dtypes=("float32", "float16"))
    model = ModelKV.from_specs("h", [(attn, "flash_attn"), (mamba, "mamba"), (attn, "flash_attn")])
    budget = 1_000_003
    plan = graphkv.compile(model, Limits(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64),
                           Budget.kv_bytes(budget))
    pool = allocate(plan)
    assert pool.nbytes == plan.pool_bytes == sum(s.numel() for s in pool.slots)
    assert [s.numel() for s in pool.slots] == [plan.num_blocks * s.page_size_bytes for s in plan.slots]
    remainder = sum(e.nbytes for e in plan.ledger.kv_entries if e.name == "unallocated remainder")
    assert pool.nbytes + remainder == budget == plan.ledger.kv_total_bytes


@pytest.mark.parametrize("bpk", [1, 17])
@pytest.mark.parametrize("order,stride", LAYOUTS)
def test_logical_shape_follows_declared_layout(order, stride, bpk):
    """kv_cache has the backend's logical shape over num_blocks * bpk kernel blocks, in the spec dtype."""
    plan = attention_plan(order=order, stride=stride, bpk=bpk, num_blocks=2)
    pool = allocate(plan)
    cache = pool.kv_cache("layers.0")
    group = plan.groups[0]
    assert cache.shape == pool.layout(0).logical_shape(2 * bpk, group.kernel_block_size, 2, 8)
    assert cache.dtype == torch.float32 and cache.device == pool.device


@pytest.mark.parametrize("bpk", [1, 17])
@pytest.mark.parametrize("order,stride", LAYOUTS)
def test_views_are_one_to_one_with_pool_bytes(order, stride, bpk):
    """Writing arange through the view reads back unchanged and fills every pool byte (no overlap, no gap)."""
    pool = allocate(attention_plan(order=order, stride=stride, bpk=bpk, num_blocks=2))
    cache = pool.kv_cache(0)
    values = torch.arange(cache.numel(), dtype=torch.float32).view(cache.shape)
    cache.copy_(values)
    assert torch.equal(cache, values)
    assert sorted(pool.slots[0].view(torch.float32).tolist()) == list(range(cache.numel()))


@pytest.mark.parametrize("order,stride", LAYOUTS)
def test_num_blocks_two_block_dim_comes_from_declaration(order, stride):
    """With num_blocks == 2 both layouts have shape (2, 2, ...); kernel block 1 is found by the declared dim."""
    plan = attention_plan(order=order, stride=stride, num_blocks=2)
    pool = allocate(plan)
    cache, layout = pool.kv_cache(0), pool.layout(0)
    assert cache.shape == (2, 2, 16, 2, 8)
    cache.select(layout.block_dim, 1).fill_(1.0)
    assert torch.all(cache.select(layout.block_dim, 0) == 0)
    k_half = cache.select(1 - layout.block_dim, 0)  # K of both kernel blocks
    assert torch.all(k_half[1] == 1) and torch.all(k_half[0] == 0)


def test_hnd_pages_are_heads_tokens_dim_physically():
    """An HND kernel block stores K as (H, kbs, D) and the view shows it as (kbs, H, D)."""
    pool = allocate(attention_plan(order="blocks_first", stride="HND", num_blocks=2))
    cache = pool.kv_cache(0)
    cache.copy_(torch.randn(cache.shape))
    raw = pool.slots[0].view(torch.float32)[:2 * 16 * 8].view(2, 16, 8)
    assert torch.equal(raw, cache[0, 0].permute(1, 0, 2))


def test_kv_first_alone_is_split_so_k_flattens():
    """A pure kv-first pool keeps all K then all V, so K flattens to (N * kbs, H, D) for flex attention."""
    pool = allocate(attention_plan(order="kv_first", num_blocks=3, max_model_len=32))
    cache = pool.kv_cache(0)
    assert not pool.geometry["layers.0"].page_local
    assert cache[0].view(-1, 2, 8).shape == (3 * 16, 2, 8)


@pytest.mark.parametrize("stride", ["NHD", "HND"])
def test_kv_first_sharing_with_mamba_keeps_each_page_local(stride):
    """In a pool shared with Mamba, page b's K and V of a kv-first layer lie in bytes [b*P, (b+1)*P)."""
    plan = hybrid_plan(order="kv_first", stride=stride)
    pool = allocate(plan)
    cache, page = pool.kv_cache(0), plan.slots[0].page_size_bytes
    assert pool.geometry["layers.0"].page_local
    for b in range(plan.num_blocks):
        before = pool.slots[0].clone()
        cache[:, b].fill_(float(b + 1))
        changed = _changed_bytes(before, pool.slots[0])
        assert changed.numel() > 0 and changed.min() >= b * page and changed.max() < (b + 1) * page


def test_mla_latent_view():
    """An MLA layer views its pages as a latent (N, kbs, D) cache."""
    plan = mla_plan()
    cache = allocate(plan).kv_cache(0)
    assert cache.shape == (plan.num_blocks, 16, 16) and cache.dtype == torch.float32
    assert cache.stride() == (16 * 16, 16, 1)


def test_mamba_states_offsets_stride_and_padding():
    """Each state is (num_blocks, *shape) at its byte offset with page stride P; padding ends each page."""
    plan = hybrid_plan()
    pool = allocate(plan)
    conv, ssm = pool.mamba_states("layers.1")
    page = plan.slots[0].page_size_bytes
    assert conv.shape == (plan.num_blocks, 3, 20) and conv.dtype == torch.float32
    assert ssm.shape == (plan.num_blocks, 2, 4, 8) and ssm.dtype == torch.float16
    assert conv.stride(0) * 4 == page and ssm.stride(0) * 2 == page
    assert conv.storage_offset() == 0 and ssm.storage_offset() * 2 == 3 * 20 * 4
    before = pool.slots[0].clone()
    conv[2].fill_(1.0)
    ssm[2].fill_(1.0)
    changed = _changed_bytes(before, pool.slots[0])
    assert changed.min() >= 2 * page and changed.max() < 2 * page + 240 + 128  # padding untouched


def test_views_are_persistent():
    """kv_cache / mamba_states return the same tensors every call, by name or index."""
    pool = allocate(hybrid_plan())
    assert pool.kv_cache("layers.0") is pool.kv_cache(0)
    assert pool.mamba_states(1)[0] is pool.mamba_states("layers.1")[0]


def test_wrong_layer_kind_or_name_is_an_error():
    """Asking for the wrong kind of view or an unknown layer raises SpecError naming the fix."""
    pool = allocate(hybrid_plan())
    with pytest.raises(SpecError, match="mamba_states"):
        pool.kv_cache("layers.1")
    with pytest.raises(SpecError, match="kv_cache"):
        pool.mamba_states(0)
    with pytest.raises(SpecError, match="not a KV layer"):
        pool.kv_cache("layers.9")
    with pytest.raises(SpecError, match="graphkv.compile"):
        allocate("plan")


def test_different_value_head_size_is_a_plan_error():
    """A (.., 2, kbs, H, D) layout cannot hold head_size_v != head_size: PlanError names both."""
    spec = FullAttentionSpec(num_kv_heads=1, head_size=8, head_size_v=16, dtype="float32")
    model = ModelKV.from_specs("v", [(spec, backend())])
    plan = graphkv.compile(model, Limits(max_model_len=16, max_num_seqs=1, max_num_batched_tokens=16,
                                         num_blocks_override=2), None)
    with pytest.raises(PlanError, match="head_size_v"):
        allocate(plan)


def test_misaligned_state_offset_is_a_plan_error():
    """A float32 state after an odd number of float16 elements cannot be viewed: PlanError says how to fix it."""
    attn = FullAttentionSpec(num_kv_heads=1, head_size=8, dtype="float32")
    mamba = MambaSpec(shapes=((3,), (2,)), dtypes=("float16", "float32"))
    model = ModelKV.from_specs("m", [(attn, backend()), (mamba, "mamba")])
    plan = graphkv.compile(model, Limits(max_model_len="auto", max_num_seqs=1, max_num_batched_tokens=16,
                                         num_blocks_override=3), None)
    with pytest.raises(PlanError, match=r"state\[1\] byte offset.*wider dtypes come first"):
        allocate(plan)
