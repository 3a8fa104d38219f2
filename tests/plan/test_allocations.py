"""The planner lists every runtime allocation per device kind: shapes, dtypes, placements, views."""

from __future__ import annotations

import json
import re

import pytest

from runtime_plans import widths_plan

from graphkv.plan.allocations import Placement


def test_cpu_and_cuda_layouts_of_a_three_group_plan():
    """Widths 16, 8, 1: the CPU keeps the step's rows (100 entries) and the mirror (52 pages); CUDA both packings."""
    plan = widths_plan()
    cpu = {a.name: a for a in plan.ledger.allocations("cpu")}
    cuda = {a.name: a for a in plan.ledger.allocations("cuda")}
    assert cpu["tables.step_rows"].shape == (4 * (16 + 8 + 1),) and cpu["tables.mirror"].shape == (4 * (8 + 4 + 1),)
    assert cuda["tables.device"].shape == (2 * 100,) and cuda["tables.device"].part("step_rows").offset == 100
    assert cuda["tables.staged"].shape == (3 * 2 * 3 * (4 + 1),)  # 2 x per group (4 rows + cdiv(32, 32)) entries
    # Metadata: 3 x 4 + 2 int32; (2 + 1 Mamba group) x 4 + (3 + 3 groups) x 32 int64, with named views.
    assert cpu["staging.int32"].shape == (14,) and cpu["staging.int64"].shape == (204,)
    assert cpu["staging.int64"].part("state_pages.2").offset == 8
    assert cpu["staging.int64"].part("slot_mappings").shape == (3, 32)
    assert {a.placement for a in cpu.values()} == {Placement.DEVICE, Placement.HOST}  # nothing pinned on a CPU
    assert cuda["staging.int64_host"].placement is Placement.PINNED and "staging.int64_host" not in cpu
    assert sum(a.nbytes for a in cuda.values() if a.placement is Placement.PINNED) == 90 * 8 + 4 * 4 + 14 * 4 + \
        204 * 8 + 32 * 8


def test_runtime_bytes_add_up_the_placements():
    """device_bytes: the pool and the DEVICE entries; host_bytes: pinned and host entries."""
    plan = widths_plan()
    for kind in ("cpu", "cuda"):
        entries = plan.ledger.allocations(kind)
        got = plan.ledger.runtime_bytes(kind)
        assert got.device_bytes == sum(a.nbytes for a in entries if a.placement is Placement.DEVICE)
        assert got.total_bytes == sum(a.nbytes for a in entries)
        assert entries[0].name == "kv_pool.slot0" and entries[0].nbytes == plan.pool_bytes == 64 * 2048
    assert plan.ledger.runtime_bytes("cpu") != plan.ledger.runtime_bytes("cuda:0")
    assert plan.ledger.runtime_bytes("cuda") == plan.ledger.runtime_bytes("cuda:0")


def test_ownership_is_int32_per_page_and_the_same_on_every_device():
    """26 B per pool page (holders, writer row / column, filled, filled_at, stamp int32; group int16)."""
    plan = widths_plan()
    for kind in ("cpu", "cuda"):
        per_page = [a for a in plan.ledger.allocations(kind) if a.name.startswith("ownership.") and a.shape == (64,)]
        assert sum(a.nbytes for a in per_page) == 64 * 26


def test_plan_json_lists_the_allocations_and_their_sums():
    """--json carries ledger.runtime per kind: device and host bytes and every allocation."""
    plan = widths_plan()
    data = json.loads(json.dumps(plan.to_dict()))
    runtime = data["ledger"]["runtime"]
    assert runtime["cpu"]["device_bytes"] == plan.ledger.runtime_bytes("cpu").device_bytes
    first = runtime["cuda"]["allocations"][1]
    assert first == {"name": "tables.device", "shape": [200], "dtype": "int32", "placement": "device", "bytes": 800,
                     "reason": first["reason"], "parts": [{"name": "persistent", "offset": 0, "shape": [100]},
                                                          {"name": "step_rows", "offset": 100, "shape": [100]}]}


def test_a_name_the_plan_does_not_hold_is_refused_listing_the_names_it_does():
    """plan.buffers['x'], an allocation's part('x') and the ledger's charge('x') raised a bare KeyError('x');
    they raise UnknownNameError (a GraphkvError and still a KeyError) naming what exists."""
    from graphkv.errors import GraphkvError, UnknownNameError

    import graphkv
    from graphkv.models.tiny_hybrid import TinyHybridConfig, model_kv

    plan = graphkv.compile(model_kv(TinyHybridConfig()), graphkv.Limits(
        max_model_len=128, max_num_seqs=3, max_num_batched_tokens=64, num_blocks_override=24), None)
    names = [b.name for b in plan.buffers.buffers]
    assert names == ["flex.1.kv_num_blocks", "flex.1.kv_indices"]  # the tiny hybrid's attention group is group 1
    with pytest.raises(UnknownNameError, match=r"^static buffer='x': is not one of this plan's: "
                                               + re.escape(", ".join(names)) + r"; use a name from"):
        plan.buffers["x"]
    cuda = {a.name: a for a in plan.ledger.allocations("cuda")}
    with pytest.raises(KeyError, match=r"^tables.device part='x': is not one of its parts: "
                                       r"persistent, step_rows; use a name from .parts"):
        cuda["tables.device"].part("x")
    with pytest.raises(GraphkvError, match=r"^CUDA device allocation='x': is not one of the ledger's: .*tables.device"):
        plan.ledger.cuda_memory().charge("x")
    assert plan.buffers[names[0]].name == names[0] and "x" not in plan.buffers
