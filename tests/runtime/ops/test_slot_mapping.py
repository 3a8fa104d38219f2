"""Slot mapping kernel: all groups in one launch, kernel-block slots equal whole-page slots."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runtime_plans import attention_plan, widths_plan

from graphkv import SpecError
from graphkv.kernels.slot_mapping import PAD_SLOT_ID, compute_slot_mappings
from graphkv.runtime import BlockTables
from graphkv.runtime.ops import torch_ops as torch_kernels
from graphkv.runtime.ops import reference
from graphkv.runtime.ops.reference import slot_mapping_ref

SEQ_LENS = (1, 54, 97, 232)


def _step(seq_lens, query_lens, max_tokens):
    """query_start_loc and positions (full persistent size) of rows ending at seq_lens."""
    qsl = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(query_lens).cumsum(0)
    positions = torch.full((max_tokens,), 12345, dtype=torch.int64)  # junk past the step
    for r, (n, q) in enumerate(zip(seq_lens, query_lens)):
        positions[int(qsl[r]):int(qsl[r + 1])] = torch.arange(n - q, n)
    return qsl, positions


def _fill_random_pages(tables: BlockTables, seq_lens, seed):
    """Give row r enough random distinct pages per group for seq_lens[r]; returns the page tables."""
    rng = np.random.default_rng(seed)
    free = rng.permutation(np.arange(1, tables.num_blocks))
    pages_per_group = [[] for _ in range(tables.num_groups)]
    taken = 0
    for r, n in enumerate(seq_lens):
        ids = []
        for g, group in enumerate(tables.plan.groups):
            count = 1 if group.is_ssm else min(-(-n // group.block_size), tables.max_pages[g])
            ids.append(free[taken:taken + count].tolist())
            taken += count
            pages_per_group[g].append(ids[-1])
        tables.append(r, ids)
    tables.commit()
    return pages_per_group


def _page_table(pages, width):
    t = torch.zeros(len(pages), width, dtype=torch.int32)
    for r, p in enumerate(pages):
        t[r, :len(p)] = torch.tensor(p, dtype=torch.int32)
    return t


@pytest.mark.parametrize("bpk", [1, 17])
def test_slot_mapping_matches_reference_for_awkward_lengths(bpk, kernels):
    """Prefill chunks of lengths 1, 54, 97, 232 map to the reference slots; the tail is PAD_SLOT_ID."""
    plan = attention_plan(bpk=bpk, num_blocks=40, max_num_seqs=4, max_num_batched_tokens=512, max_model_len=256)
    tables = BlockTables(plan, kernels=kernels)
    _fill_random_pages(tables, SEQ_LENS, seed=bpk)
    tables.gather(torch.tensor([2, 0, 3, 1], dtype=torch.int32), 4)
    query_lens = (1, 30, 97, 232)
    seq_lens = [SEQ_LENS[i] for i in (2, 0, 3, 1)]
    qsl, positions = _step(seq_lens, [min(q, n) for q, n in zip(query_lens, seq_lens)], 512)
    tables.slot_mappings.fill_(7)  # stale values must be overwritten in the kernel
    got = tables.compute_slot_mappings(qsl, positions, 4)
    want = slot_mapping_ref(qsl, positions, tables.input_tables, [plan.groups[0].kernel_block_size], 4, 512)
    assert torch.equal(got, want)
    assert (got[0, int(qsl[-1]):] == PAD_SLOT_ID).all()


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("bpk", [2, 17])
def test_kernel_block_slots_equal_whole_page_slots(bpk, seed, kernels):
    """For random page tables, slots via kernel-block splitting equal slots computed with whole pages."""
    plan = widths_plan() if bpk == 2 else attention_plan(bpk=17, num_blocks=40, max_num_seqs=4,
                                                         max_num_batched_tokens=32, max_model_len=1200)
    tables = BlockTables(plan, kernels=kernels)
    seq_lens = (1, 54, 97, 232) if bpk == 2 else (1, 544, 545, 1200)
    pages = _fill_random_pages(tables, seq_lens, seed)
    tables.gather(torch.arange(4, dtype=torch.int32), 4)
    qsl, positions = _step(seq_lens, (1, 8, 11, 12), 32)
    got = tables.compute_slot_mappings(qsl, positions, 4)
    group = plan.groups[0]  # full attention: its pages cover every position
    page_table = _page_table(pages[0], group.pages_per_request)
    want = slot_mapping_ref(qsl, positions, [page_table], [group.block_size], 4, 32)
    assert torch.equal(got[0], want[0])
    if plan.groups[-1].is_ssm:
        assert (got[-1] == PAD_SLOT_ID).all()  # documented choice: state groups have no per-token slots


def test_groups_of_different_widths_in_one_launch(kernels):
    """One launch fills every group's row, each read through its own table width and kernel block size."""
    plan = widths_plan()
    tables = BlockTables(plan, kernels=kernels)
    tables.append(0, [[5, 6, 7], [8, 9], [10]])
    tables.append(1, [[11], [12], [13]])
    tables.commit()
    tables.gather(torch.tensor([1, 0], dtype=torch.int32), 3)
    qsl, positions = _step((20, 70), (4, 6), 32)
    got = tables.compute_slot_mappings(qsl, positions, 2)
    kbs = [g.kernel_block_size for g in plan.groups]
    want = slot_mapping_ref(qsl, positions, tables.input_tables, kbs, 2, 32, [g.is_ssm for g in plan.groups])
    assert torch.equal(got, want)
    assert got[0, 4:10].tolist() == [7 * 32 + p - 64 for p in range(64, 70)]  # page 7 holds 64..95


def test_out_of_table_positions_become_padding(kernels):
    """Positions past a row's table width or negative give PAD_SLOT_ID instead of an out-of-bounds read."""
    tables = BlockTables(widths_plan(), kernels=kernels)
    tables.append(0, [[1], [2], [3]])
    tables.commit()
    tables.gather(torch.tensor([0], dtype=torch.int32), 1)
    qsl = torch.tensor([0, 3], dtype=torch.int32)
    positions = torch.tensor([5, -1, 10_000], dtype=torch.int64)
    got = tables.compute_slot_mappings(qsl, positions, 1)
    assert got[0, :3].tolist() == [37, PAD_SLOT_ID, PAD_SLOT_ID] and (got[:, 3:] == PAD_SLOT_ID).all()


@pytest.mark.parametrize("compute", [compute_slot_mappings, torch_kernels.compute_slot_mappings],
                         ids=["triton", "torch"])
def test_launcher_rejects_wrong_dtypes_and_shapes(compute):
    """compute_slot_mappings raises SpecError for int64 query_start_loc or a wrong output buffer."""
    tables = BlockTables(widths_plan())
    qsl, positions = _step((3,), (3,), 32)
    with pytest.raises(SpecError, match="query_start_loc"):
        compute(qsl.long(), positions, tables.packed_input_tables, tables.kernel_block_sizes, tables.state_groups,
                1, tables.slot_mappings)
    with pytest.raises(SpecError, match="out"):
        compute(qsl, positions, tables.packed_input_tables, tables.kernel_block_sizes, tables.state_groups, 1,
                torch.zeros(2, 32, dtype=torch.int64))


def test_reference_uses_the_kernel_sentinel():
    """The pure-torch reference pads with the same PAD_SLOT_ID as the kernel."""
    assert reference.PAD_SLOT_ID == PAD_SLOT_ID == -1
