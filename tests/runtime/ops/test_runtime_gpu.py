"""The runtime kernels compiled on a real GPU: results vs the references, and replay inside a CUDA graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runtime_plans import attention_plan, widths_plan

from graphkv.kernels.paged_attention import paged_decode_attention
from graphkv.kernels.reshape_and_cache import reshape_and_cache
from graphkv.runtime import BlockTables, allocate
from graphkv.kernels.block_tables import gather_rows
from graphkv.runtime.ops.reference import gather_ref, paged_decode_attention_ref, reshape_and_cache_ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (CPU runs check the same kernels under TRITON_INTERPRET)")


@pytest.mark.parametrize("order,stride", [("blocks_first", "NHD"), ("kv_first", "HND")])
@pytest.mark.parametrize("bpk", [1, 17])
def test_write_and_decode_match_reference_on_gpu(order, stride, bpk):
    """Compiled KV write and paged decode attention match the references for lengths 1, 54, 97, 232."""
    pool = allocate(attention_plan(order=order, stride=stride, bpk=bpk, num_blocks=3 if bpk == 17 else 64,
                                   head_size=16, max_model_len=256, dtype="bfloat16"), device="cuda")
    cache, layout = pool.kv_cache(0), pool.layout(0)
    cache.copy_(torch.randn(cache.shape, device="cuda"))
    kbs = cache.shape[2]
    slots = torch.randperm(cache.shape[layout.block_dim] * kbs, device="cuda")[:64]
    slots[::5] = -1
    kv = torch.randn(2, 64, 2, 16, device="cuda", dtype=torch.bfloat16)
    want = cache.cpu().clone()
    reshape_and_cache_ref(kv[0].cpu(), kv[1].cpu(), want, slots.cpu(), layout=layout)
    reshape_and_cache(kv[0], kv[1], cache, slots, layout=layout)
    assert torch.equal(cache.cpu(), want)
    seq_lens = torch.tensor([1, 54, 97, 232], dtype=torch.int32, device="cuda")
    width = -(-232 // kbs)
    table = torch.randperm(cache.shape[layout.block_dim], device="cuda")[:4 * width].view(4, width).int()
    query = torch.randn(4, 8, 16, device="cuda", dtype=torch.bfloat16)
    out = paged_decode_attention(query, cache, table, seq_lens, layout=layout, sliding_window=100)
    ref = paged_decode_attention_ref(query.cpu(), cache.cpu(), table.cpu(), seq_lens.cpu(), layout=layout,
                                     sliding_window=100)
    torch.testing.assert_close(out.cpu().double(), ref, atol=2e-2, rtol=2e-2)


def test_page_writes_and_gather_on_gpu_and_gather_replays_in_a_cuda_graph():
    """Committed page entries match the host mirror; a captured gather replays correctly after the tables change."""
    plan = widths_plan()
    tables = BlockTables(plan, device="cuda")
    tables.append(0, [[1], [2], [3]])
    tables.append(1, [[4, 5], [6], [7]])
    tables.sync(np.array([1, 0]), 3)
    torch.cuda.synchronize()
    assert tables.input_tables[0][:2, :4].cpu().tolist() == [[8, 9, 10, 11], [2, 3, 0, 0]]
    idx = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up (compiles) outside the capture
        gather_rows(tables._sync.persistent, tables._sync.inputs, idx, 3)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gather_rows(tables._sync.persistent, tables._sync.inputs, idx, 3)
    for step, mapping in enumerate(([1, 0], [0, 1])):
        tables.append(step, [[10 + step], None, None])
        tables.commit()
        idx.copy_(torch.tensor(mapping, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want = gather_ref([t.cpu() for t in tables.tables], torch.tensor(mapping, dtype=torch.int32), 3)
        assert all(torch.equal(t[:3].cpu(), w) for t, w in zip(tables.input_tables, want))
