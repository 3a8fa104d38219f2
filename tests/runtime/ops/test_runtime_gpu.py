"""What only a real GPU can check: a compiled kernel replayed inside a CUDA graph.

The kernels' results against the references run on every device present through the ``device``
fixture (test_reshape_and_cache.py, test_paged_attention.py, tables/test_block_tables.py), CUDA
included, so this file keeps only the capture and replay.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runtime_plans import widths_plan

from graphkv.kernels.block_tables import gather_rows
from graphkv.runtime import BlockTables
from graphkv.runtime.ops.reference import gather_ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU to capture and replay a CUDA graph")


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
