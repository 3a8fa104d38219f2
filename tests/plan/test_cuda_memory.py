"""The ledger states what torch.cuda.memory_allocated and memory_reserved will show: each CUDA device buffer
charged by the caching allocator, beside the tensors' exact bytes."""

from __future__ import annotations

import json

import pytest
from runtime_plans import widths_plan

from graphkv import Budget, Limits, compile_plan
from graphkv.models.demo import DemoOptions, demo_plan
from graphkv.plan.allocations import AllocatorBytes, AllocatorPool, Placement
from graphkv.plan.allocations.rounding import MIB, rounded_bytes
from graphkv.presets import preset_model

H100_LLAMA_BUDGET = 21_116_223_488  # llama-3.1-8b's KV budget in `graphkv bench memory` on an H100, 2026-11-25


def test_demo_static_buffers_are_38_blocks_of_512_b_in_one_small_segment():
    """Demo: 38 buffers of 39,176 B are charged 49,152 B (each rounded to 512 B) in one new 2 MiB segment, as the
    pool's two 1 MiB slots fill theirs exactly. The H100 run of 2026-11-25 measured this rule at 43,520 B for the
    31 buffers of 35,680 B the demo had then; full-block marking (issue 20) added 7 flex buffers (+1,456 B,
    charged 6 x 512 + 1,024) and widened full_kv_indices from 8 B to 2,048 B (charged 512 -> 2,048)."""
    plan = demo_plan(DemoOptions())
    memory = plan.ledger.cuda_memory()
    assert memory.pool == AllocatorBytes(num_allocations=2, tensor_bytes=2 * MIB, allocated_bytes=2 * MIB,
                                         reserved_bytes=2 * MIB)
    assert memory.static_buffers == AllocatorBytes(num_allocations=38, tensor_bytes=39_176, allocated_bytes=49_152,
                                                   reserved_bytes=2 * MIB)
    device = [a for a in plan.ledger.allocations("cuda") if a.placement is Placement.DEVICE]
    assert memory.static_buffers.allocated_bytes == sum(rounded_bytes(a.nbytes) for a in device
                                                        if not a.name.startswith("kv_pool."))
    assert memory.charge("kv_pool.slot1").reserved_bytes == 0  # the second slot fills the first one's segment
    assert memory.charge("tables.group_widths").allocated_bytes == 512  # 8 B of tensor


def test_llama_on_the_h100_budget_is_charged_what_the_h100_measured():
    """llama-3.1-8b, 10069 pages: 32 slots of 659,881,984 B each take a whole 315 x 2 MiB segment (704 KiB would
    remain, under 1 MiB: not split), 21,139,292,160 B as measured; static buffers 17,151,488 B as measured."""
    plan = compile_plan(preset_model("llama-3.1-8b"), Limits(), Budget.kv_bytes(H100_LLAMA_BUDGET))
    assert plan.num_blocks == 10069 and plan.pool_bytes == H100_LLAMA_BUDGET
    memory = plan.ledger.cuda_memory()
    slot = memory.charge("kv_pool.slot0")
    assert (slot.nbytes, slot.allocated_bytes, slot.reserved_bytes, slot.split) == (659_881_984, 315 * 2 * MIB,
                                                                                     315 * 2 * MIB, False)
    assert memory.pool.allocated_bytes == memory.pool.reserved_bytes == 21_139_292_160
    assert memory.pool.rounding_bytes == 32 * 720_896
    # tables.device (16 MiB) gets a segment of its own; the seven small ones share one 2 MiB segment.
    assert memory.static_buffers == AllocatorBytes(num_allocations=8, tensor_bytes=17_149_972,
                                                   allocated_bytes=17_151_488, reserved_bytes=18 * MIB)
    assert memory.charge("tables.device").pool is AllocatorPool.LARGE


def test_static_buffers_fill_what_the_pool_segment_left():
    """Three groups: a 128 KiB pool slot opens a 2 MiB small segment and the step's 8 buffers fit in its rest."""
    memory = widths_plan().ledger.cuda_memory()
    assert memory.pool == AllocatorBytes(num_allocations=1, tensor_bytes=131_072, allocated_bytes=131_072,
                                         reserved_bytes=2 * MIB)
    assert memory.static_buffers == AllocatorBytes(num_allocations=8, tensor_bytes=3_516, allocated_bytes=6_656,
                                                   reserved_bytes=0)
    assert (memory.allocated_bytes, memory.reserved_bytes) == (137_728, 2 * MIB)


@pytest.mark.parametrize("plan", [demo_plan(DemoOptions()), widths_plan()], ids=["demo", "three-groups"])
def test_tensor_bytes_are_the_runtime_bytes_on_the_device(plan):
    """The charge sits beside the exact bytes: pool + static tensor bytes == runtime_bytes('cuda').device_bytes."""
    memory = plan.ledger.cuda_memory()
    assert memory.pool.tensor_bytes == plan.pool_bytes
    device_bytes = plan.ledger.runtime_bytes("cuda").device_bytes
    assert memory.pool.tensor_bytes + memory.static_buffers.tensor_bytes == device_bytes
    assert memory.names[:len(plan.slots)] == tuple(f"kv_pool.slot{s.index}" for s in plan.slots)
    with pytest.raises(KeyError, match="^CUDA device allocation='staging.int64_host': is not one of the ledger's: "
                                       "kv_pool.slot0, "):
        memory.charge("staging.int64_host")  # pinned host memory: not the CUDA caching allocator's


@pytest.mark.parametrize("plan", [demo_plan(DemoOptions()), widths_plan(),
                                  compile_plan(preset_model("llama-3.1-8b"), Limits(),
                                               Budget.kv_bytes(H100_LLAMA_BUDGET))],
                         ids=["demo", "three-groups", "llama-h100"])
def test_the_ledgers_allocator_rounding_is_reserved_minus_tensor_bytes(plan):
    """The ledger's "allocator rounding" entry is what cuda_memory() reserves beyond the pool's and the static
    buffers' tensors (three groups: the buffers fill the pool's small segment, so their part is negative)."""
    memory = plan.ledger.cuda_memory()
    entry = next(e for e in plan.ledger.other_entries if e.name == "allocator rounding")
    pool = memory.pool.reserved_bytes - memory.pool.tensor_bytes
    static = memory.static_buffers.reserved_bytes - memory.static_buffers.tensor_bytes
    assert entry.nbytes == pool + static == memory.reserved_bytes - plan.ledger.runtime_bytes("cuda").device_bytes
    assert f"pool {pool:+d} B ({memory.pool.num_allocations} slot(s)), static buffers {static:+d} B" in entry.reason
    assert entry.on_device and not entry.in_kv_budget


def test_plan_json_carries_the_charge_per_phase():
    """--json: ledger.runtime.cuda.caching_allocator has the pool's and the static buffers' bytes; the CPU none."""
    data = json.loads(json.dumps(demo_plan(DemoOptions()).to_dict()))
    runtime = data["ledger"]["runtime"]
    assert runtime["cuda"]["caching_allocator"] == {
        "pool": {"tensor_bytes": 2 * MIB, "allocated_bytes": 2 * MIB, "reserved_bytes": 2 * MIB},
        "static_buffers": {"tensor_bytes": 39_176, "allocated_bytes": 49_152, "reserved_bytes": 2 * MIB}}
    assert "caching_allocator" not in runtime["cpu"]
