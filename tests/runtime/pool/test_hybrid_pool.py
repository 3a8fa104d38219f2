"""Hybrid pool on every device present: attention writes never touch Mamba state bytes and Mamba writes never
touch KV bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runtime_plans import hybrid_plan

from graphkv.runtime import BlockTables, allocate
from graphkv.runtime.ops.choice import write_kv
from graphkv.runtime.ops.reference import reshape_and_cache_ref
from graphkv.runtime.tables.slots import host_slot_mappings

ATTN_PAGES = {"layers.0": [1, 2], "layers.2": [3]}  # full attention, sliding window (blocks-first HND)
MAMBA_PAGES = [4, 5]


def _page_ranges(page_bytes: int, pages) -> list[tuple[int, int]]:
    return [(p * page_bytes, (p + 1) * page_bytes) for p in pages]


def _bytes(slot: torch.Tensor, ranges) -> list[torch.Tensor]:
    return [slot[a:b].clone() for a, b in ranges]


@pytest.mark.parametrize("order,stride", [("kv_first", "NHD"), ("kv_first", "HND"), ("blocks_first", "NHD"),
                                          ("blocks_first", "HND")])
def test_attention_and_mamba_layers_never_corrupt_each_other(order, stride, kernels, device):
    """Fill KV pages and Mamba states through the views, write both ways, and check the other side's bytes."""
    plan = hybrid_plan(order=order, stride=stride, sliding_window=20)
    pool = allocate(plan, device)
    page = plan.slots[0].page_size_bytes
    assert len(plan.slots) == 1 and set(plan.slots[0].layers) == {0, 1, 2}  # all three share one slot
    slot = pool.slots[0]
    gen = torch.Generator().manual_seed(0)
    for name, pages in ATTN_PAGES.items():
        cache, dim = pool.kv_cache(name), pool.layout(name).block_dim
        for p in pages:
            cache.select(dim, p).copy_(torch.randn(cache.select(dim, p).shape, generator=gen))
    for state in pool.mamba_states("layers.1"):
        state[MAMBA_PAGES] = torch.randn(state[MAMBA_PAGES].shape, generator=gen).to(device, state.dtype)
    mamba_ranges = _page_ranges(page, MAMBA_PAGES)
    attn_ranges = _page_ranges(page, [p for pages in ATTN_PAGES.values() for p in pages])
    mamba_before = _bytes(slot, mamba_ranges)

    # Attention writes through the block tables, the host slot mapping and the KV write kernel.
    tables = BlockTables(plan, device, kernels=kernels)
    tables.append(0, [ATTN_PAGES["layers.0"][:1], [MAMBA_PAGES[0]], ATTN_PAGES["layers.2"]])
    tables.append(1, [ATTN_PAGES["layers.0"][1:], [MAMBA_PAGES[1]], ATTN_PAGES["layers.2"]])
    tables.sync(np.array([0, 1]), 2)
    out = np.full((len(plan.groups), 32), -1, dtype=np.int64)
    host_slot_mappings(tables, np.repeat([0, 1], 16), np.tile(np.arange(16), 2), out)
    slots = torch.from_numpy(out)
    attn_before = _bytes(slot, attn_ranges)
    want = allocate(plan)  # the same writes through the reference, into a CPU copy of the pool
    want.slots[0].copy_(slot)
    for name in ATTN_PAGES:
        group = plan.group_of(pool.layer(name).index).index
        kv = torch.randn(2, 32, 2, 8, generator=gen)
        on_device = kv.to(device)
        write_kv(on_device[0], on_device[1], pool.kv_cache(name), slots[group].to(device), layout=pool.layout(name),
                 kernels=kernels)
        reshape_and_cache_ref(kv[0], kv[1], want.kv_cache(name), slots[group], layout=want.layout(name))
    assert torch.equal(slot.cpu(), want.slots[0])
    assert all(torch.equal(a, b) for a, b in zip(mamba_before, _bytes(slot, mamba_ranges)))
    assert not all(torch.equal(a, b) for a, b in zip(attn_before, _bytes(slot, attn_ranges)))
    assert tables.state_pages(1, np.array([0, 1])).tolist() == MAMBA_PAGES
    assert [t[0] for t in tables.input_tables[1][:2].tolist()] == MAMBA_PAGES

    # Mamba writes: every state of their pages.
    attn_before = _bytes(slot, attn_ranges)
    for state in pool.mamba_states("layers.1"):
        state[MAMBA_PAGES] = torch.full_like(state[MAMBA_PAGES], -3.0)
    assert all(torch.equal(a, b) for a, b in zip(attn_before, _bytes(slot, attn_ranges)))
    assert not all(torch.equal(a, b) for a, b in zip(mamba_before, _bytes(slot, mamba_ranges)))


def test_every_attention_page_stays_inside_its_bytes_in_a_hybrid_pool():
    """Each layer's page b (all its kernel blocks, K and V) maps into bytes [b*P, (b+1)*P) of the shared slot."""
    plan = hybrid_plan(order="kv_first", stride="HND", sliding_window=20)
    pool = allocate(plan)
    page = plan.slots[0].page_size_bytes
    for name in ("layers.0", "layers.2"):
        cache, dim = pool.kv_cache(name), pool.layout(name).block_dim
        for b in range(plan.num_blocks):
            pool.slots[0].zero_()
            before = pool.slots[0].clone()
            cache.select(dim, b).fill_(7.0)
            changed = torch.nonzero(before != pool.slots[0]).flatten()
            assert changed.min() >= b * page and changed.max() < (b + 1) * page
