"""KV write (Triton kernel and torch) on every device present: one kernel for every layout, through the pool's
views, pad slots skipped."""

from __future__ import annotations

import functools

import pytest
import torch
from runtime_plans import attention_plan, mla_plan

import graphkv.runtime.ops.choice as kernel_choice
from graphkv import CacheOrder, KVLayout, SpecError
from graphkv.runtime import allocate
from graphkv.runtime.ops.choice import write_kv
from graphkv.runtime.ops.reference import reshape_and_cache_ref

LAYOUTS = [("blocks_first", "NHD"), ("blocks_first", "HND"), ("kv_first", "NHD"), ("kv_first", "HND")]


def _random_slots(num_slots: int, num_tokens: int, seed: int) -> torch.Tensor:
    """Distinct slots spread over the whole cache ending with its last slot, every third one padding."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_slots - 1, generator=gen)[:num_tokens - 1]
    slots = torch.cat([perm, torch.tensor([num_slots - 1])])
    slots[:-1:3] = -1
    return slots


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bpk", [1, 17])
@pytest.mark.parametrize("order,stride", LAYOUTS)
def test_write_matches_reference_with_two_pages(order, stride, bpk, dtype, kernels, device):
    """With num_blocks == 2, writes land where the reference puts them for both layouts and NHD/HND."""
    pool = allocate(attention_plan(order=order, stride=stride, bpk=bpk, num_blocks=2, dtype=dtype), device)
    cache, layout = pool.kv_cache(0), pool.layout(0)
    kbs = pool.geometry["layers.0"].kernel_block_size
    cache.copy_(torch.randn(cache.shape))
    num_tokens = min(54, 2 * bpk * kbs)
    slots = _random_slots(2 * bpk * kbs, num_tokens, seed=bpk)
    key, value = torch.randn(num_tokens, 2, 8).to(cache.dtype), torch.randn(num_tokens, 2, 8).to(cache.dtype)
    want = cache.cpu().clone()
    reshape_and_cache_ref(key, value, want, slots, layout=layout)
    write_kv(key.to(device), value.to(device), cache, slots.to(device), layout=layout, kernels=kernels)
    assert torch.equal(cache.cpu(), want)


def test_strided_key_and_value_views_are_read_through_their_strides(kernels, device):
    """K/V given as non-contiguous slices of a fused qkv tensor are written correctly."""
    pool = allocate(attention_plan(order="kv_first", stride="HND", num_blocks=3, max_model_len=32), device)
    cache, layout = pool.kv_cache(0), pool.layout(0)
    qkv = torch.randn(7, 3, 2, 8)
    slots = torch.tensor([0, 17, 47, -1, 33, 5, 20])
    want = cache.cpu().clone()
    reshape_and_cache_ref(qkv[:, 1], qkv[:, 2], want, slots, layout=layout)
    qkv = qkv.to(device)
    key, value = qkv[:, 1], qkv[:, 2]
    assert not key.is_contiguous()
    write_kv(key, value, cache, slots.to(device), layout=layout, kernels=kernels)
    assert torch.equal(cache.cpu(), want)


def test_latent_cache_write(kernels, device):
    """An MLA latent cache (N, kbs, D) takes key [num_tokens, D] and no value."""
    pool = allocate(mla_plan(), device)
    cache, layout = pool.kv_cache(0), pool.layout(0)
    key = torch.randn(5, 16)
    slots = torch.tensor([3, -1, 16, 47, 20])
    want = cache.cpu().clone()
    reshape_and_cache_ref(key, None, want, slots, layout=layout)
    write_kv(key.to(device), None, cache, slots.to(device), layout=layout, kernels=kernels)
    assert torch.equal(cache.cpu(), want)


def test_pad_and_out_of_range_slots_write_nothing(kernels, device):
    """Slots of -1 and slots past the cache leave every pool byte unchanged."""
    pool = allocate(attention_plan(num_blocks=2), device)
    before = pool.slots[0].clone()
    slots = torch.tensor([-1, 2 * 16, 10_000, -5], device=device)
    ones = torch.ones(4, 2, 8, device=device)
    write_kv(ones, ones, pool.kv_cache(0), slots, layout=pool.layout(0), kernels=kernels)
    assert torch.equal(pool.slots[0], before)


def test_launcher_checks_shapes_dtypes_and_layout(kernels, device):
    """Wrong head shapes, dtypes, missing V or a state layout raise SpecError naming the argument."""
    pool = allocate(attention_plan(num_blocks=2), device)
    cache, layout = pool.kv_cache(0), pool.layout(0)
    slots = torch.zeros(3, dtype=torch.int64, device=device)
    write = functools.partial(write_kv, kernels=kernels)
    ones = functools.partial(torch.ones, device=device)
    with pytest.raises(SpecError, match="key"):
        write(ones(3, 4, 8), ones(3, 4, 8), cache, slots, layout=layout)
    with pytest.raises(SpecError, match="cast key"):
        write(ones(3, 2, 8, dtype=torch.float16), ones(3, 2, 8), cache, slots, layout=layout)
    with pytest.raises(SpecError, match="value"):
        write(ones(3, 2, 8), None, cache, slots, layout=layout)
    with pytest.raises(SpecError, match="slot_mapping"):
        write(ones(3, 2, 8), ones(3, 2, 8), cache, slots.int(), layout=layout)
    with pytest.raises(SpecError, match="state"):
        write(ones(3, 2, 8), ones(3, 2, 8), cache, slots, layout=KVLayout(order=CacheOrder.STATE))


def test_write_kv_auto_uses_torch_on_cpu(monkeypatch):
    """write_kv with kernels="auto" writes a CPU cache through the torch implementation, never Triton."""
    def no_triton(*args, **kwargs):
        raise AssertionError("auto picked Triton for a CPU cache")

    monkeypatch.setattr(kernel_choice, "triton_reshape_and_cache", no_triton)
    pool = allocate(attention_plan(order="kv_first", num_blocks=2))
    cache, layout = pool.kv_cache(0), pool.layout(0)
    key, value, slots = torch.randn(3, 2, 8), torch.randn(3, 2, 8), torch.tensor([4, -1, 31])
    want = cache.clone()
    reshape_and_cache_ref(key, value, want, slots, layout=layout)
    write_kv(key, value, cache, slots, layout=layout)
    assert torch.equal(cache, want)
