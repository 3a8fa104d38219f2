"""The plan's ledger equals what the runtime allocates, to the byte, counted independently of the ledger."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runtime_plans import widths_plan

import graphkv
from graphkv import Backend, CacheOrder, CudaGraphSupport, FullAttentionSpec, KVLayout, Limits, ModelKV, StrideOrder
from graphkv.memory.storages import live_storages
from graphkv.models.demo import DemoOptions, demo_plan
from graphkv.plan.allocations import Placement
from graphkv.presets import preset_model
from graphkv.runtime import BlockTables, Step, allocate


def _llama(backend: str) -> graphkv.Plan:
    """llama-3.1-8b at 1 GiB with the default limits (256 sequences, 8192 tokens, max_model_len auto)."""
    return graphkv.compile(preset_model("llama-3.1-8b", attention_backend=backend), Limits(),
                           graphkv.Budget.kv_bytes("1GiB"))


def _bpk17() -> graphkv.Plan:
    """One attention group of 17 kernel blocks of 16 tokens per page."""
    backend = Backend(name="k16", supported_kernel_block_sizes=(16,), cudagraph_support=CudaGraphSupport.ALWAYS,
                      kv_layout=KVLayout(order=CacheOrder.KV_FIRST, stride=StrideOrder.NHD))
    spec = FullAttentionSpec(num_kv_heads=1, head_size=8, dtype="float32")
    return graphkv.compile(ModelKV.from_specs("bpk17", [(spec, backend)]),
                           Limits(max_model_len=4 * 272, max_num_seqs=4, max_num_batched_tokens=64, block_size=272,
                                  num_blocks_override=20), None)


PLANS = {"demo": lambda: demo_plan(DemoOptions()), "llama-flash_attn": lambda: _llama("flash_attn"),
         "llama-flex": lambda: _llama("flex"), "bpk17": _bpk17, "three-groups": widths_plan}


@pytest.mark.parametrize("name", list(PLANS))
def test_runtime_bytes_cpu_equal_the_live_storages(name):
    """allocate + Step on a CPU hold exactly ledger.runtime_bytes('cpu'): torch tensors = device, numpy = host."""
    plan = PLANS[name]()
    pool, step = allocate(plan, "cpu"), Step(plan, "cpu")
    counted = live_storages(pool, step)
    want = plan.ledger.runtime_bytes("cpu")
    assert counted.runtime_bytes("cpu") == want
    assert counted.cuda_bytes == counted.pinned_bytes == 0
    assert live_storages(pool).cpu_tensor_bytes == plan.pool_bytes  # the KV pool alone, exactly the plan's


def test_llama_numbers_are_what_the_ledger_says():
    """llama-3.1-8b at 1 GiB, flash_attn: 512 pages of 128 KiB, two 256 x 511 tables, and the step's metadata."""
    plan = _llama("flash_attn")
    assert (plan.num_blocks, plan.groups[0].block_table_width, plan.pool_bytes) == (512, 511, 2**30)
    cpu = {a.name: a for a in plan.ledger.allocations("cpu")}
    # One kernel block per page: the mirror is the persistent half of one [2, 256 x 511] int32 buffer.
    assert cpu["tables.device"].nbytes == 2 * 256 * 511 * 4 and "tables.mirror" not in cpu
    assert cpu["staging.int64"].shape == (2 * 256 + 4 * 8192,)  # query/context lens, positions, rows, offsets, slots
    assert cpu["ownership.holders"].shape == (512,) and cpu["ownership.writer_row"].dtype.value == "int32"
    assert plan.ledger.runtime_bytes("cpu").device_bytes == 2**30 + 1381400
    cuda = {a.name: a for a in plan.ledger.allocations("cuda")}
    # A GPU adds the host mirror (third copy: device persistent rows + step rows + host), pinned twins, staging.
    assert cuda["tables.mirror"].placement is Placement.HOST and cuda["tables.device"].nbytes == 2 * 256 * 511 * 4
    assert cuda["staging.int64_host"].placement is Placement.PINNED
    assert cuda["tables.staged"].shape == (3 * 2 * (256 + 8192 // 16),)


def test_a_cpu_with_several_kernel_blocks_per_page_keeps_two_copies_of_the_tables():
    """bpk 17 on a CPU: the mirror in pages and the step's rows in kernel blocks, no persistent kernel-block copy."""
    plan = _bpk17()
    cpu = {a.name: a for a in plan.ledger.allocations("cpu")}
    assert cpu["tables.mirror"].shape == (4 * 4,) and cpu["tables.step_rows"].shape == (4 * 4 * 17,)
    assert "tables.device" not in cpu
    tables = BlockTables(plan, "cpu")
    tables.append(1, [[7, 3]])
    tables.commit()
    assert tables.tables[0][1, :34].tolist() == list(range(7 * 17, 8 * 17)) + list(range(3 * 17, 4 * 17))


def test_staged_block_tables_allocate_the_cuda_layout():
    """The GPU path's tables (run here in Triton's interpreter) allocate the ledger's 'cuda' tables.* entries."""
    plan = _bpk17()
    tables = BlockTables(plan, "cpu", kernels="triton")
    entries = [a for a in plan.ledger.allocations("cuda") if a.name.startswith("tables.")]
    counted = live_storages(tables)
    assert counted.cpu_tensor_bytes == sum(a.nbytes for a in entries if a.placement is not Placement.HOST)
    assert counted.numpy_bytes == sum(a.nbytes for a in entries if a.placement is Placement.HOST)


def test_a_commit_larger_than_the_staging_buffer_takes_several_launches(monkeypatch):
    """More stale page entries than tables.staged holds are written in chunks, all of them correct."""
    import graphkv.runtime.tables.staged_sync as staged_module

    plan = _bpk17()
    tables = BlockTables(plan, "cpu", kernels="triton")
    capacity = tables._sync._capacity
    assert capacity == 2 * (4 + 64 // 272 + 1)  # 2 x (max_num_seqs + cdiv(64 tokens, 272)) = 10
    calls = []
    real = staged_module.write_pages
    monkeypatch.setattr(staged_module, "write_pages", lambda flat, staged, n, bpk: calls.append(n) or
                        real(flat, staged, n, bpk))
    for row in range(4):
        tables.append(row, [[4 * row + 1, 4 * row + 2, 4 * row + 3, 4 * row + 4]])
    tables.commit()  # 16 page entries
    assert calls == [10, 6]
    for row in range(4):
        want = np.concatenate([np.arange(p * 17, (p + 1) * 17) for p in range(4 * row + 1, 4 * row + 5)])
        assert tables.tables[0][row].tolist() == want.tolist()


def test_the_ledger_refuses_an_unknown_device_kind():
    """runtime_bytes('gpu') names the field and the two kinds it knows."""
    with pytest.raises(graphkv.SpecError, match=r"device='gpu': must be a device kind the runtime runs on: 'cuda' or "
                                                 r"'cpu'; pass 'cuda'"):
        _bpk17().ledger.runtime_bytes("gpu")


def test_flex_builders_allocate_the_plans_flex_entries():
    """A flex group's builder holds exactly the plan's flex.{g}.* bytes (its masks, workspace and constants)."""
    plan = _llama("flex")
    step = Step(plan, "cpu")
    (builder,) = step.mask_builders.values()
    entries = [a for a in plan.ledger.allocations("cpu") if a.name.startswith("flex.0.")]
    named = builder.named_buffers()
    bound = live_storages(builder.block_table, builder.query_start_loc, builder.seq_lens)  # the step's, not its own
    assert live_storages(builder).cpu_tensor_bytes - bound.cpu_tensor_bytes == sum(a.nbytes for a in entries)
    # The per-entry workspace dominates: 18 B per table entry (256 x 511), then the tile counts (66 x 512).
    by_name = {a.name: a.nbytes for a in entries}
    assert by_name["flex.0.entry_index"] == 256 * 511 * 8 and by_name["flex.0.tile_counts"] == 66 * 512 * 4
    assert torch.equal(named["kv_indices"], torch.zeros_like(named["kv_indices"]))
