"""Block tables on every device present: host mirror in pages, stale columns written as page entries, per-step
rows without gathers."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from runtime_plans import attention_plan, widths_plan

import graphkv.runtime.tables.block_tables as tables_module
import graphkv.runtime.tables.staged_sync as staged_module
from graphkv import CapacityError, SpecError
from graphkv.kernels.block_tables import write_pages
from graphkv.runtime import BlockTables
from graphkv.runtime.ops import torch_ops
from graphkv.runtime.ops.choice import resolve_kernels
from graphkv.runtime.ops.reference import expand_pages_ref, gather_ref, write_pages_ref
from graphkv.runtime.tables import block_tables as block_tables_module


def _expected_tables(tables: BlockTables) -> list[torch.Tensor]:
    """The persistent tables the host mirror says the device should hold (kernel blocks, 0 past the pages)."""
    out = []
    for g, width in enumerate(tables.widths):
        t = torch.zeros(tables.max_num_seqs, width, dtype=torch.int32)
        for r in range(tables.max_num_seqs):
            ids = expand_pages_ref(tables.pages_np[g][r, :tables.num_pages_np[g, r]].tolist(), tables.bpks[g])
            t[r, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        out.append(t)
    return out


def _device_matches_host(tables: BlockTables) -> bool:
    return all(torch.equal(a.cpu(), b) for a, b in zip(tables.tables, _expected_tables(tables)))


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_write_pages_matches_the_reference_for_every_implementation(impl, device):
    """Page entries of bpk 1, 2 and 17 (and null entries) write the reference's kernel blocks, nothing else."""
    flat = torch.full((400,), -7, dtype=torch.int32)
    dst = [0, 5, 9, 40, 100, 150, 399]
    first = [3, 8 * 2, -1, 5 * 17, -1, 1, 11]
    bpk = [1, 2, 2, 17, 17, 1, 1]
    want = write_pages_ref(flat, dst, first, bpk)
    got = flat.to(device, copy=True)
    staged = torch.tensor(dst + first + bpk, dtype=torch.int64, device=device)
    (write_pages if impl == "triton" else torch_ops.write_pages)(got, staged, len(dst), max(bpk))
    assert torch.equal(got.cpu(), want)
    assert got[40:57].tolist() == list(range(85, 102)) and (got[100:117] == 0).all()


@pytest.mark.parametrize("bpk", [1, 2, 17])
def test_append_expands_pages_to_kernel_blocks(bpk, kernels, device):
    """Appended pages become kernel blocks b*bpk .. b*bpk+bpk-1 on the device after commit."""
    plan = attention_plan(bpk=bpk, num_blocks=40, max_model_len=bpk * 32 * 4 if bpk > 1 else 64)
    tables = BlockTables(plan, device, kernels=kernels)
    tables.append(1, [[7, 3]])
    tables.append(1, [[39]])
    assert tables.pages_np[0][1, :3].tolist() == [7, 3, 39] and tables.num_pages_np[0, 1] == 3
    tables.commit()
    want = expand_pages_ref([7, 3, 39], bpk)
    assert tables.tables[0][1, :len(want)].tolist() == want
    assert (tables.tables[0][1, len(want):] == 0).all() and (tables.tables[0][0] == 0).all()


def test_staged_commit_writes_only_the_stale_columns(device):
    """GPU path: after a commit, columns of unchanged rows and columns before a row's first change are not written."""
    tables = BlockTables(widths_plan(), device, kernels="triton")
    tables.append(0, [[1, 2, 3, 4, 5], [6], [7]])
    tables.append(3, [[8], None, [9]])
    tables.commit()
    for t in tables.tables:
        t[1:3] = 99  # rows 1 and 2 never change: poison them on the device
    tables.tables[0][0, :10] = -5  # row 0's first 5 pages (10 kernel blocks) do not change either
    tables.append(0, [[10, 11], None, None])
    tables.commit()
    assert (tables.tables[0][0, :10] == -5).all() and tables.tables[0][0, 10:16].tolist() == [20, 21, 22, 23, 0, 0]
    tables.overwrite(3, [[12], [13], None])
    tables.commit()
    assert all((t[1:3] == 99).all() for t in tables.tables)
    assert tables.tables[0][3, :4].tolist() == [24, 25, 0, 0] and tables.tables[1][3, :2].tolist() == [26, 27]


def test_commit_is_one_launch_off_the_host(monkeypatch, device):
    """On the staged (kernel) path every stale column of every group reaches the device in one write."""
    tables = BlockTables(widths_plan(), device, kernels="triton")
    calls = []
    real = staged_module.StagedSync._write
    monkeypatch.setattr(staged_module.StagedSync, "_write", lambda self, *a: calls.append(a) or real(self, *a))
    tables.append(0, [[1, 2, 3], [6], [7]])
    tables.append(3, [[8], None, [9]])
    tables.commit()
    assert len(calls) == 1 and calls[0][0].shape == (7,) and _device_matches_host(tables)  # 7 page entries


def test_append_batch_appends_a_whole_step_and_checks_rows_and_ids(kernels, device):
    """append_batch gives several rows pages in several groups at once; bad rows or ids change nothing."""
    tables = BlockTables(widths_plan(), device, kernels=kernels)
    tables.append_batch([2, 0], [([1, 2], [3], [4]), None])
    tables.append_batch(np.array([0, 2]), [([5], (), [6]), ([7], [8], ())])
    assert tables.num_pages_np[:, [0, 2]].tolist() == [[1, 3], [0, 2], [1, 1]]
    assert tables.pages_np[0][2, :3].tolist() == [1, 2, 7]
    tables.append_batch([1, 3], [([9, 10], [11], [12]), ([13, 14], (), ())])  # 6 pages in 6 segments, not 1 each
    assert [tables.pages_np[g][1, :2].tolist() for g in range(3)] == [[9, 10], [11, 0], [12]]
    assert tables.pages_np[0][3, :2].tolist() == [13, 14] and tables.num_pages_np[:, 3].tolist() == [2, 0, 0]
    tables.commit()
    assert _device_matches_host(tables)
    before = tables.num_pages_np.copy()
    for rows, pages, text in (([0, 0], [None, None], "distinct row"), ([9], [None], "distinct row"),
                              ([1], [([64], (), ())], "num_blocks=64"), ([1], [([1.5], (), ())], "integers"),
                              ([1], [([1],)], "one page-ID list per KV-cache group")):
        with pytest.raises(SpecError, match=text):
            tables.append_batch(rows, pages)
    with pytest.raises(CapacityError, match="capacity is 8 pages"):
        tables.append_batch([1, 2], [([1], (), ()), (list(range(1, 9)), (), ())])
    assert np.array_equal(tables.num_pages_np, before)


def test_append_batch_fills_every_row_of_every_group_in_one_step(kernels, device):
    """One step may give every row its full pages in every group (more entries than any one group holds)."""
    plan = widths_plan()
    tables = BlockTables(plan, device, kernels=kernels)
    caps = [g.pages_per_request for g in plan.groups]
    rows = list(range(plan.limits.max_num_seqs))
    ids = iter(range(1, 64))
    pages = [tuple([next(ids) for _ in range(c)] if g != 1 else [] for g, c in enumerate(caps)) for _ in rows]
    pages[0] = tuple([next(ids) for _ in range(c)] for c in caps)
    assert sum(map(len, pages[0])) + 3 * (caps[0] + caps[2]) > len(rows) * max(caps)
    tables.append_batch(rows, pages)
    assert tables.num_pages_np[:, 0].tolist() == caps and tables.num_pages_np[1, 1:].tolist() == [0, 0, 0]
    tables.commit()
    assert _device_matches_host(tables)


@pytest.mark.parametrize("bad", [2.5, "9", None, True, 2**40, -1, 64])
@pytest.mark.parametrize("lengths", [(1, 1, 1), (40, 40, 40), (1, 4, 2), (30, 12, 25)])
def test_append_batch_one_group_refuses_a_bad_id_in_a_late_row_and_changes_nothing(bad, lengths, kernels, device):
    """The one-group paths (page by page, array, general; rows gaining as many pages or not) undo what
    they stored when the 3rd row's last id is bad."""
    plan = attention_plan(num_blocks=64, max_num_seqs=4, max_model_len=16 * 48)
    tables = BlockTables(plan, device, kernels=kernels)
    tables.append_batch([0, 1, 2], [([1],), ([2],), ([3],)])
    tables.sync(np.arange(3), 3)
    pages = [[(10 + 40 * i + j) % 60 + 2 for j in range(n)] for i, n in enumerate(lengths)]
    pages[2][-1] = bad
    host, counts = tables.pages_flat.copy(), tables.num_pages_np.copy()
    step = [t.clone() for t in tables.input_tables]
    with pytest.raises(SpecError):
        tables.append_batch([0, 1, 2], [(row,) for row in pages])
    assert np.array_equal(tables.pages_flat, host) and np.array_equal(tables.num_pages_np, counts)
    tables.sync(np.arange(3), 3)
    assert all(torch.equal(a, b) for a, b in zip(step, tables.input_tables))


@pytest.mark.parametrize("pages_per_row", [1, 40])
def test_append_batch_one_group_takes_pages_0_and_1_given_as_ints(pages_per_row, kernels, device):
    """Ints 0 and 1 (which a bool would equal) pass the one-group fast paths' bool check, in any row."""
    plan = attention_plan(num_blocks=64, max_num_seqs=4, max_model_len=16 * 48)
    tables = BlockTables(plan, device, kernels=kernels)
    pages = [[(r * 7 + j) % 60 + 2 for j in range(pages_per_row)] for r in range(3)]
    pages[1][-1], pages[2][0] = 1, 0
    tables.append_batch([0, 1, 2], [(row,) for row in pages])
    assert tables.num_pages_np[0, :3].tolist() == [pages_per_row] * 3
    assert [tables.pages_np[0][r, :pages_per_row].tolist() for r in range(3)] == pages


@pytest.mark.parametrize("bpk", [1, 17])
@pytest.mark.parametrize("count", [(1, 1, 1), (3, 3, 3), (30, 30, 30), (1, 3, 0), (2, 0, 4), (1, 0, 2), (30, 5, 22),
                                   (36, 5, 30)])
@pytest.mark.parametrize("held", [(2, 2, 2), (1, 3, 2)])
@pytest.mark.parametrize("batch", [(0, 1, 2), (2, 0, 1)])
def test_append_batch_one_group_paths_write_the_reference_tables(bpk, count, held, batch, kernels, device):
    """Every one-group path (page by page, row slices, scatter; rows shown in order or not; rows holding
    and gaining the same pages or not) leaves mirror and step rows equal to the reference expansion."""
    plan = attention_plan(bpk=bpk, num_blocks=200, max_num_seqs=4, max_model_len=(16 if bpk == 1 else 32 * bpk) * 40)
    tables = BlockTables(plan, device, kernels=kernels)
    rows = list(batch)
    model = {r: [150 + 10 * r + j for j in range(held[r])] for r in range(3)}
    tables.append_batch(rows, [(model[r],) for r in rows])
    tables.sync(np.array(rows), 4)
    new = {r: [2 + 40 * r + j for j in range(count[r])] for r in range(3)}  # (36, 5, 30): 71 pages
    tables.append_batch(np.array(rows), [(new[r],) for r in rows])
    tables.sync(np.array(rows), 4, same_rows=True)
    for i, r in enumerate(rows):
        pages = model[r] + new[r]
        assert tables.pages_np[0][r, :len(pages)].tolist() == pages and tables.num_pages_np[0, r] == len(pages)
        want = expand_pages_ref(pages, bpk)
        got = tables.input_tables[0][i].cpu()
        assert got[:len(want)].tolist() == want and (got[len(want):] == 0).all(), (i, r)
    assert (tables.input_tables[0][3].cpu() == 0).all()
    tables.commit()
    assert _device_matches_host(tables)


def test_append_batch_ragged_beyond_a_row_capacity_is_a_capacity_error(kernels, device):
    """One row of a ragged batch overflowing its pages per request: CapacityError, nothing changed."""
    plan = attention_plan(num_blocks=400, max_num_seqs=4, max_model_len=16 * 48)
    tables = BlockTables(plan, device, kernels=kernels)
    tables.append_batch([0, 1], [(list(range(2, 42)),), (list(range(50, 52)),)])
    host, counts = tables.pages_flat.copy(), tables.num_pages_np.copy()
    with pytest.raises(CapacityError, match="request row 0"):
        tables.append_batch([1, 0], [(list(range(100, 130)),), (list(range(200, 210)),)])
    assert np.array_equal(tables.pages_flat, host) and np.array_equal(tables.num_pages_np, counts)


@pytest.mark.parametrize("values", [(1,), (0, 1), (1, 0)])
@pytest.mark.parametrize("ones", [1, 3, 12])
@pytest.mark.parametrize("bad", [None, True, False])
@pytest.mark.parametrize("where", [(2, 29), (0, 29)])
def test_append_batch_array_path_finds_a_bool_among_ids_0_and_1(values, ones, bad, where, kernels, device):
    """Above the page-by-page size, ids equal to 0 or 1 are looked at one by one (a few 1s) or by one
    array pass (many, or a 0 among them): a True or False among ``ones`` int 0s / 1s (last, or
    before later ones) is refused, ints alone are taken."""
    plan = attention_plan(num_blocks=600, max_num_seqs=4, max_model_len=16 * 48)
    tables = BlockTables(plan, device, kernels=kernels)
    pages = [[10 + r * 30 + j for j in range(30)] for r in range(3)]
    for k in range(ones):
        pages[k % 3][k // 3] = values[k % len(values)]  # int 0s / 1s spread over the rows
    if bad is not None:
        pages[where[0]][where[1]] = bad
    if bad is None:
        tables.append_batch([0, 1, 2], [(row,) for row in pages])
        assert [tables.pages_np[0][r, :30].tolist() for r in range(3)] == pages
    else:
        with pytest.raises(SpecError, match=str(bad)):
            tables.append_batch([0, 1, 2], [(row,) for row in pages])
        assert tables.num_pages_np[0, :3].tolist() == [0, 0, 0] and not tables.pages_flat.any()


@pytest.fixture(params=["items", "arrays"])
def row_access(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A row's pages read and cleared item by item (the few-page path) or through numpy views (FEW_PAGES moved
    below every count)."""
    monkeypatch.setattr(tables_module, "FEW_PAGES", 10**6 if request.param == "items" else 0)
    return request.param


def test_held_pages_lists_each_groups_pages_in_order(row_access):
    """held_pages: row 1's pages per group, in page order (lists on the few-page path, views otherwise); an empty
    group gives an empty list; a bad row is refused."""
    tables = BlockTables(widths_plan())
    tables.append(1, [[5, 2, 9], [4], []])
    held = tables.held_pages(1)
    assert [list(map(int, p)) for p in held] == [[5, 2, 9], [4], []]
    assert all(isinstance(p, list if row_access == "items" else np.ndarray) for p in held[:2])
    with pytest.raises(SpecError, match=r"^req_index=99: must be a row in \[0, max_num_seqs=\d+\)"):
        tables.held_pages(99)


def test_overwrite_remove_move_keep_the_null_page_invariant(kernels, device, row_access):
    """overwrite / remove / move leave every entry past a row's pages at the null page 0."""
    tables = BlockTables(widths_plan(), device, kernels=kernels)
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
    assert not tables.pages_flat.any() and _device_matches_host(tables)


def test_truncate_undoes_an_append_and_rejects_counts_above_the_pages_held(kernels, device):
    """truncate keeps the first pages of each group (the rest become the null page 0) and checks its counts."""
    tables = BlockTables(widths_plan(), device, kernels=kernels)
    tables.append(0, [[1, 2], [3], [4]])
    tables.commit()
    before = [t.clone() for t in tables.tables]
    tables.append(0, [[5], [6], None])
    tables.commit()
    tables.truncate(0, [2, 1, 1])
    tables.commit()
    assert tables.num_pages_np[:, 0].tolist() == [2, 1, 1] and tables.pages_np[0][0, :3].tolist() == [1, 2, 0]
    assert all(torch.equal(a, b) for a, b in zip(before, tables.tables)) and _device_matches_host(tables)
    with pytest.raises(SpecError, match=r"num_pages_per_group=\[3, 1, 1\]: needs one count per group \(3\)"):
        tables.truncate(0, [3, 1, 1])
    with pytest.raises(SpecError, match="one count per group"):
        tables.truncate(0, [1])
    with pytest.raises(SpecError, match="integers"):
        tables.truncate(0, [1.5, 1, 1])
    assert tables.num_pages_np[:, 0].tolist() == [2, 1, 1]


def test_append_beyond_capacity_names_row_group_pages_and_fix():
    """CapacityError names the row, group, pages held, capacity and the fix, and changes nothing."""
    plan = widths_plan()
    tables = BlockTables(plan)
    tables.append(1, [[1, 2, 3], [4, 5, 6, 7], [8]])
    before = [t.copy() for t in tables.pages_np]
    with pytest.raises(CapacityError, match=r"request row 1: group 1 .* holds 4 pages and cannot take 1 more; "
                                            r"its capacity is 4 pages per request .*pages that left the window are "
                                            r"not freed\), so this table holds 128 tokens") as info:
        tables.append(1, [[9], [10], None])
    assert "Limits(max_concurrent_batches=" in str(info.value)
    assert tables.num_pages_np[:, 1].tolist() == [3, 4, 1]
    assert all((a == b).all() for a, b in zip(before, tables.pages_np))
    with pytest.raises(CapacityError, match="group 2"):
        tables.overwrite(0, [None, None, [1, 2]])


@pytest.mark.parametrize("ids,text", [([64], "num_blocks=64"), ([-1], "num_blocks=64"), ([True], "integers"),
                                      ([2.0], "integers"), (["3"], "integers"), ([None], "integers"),
                                      ([2**70], "page ids must fit int64"), (np.array([1.0]), "integer array")])
def test_bad_page_ids_are_spec_errors_that_change_nothing(ids, text):
    """Page ids outside the pool, bools, floats, strings, None and huge ints raise SpecError naming the group."""
    tables = BlockTables(widths_plan())
    with pytest.raises(SpecError, match=text) as info:
        tables.append(0, [ids, None, None])
    assert info.value.field.startswith("page_ids_per_group[0]")
    assert not tables.num_pages_np.any() and not tables.pages_flat.any()


def test_bad_rows_and_group_counts_are_errors():
    """Rows outside max_num_seqs (bools too) and wrong group counts raise SpecError."""
    tables = BlockTables(widths_plan())
    with pytest.raises(SpecError, match="max_num_seqs=4"):
        tables.append(4, [[1], None, None])
    with pytest.raises(SpecError, match="max_num_seqs=4"):
        tables.append(True, [[1], None, None])
    with pytest.raises(SpecError, match="one entry per KV-cache group"):
        tables.append(0, [[1]])
    with pytest.raises(SpecError, match="one entry per KV-cache group"):
        tables.append(0, "abc")
    assert not tables.num_pages_np.any() and not tables.pages_flat.any()


def test_sync_copies_the_step_rows_only_when_the_batch_rows_change(kernels, device):
    """Per-step rows show the batch's rows, padded with the null page; a step with the same rows rewrites
    only what changed (a poisoned entry past the pages survives), a reordered batch copies its rows again."""
    tables = BlockTables(widths_plan(), device, kernels=kernels)
    for row in range(4):
        tables.append(row, [[row + 1] * (row + 1), [row + 10], [row + 20]])
    for g in range(3):
        tables.input_tables[g].fill_(99)
    rows = np.array([3, 0, 2])
    tables.sync(rows, num_reqs_padded=4)
    tables.commit()
    for got, want in zip(tables.input_tables, gather_ref(tables.tables, torch.from_numpy(rows).int(), 4)):
        assert torch.equal(got[:4].cpu(), want)
    assert (tables.input_tables[0][4:] == 99).all()  # rows past the padding are not touched
    tables.input_tables[0][2, 15] = -7  # past batch row 2's pages: only a full copy would rewrite it
    tables.append(0, [[30], None, None])  # a new page for batch row 1: written into it directly
    tables.sync(rows, num_reqs_padded=4)
    assert tables.input_tables[0][1, :4].tolist() == [2, 3, 60, 61] and tables.input_tables[0][2, 15] == -7
    tables.sync(np.array([0, 3, 2]), num_reqs_padded=3)  # the batch reordered: its rows are copied again
    assert tables.input_tables[0][0, :4].tolist() == [2, 3, 60, 61] and tables.input_tables[0][2, 15] == 0
    tables.commit()
    assert _device_matches_host(tables)


def test_sync_pads_more_rows_with_the_null_page(kernels, device):
    """Growing the padded batch with the same rows nulls the new padding rows (stale values from a larger batch)."""
    tables = BlockTables(widths_plan(), device, kernels=kernels)
    for row in range(4):
        tables.append(row, [[row + 1], [row + 10], [row + 20]])
    tables.sync(np.arange(4), num_reqs_padded=4)
    tables.sync(np.array([1]), num_reqs_padded=1)  # rows 1..3 keep the last batch's values
    tables.sync(np.array([1]), num_reqs_padded=3)
    assert [t[:3, 0].tolist() for t in tables.input_tables] == [[4, 0, 0], [22, 0, 0], [21, 0, 0]]


def test_sync_after_remove_and_reuse_of_a_row_shows_the_new_pages(kernels, device, row_access):
    """A row freed and given to a new request at the same batch row shows only the new request's pages."""
    tables = BlockTables(widths_plan(), device, kernels=kernels)
    tables.append(0, [[1, 2, 3], [4], [5]])
    tables.sync(np.array([0]), 1)
    tables.remove(0)
    tables.append(0, [[6], [7], [8]])
    tables.sync(np.array([0]), 1, same_rows=True)
    assert [t[0].tolist()[:6] for t in tables.input_tables] == [[12, 13, 0, 0, 0, 0], [14, 15, 0, 0, 0, 0], [8]]


def test_auto_kernels_are_torch_on_cpu_and_triton_on_cuda():
    """kernels="auto" resolves to torch for a CPU device and to Triton for a CUDA one; the choice is read-only."""
    tables = BlockTables(widths_plan())
    assert tables.kernels == "torch"
    assert resolve_kernels("auto", "cuda") == "triton" and resolve_kernels("auto", torch.device("cuda", 1)) == "triton"
    assert resolve_kernels("triton", "cpu") == "triton" and resolve_kernels("torch", "cuda") == "torch"
    assert BlockTables(widths_plan(), kernels="triton").kernels == "triton"
    with pytest.raises(AttributeError):
        tables.kernels = "triton"


def test_unknown_kernels_and_plans_are_spec_errors():
    """An unknown kernels value and a non-plan raise SpecError (devices: tests/runtime/test_devices.py)."""
    with pytest.raises(SpecError, match=r"kernels='cuda': must be one of auto, triton, torch; pass kernels='auto'"):
        BlockTables(widths_plan(), kernels="cuda")
    with pytest.raises(SpecError, match="must be a graphkv Plan"):
        BlockTables("plan")


def test_per_step_buffers_keep_their_address(kernels, device):
    """Persistent and per-step tables keep data_ptr() across appends, syncs and gathers (a CPU with bpk 2
    and torch kernels keeps no persistent kernel-block tables: only the mirror and the step's rows)."""
    tables = BlockTables(widths_plan(), device, kernels=kernels)
    kept = () if (device, kernels) == ("cpu", "torch") else tables.tables
    ptrs = None
    for step in range(3):
        tables.append(step, [[step + 1], [step + 1], [step + 1]])
        tables.sync(np.arange(step + 1), step + 1)
        now = [t.data_ptr() for t in (*kept, *tables.input_tables)] + [tables.pages_flat.ctypes.data]
        assert ptrs is None or now == ptrs
        ptrs = now


def _two_rows(kernels: str, device: str) -> BlockTables:
    """16-token pages, 4 rows: row 0 holds page 5, row 3 pages 9 and 10; the step shows rows 0 and 3."""
    tables = BlockTables(attention_plan(num_blocks=40, max_num_seqs=4), device, kernels=kernels)
    tables.append_batch([0, 3], [[[5]], [[9, 10]]])
    tables.sync(np.array([0, 3]), 2)
    return tables


@pytest.mark.parametrize("rows, value, limit", [
    (np.array([-1]), r"\[-1\]", ""),  # numpy would wrap it to row 3: another request's pages
    (np.array([4]), r"\[4\]", ""),
    (np.array([0, 0]), r"\[0, 0\]", ""),
    (np.array([0.0]), r"'array of dtype float64, shape \(1,\)'", ", as a 1-D integer array"),
    (np.array([[0]]), r"'array of dtype int64, shape \(1, 1\)'", ", as a 1-D integer array"),
    (np.array([True]), r"'array of dtype bool, shape \(1,\)'", ", as a 1-D integer array"),
    ([True], r"\[True\]", ", each a plain int"),
    ([0.0], r"\[0.0\]", ", each a plain int"),
    ("0", "'str'", ", as a 1-D integer array"),
    (None, "'NoneType'", ", as a 1-D integer array"),
], ids=["negative", "max_num_seqs", "repeated", "float", "2-D", "bool-array", "bool-list", "float-list", "str", "None"])
def test_sync_refuses_rows_that_are_not_distinct_rows_in_range_and_changes_nothing(rows, value, limit, kernels,
                                                                                    device):
    """sync refuses bad rows (a negative one too) naming field, value, limit and fix, before any write: the step rows
    are as they were, and the next valid sync (the staged path's too) shows the right pages."""
    tables = _two_rows(kernels, device)
    shown = [t[:2, :3].tolist() for t in tables.input_tables]
    assert shown == [[[5, 0, 0], [9, 10, 0]]]
    with pytest.raises(SpecError, match=rf"^rows={value}: must be distinct request rows in \[0, max_num_seqs=4\), "
                                        rf"one per batch row{re.escape(limit)}; pass "):
        tables.sync(rows, 2)
    assert [t[:2, :3].tolist() for t in tables.input_tables] == shown
    tables.sync(np.array([0, 3]), 2)
    assert [t[:2, :3].tolist() for t in tables.input_tables] == [[[5, 0, 0], [9, 10, 0]]]
    tables.sync(np.array([3, 0]), 2)
    assert [t[:2, :3].tolist() for t in tables.input_tables] == [[[9, 10, 0], [5, 0, 0]]]


def test_sync_takes_rows_as_a_list_of_ints_or_any_integer_array(kernels, device):
    """A list or tuple of plain ints (an empty one too) and integer arrays of any width are rows as good as an
    int64 array."""
    tables = _two_rows(kernels, device)
    three_then_zero, zero_then_three = [[9, 10, 0], [5, 0, 0]], [[5, 0, 0], [9, 10, 0]]
    for rows, want in [([3, 0], three_then_zero), ((0, 3), zero_then_three), ([], [[0, 0, 0], [0, 0, 0]]),
                       (np.array([3, 0], dtype=np.int32), three_then_zero),
                       (np.array([0, 3], dtype=np.uint8), zero_then_three)]:
        tables.sync(rows, 3)
        assert [t[:2, :3].tolist() for t in tables.input_tables] == [want], rows


def test_sync_with_rows_checked_skips_the_row_checks(monkeypatch, kernels, device):
    """rows_checked=True (a Step's own rows) costs no row check; rows_checked=False checks them."""
    tables = _two_rows(kernels, device)

    def refuse(mirror, rows, same_rows):
        raise AssertionError("rows checked")

    monkeypatch.setattr(block_tables_module, "checked_rows", refuse)
    tables.sync(np.array([3, 0]), 2, rows_checked=True)
    assert [t[:2, :3].tolist() for t in tables.input_tables] == [[[9, 10, 0], [5, 0, 0]]]
    with pytest.raises(AssertionError, match="rows checked"):
        tables.sync(np.array([3, 0]), 2)


@pytest.mark.parametrize("group", [0, 1, 3, -1, True, 2.0, "2", None])
def test_state_pages_refuses_a_group_that_is_no_state_group(group):
    """state_pages takes the index of a state (Mamba) group only: another group, one past the plan's groups, a
    negative index (numpy would wrap it), a bool, a float, a str or None is a SpecError naming the groups."""
    tables = BlockTables(widths_plan())
    tables.append(1, [[1], [2], [3]])
    assert tables.state_pages(2, np.array([1, 0])).tolist() == [3, 0]
    assert tables.state_pages(np.int64(2), np.array([1])).tolist() == [3]
    with pytest.raises(SpecError, match=rf"^group={re.escape(repr(group))}: must be the index of a state \(Mamba\) "
                                        r"group of the plan: its groups are \['full_attention', 'sliding_window', "
                                        r"'mamba'\], the state groups \[2\]; pass the index of a state group"):
        tables.state_pages(group, np.array([1]))


def test_every_edit_but_append_few_counts_in_edits(kernels, device):
    """edits changes with append, append_batch, append_pages, truncate, overwrite, move and remove; append_few, sync,
    commit and reads leave it as it was (a Step's repeated step compares it to see its capacities are current)."""
    tables = BlockTables(widths_plan(), device, kernels=kernels)
    assert tables.edits == 0
    seen = [tables.edits]

    def changed() -> bool:
        seen.append(tables.edits)
        return seen[-1] != seen[-2]

    tables.append(0, [[1], [2], [3]])
    assert changed()
    tables.append_batch([1], [[[4], [5], [6]]])
    assert changed()
    tables.append_batch(np.array([1]), [[[7], (), ()]])
    assert changed()
    tables.append_few(0, 0, [8])
    tables.sync(np.array([0, 1]), 2)
    tables.commit()
    tables.held_pages(0)
    tables.state_pages(2, np.array([0]))
    assert not changed() and tables.pages_np[0][0, :2].tolist() == [1, 8]
    tables.truncate(0, [1, 1, 1])
    assert changed()
    tables.overwrite(0, [[9, 10], None, None])
    assert changed()
    tables.move(0, 2)
    assert changed()
    tables.remove(2)
    assert changed()
    assert tables.num_pages_np[:, 2].tolist() == [0, 0, 0] and tables.num_pages_np[:, 1].tolist() == [2, 1, 1]


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_same_rows_true_with_other_rows_is_refused(kernels):
    """same_rows=True promises the last sync's rows (then one comparison checks them); other rows are refused (the
    step's rows went on showing the old ones, or none on a fresh table), nothing changed."""
    tables = BlockTables(widths_plan(), kernels=kernels)
    tables.append(1, [[1], [2], [3]])
    tables.append(0, [[4], [5], [6]])
    with pytest.raises(SpecError, match=r"^same_rows=True: rows \[1, 0\] are not the rows of the last sync \(\[\]\)"):
        tables.sync(np.array([1, 0]), 2, same_rows=True)  # (showed no rows: the copy was skipped, the rows stale)
    tables.sync(np.array([1, 0]), 2)
    before = [t[:2].clone() for t in tables.input_tables]
    with pytest.raises(SpecError, match=r"^same_rows=True: rows \[0, 1\] are not the rows of the last sync \(\[1, 0\]\)"):
        tables.sync(np.array([0, 1]), 2, same_rows=True)
    assert all(torch.equal(a, b[:2]) for a, b in zip(before, tables.input_tables))
    tables.sync([1, 0], 2, same_rows=True)
    tables.sync([0, 1], 2)
    assert tables.input_tables[0][0, 0] == 4 * tables.bpks[0]
