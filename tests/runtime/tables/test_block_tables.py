"""Block tables: expansion, staged edits applied by one launch, gather into per-step tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runtime_plans import attention_plan, widths_plan

import graphkv.runtime.tables.block_tables as block_tables_module
from graphkv import CapacityError, SpecError
from graphkv.runtime import BlockTables
from graphkv.runtime.ops import torch_ops as torch_kernels
from graphkv.runtime.ops.choice import resolve_kernels
from graphkv.runtime.tables.expansion import SMALL_EXPANSION_KERNEL_BLOCKS, write_expanded
from graphkv.runtime.ops.reference import expand_pages_ref, gather_ref


def _device_matches_host(tables: BlockTables) -> bool:
    return all(torch.equal(t, torch.from_numpy(h)) for t, h in zip(tables.tables, tables.tables_np))


@pytest.mark.parametrize("bpk", [1, 2, 3, 17])
@pytest.mark.parametrize("as_numpy", [False, True])
def test_write_expanded_matches_reference_on_both_sides_of_the_switch(bpk, as_numpy):
    """write_expanded equals the list-comprehension reference for tiny and large appends, lists and arrays."""
    rng = np.random.default_rng(bpk)
    for n in (1, 2, SMALL_EXPANSION_KERNEL_BLOCKS // bpk, SMALL_EXPANSION_KERNEL_BLOCKS // bpk + 1, 40):
        ids = rng.integers(0, 1000, size=n)
        row = np.full(60 * bpk, -7, dtype=np.int32)
        end = write_expanded(row, 3, ids if as_numpy else ids.tolist(), bpk)
        assert end == 3 + n * bpk
        assert row[3:end].tolist() == expand_pages_ref(ids.tolist(), bpk)
        assert (row[:3] == -7).all() and (row[end:] == -7).all()


@pytest.mark.parametrize("bpk", [1, 2, 17])
def test_append_expands_pages_to_kernel_blocks(bpk, kernels):
    """Appended pages become kernel blocks b*bpk .. b*bpk+bpk-1 on host and, after commit, on device."""
    plan = attention_plan(bpk=bpk, num_blocks=40, max_model_len=bpk * 32 * 4 if bpk > 1 else 64)
    tables = BlockTables(plan, kernels=kernels)
    tables.append(1, [[7, 3]])
    tables.append(1, [[39]])
    tables.commit()
    want = expand_pages_ref([7, 3, 39], bpk)
    assert tables.tables[0][1, :len(want)].tolist() == want
    assert tables.num_pages_np[0, 1] == 3
    assert (tables.tables[0][1, len(want):] == 0).all() and (tables.tables[0][0] == 0).all()


def test_commit_is_one_launch_for_all_groups(monkeypatch, kernels):
    """Edits to several rows of several groups reach the device through one apply_row_writes call."""
    calls = []
    module = block_tables_module if kernels == "triton" else torch_kernels
    real = module.apply_row_writes
    monkeypatch.setattr(module, "apply_row_writes", lambda *a: calls.append(a) or real(*a))
    tables = BlockTables(widths_plan(), kernels=kernels)
    tables.append(0, [[1, 2], [3], [4]])
    tables.append(3, [[5], None, [6]])
    tables.overwrite(2, [[7, 8, 9], [10, 11], None])
    assert tables.commit() == 7
    assert len(calls) == 1 and _device_matches_host(tables)
    assert tables.commit() == 0 and len(calls) == 1  # nothing staged: no launch


def test_overwrite_remove_move_keep_the_null_page_invariant(kernels):
    """overwrite / remove / move leave every entry past a row's pages at the null page 0."""
    tables = BlockTables(widths_plan(), kernels=kernels)
    tables.append(0, [[1, 2, 3], [4, 5], [6]])
    tables.append(1, [[7], [8], [9]])
    tables.commit()
    tables.overwrite(0, [[10], None, []])
    tables.commit()
    assert tables.tables[0][0].tolist()[:4] == [20, 21, 0, 0] and tables.tables[1][0, :4].tolist() == [8, 9, 10, 11]
    assert tables.num_pages_np[:, 0].tolist() == [1, 2, 0] and tables.tables[2][0, 0] == 0
    tables.move(0, 1)
    tables.commit()
    assert tables.num_pages_np[:, 1].tolist() == [1, 2, 0] and tables.num_pages_np[:, 0].tolist() == [0, 0, 0]
    assert tables.tables[0][1, :3].tolist() == [20, 21, 0] and (tables.tables[0][0] == 0).all()
    tables.remove(1)
    tables.commit()
    assert all((t == 0).all() for t in tables.tables) and (tables.num_pages_np == 0).all()
    assert _device_matches_host(tables)


def test_truncate_undoes_an_append_and_rejects_counts_above_the_pages_held(kernels):
    """truncate keeps the first pages of each group (the rest become the null page 0) and checks its counts."""
    tables = BlockTables(widths_plan(), kernels=kernels)
    tables.append(0, [[1, 2], [3], [4]])
    tables.commit()
    before = [t.clone() for t in tables.tables]
    tables.append(0, [[5], [6], None])
    tables.truncate(0, [2, 1, 1])
    tables.commit()
    assert tables.num_pages_np[:, 0].tolist() == [2, 1, 1]
    assert all(torch.equal(a, b) for a, b in zip(before, tables.tables)) and _device_matches_host(tables)
    with pytest.raises(SpecError, match=r"num_pages_per_group=\[3, 1, 1\]: needs one count per group \(3\)"):
        tables.truncate(0, [3, 1, 1])
    with pytest.raises(SpecError, match="one count per group"):
        tables.truncate(0, [1])
    assert tables.num_pages_np[:, 0].tolist() == [2, 1, 1]

def test_append_beyond_capacity_names_row_group_pages_and_fix():
    """CapacityError names the row, group, pages held, capacity and the fix, and changes nothing."""
    plan = widths_plan()
    tables = BlockTables(plan)
    tables.append(1, [[1] * 3, [2] * 4, [3]])
    before = [t.copy() for t in tables.tables_np]
    with pytest.raises(CapacityError, match=r"request row 1: group 1 .* holds 4 pages and cannot take 1 more; "
                                            r"its capacity is 4 pages per request .*free pages") as info:
        tables.append(1, [[5], [6], None])
    assert "max_model_len=256" in str(info.value)
    assert tables.num_pages_np[:, 1].tolist() == [3, 4, 1]
    assert all((a == b).all() for a, b in zip(before, tables.tables_np))
    with pytest.raises(CapacityError, match="group 2"):
        tables.overwrite(0, [None, None, [1, 2]])


def test_bad_rows_page_ids_and_group_counts_are_errors():
    """Rows outside max_num_seqs, page IDs outside the pool and wrong group counts raise SpecError."""
    tables = BlockTables(widths_plan())
    with pytest.raises(SpecError, match="max_num_seqs=4"):
        tables.append(4, [[1], None, None])
    with pytest.raises(SpecError, match="num_blocks=64"):
        tables.append(0, [[64], None, None])
    with pytest.raises(SpecError, match="one entry per KV-cache group"):
        tables.append(0, [[1]])
    assert not tables.commit()


def test_gather_packs_groups_of_different_widths_and_pads_with_null_page(kernels):
    """gather copies idx_mapping's rows of every group (each its own width); padding rows are 0."""
    tables = BlockTables(widths_plan(), kernels=kernels)
    assert tables.widths == (16, 8, 1)
    for row in range(4):
        tables.append(row, [[row + 1] * (row + 1), [row + 10], [row + 20]])
    tables.commit()
    for g in range(3):
        tables.input_tables[g].fill_(99)
    idx = torch.tensor([3, 0, 2], dtype=torch.int32)
    out = tables.gather(idx, num_reqs_padded=4)
    for got, want in zip(out, gather_ref(tables.tables, idx, 4)):
        assert torch.equal(got, want)
    assert tables.state_indices(2)[:4].tolist() == [23, 20, 22, 0]
    with pytest.raises(SpecError, match="num_reqs_padded"):
        tables.gather(idx, num_reqs_padded=2)
    with pytest.raises(SpecError, match="int32"):
        tables.gather(idx.long(), num_reqs_padded=3)


def test_gather_gives_out_of_range_rows_the_null_page(kernels):
    """idx_mapping entries outside [0, max_num_seqs) read nothing and gather null-page rows."""
    tables = BlockTables(widths_plan(), kernels=kernels)
    for row in (0, 1, 3):  # rows 0 and 3 are full, so a clamped read would show
        tables.append(row, [[row + 5], [row + 6], [row + 7]])
    tables.commit()
    for g in range(3):
        tables.input_tables[g].fill_(99)
    out = tables.gather(torch.tensor([-1, 1, 4], dtype=torch.int32), num_reqs_padded=3)
    assert [t[:3, 0].tolist() for t in out] == [[0, 12, 0], [0, 14, 0], [0, 8, 0]]
    assert all((t[3] == 99).all() for t in out)  # rows past num_reqs_padded are left as they are


def test_auto_kernels_are_torch_on_cpu_and_triton_on_cuda():
    """kernels="auto" resolves to torch for a CPU device and to Triton for a CUDA one; the choice is read-only."""
    tables = BlockTables(widths_plan())
    assert tables.kernels == "torch"
    assert resolve_kernels("auto", "cuda") == "triton" and resolve_kernels("auto", torch.device("cuda", 1)) == "triton"
    assert resolve_kernels("triton", "cpu") == "triton" and resolve_kernels("torch", "cuda") == "torch"
    assert BlockTables(widths_plan(), kernels="triton").kernels == "triton"
    with pytest.raises(AttributeError):
        tables.kernels = "triton"


def test_unknown_kernels_name_the_choices():
    """An unknown kernels value raises SpecError listing the valid choices."""
    with pytest.raises(SpecError, match=r"kernels='cuda': must be one of auto, triton, torch; pass kernels='auto'"):
        BlockTables(widths_plan(), kernels="cuda")


def test_per_step_buffers_keep_their_address(kernels):
    """Device tables, gathered tables and slot mappings keep data_ptr() across steps."""
    tables = BlockTables(widths_plan(), kernels=kernels)
    ptrs = None
    qsl = torch.zeros(5, dtype=torch.int32)
    positions = torch.zeros(32, dtype=torch.int64)
    for step in range(3):
        tables.append(step, [[step + 1], [step + 1], [step + 1]])
        tables.commit()
        gathered = tables.gather(torch.arange(step + 1, dtype=torch.int32), step + 1)
        qsl[1:step + 2] = torch.arange(1, step + 2)
        slots = tables.compute_slot_mappings(qsl, positions, step + 1)
        now = [t.data_ptr() for t in (*tables.tables, *gathered, slots)]
        assert ptrs is None or now == ptrs
        ptrs = now
