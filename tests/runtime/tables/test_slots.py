"""Host slot mappings: the kernel-block formula over the device tables equals the page formula on the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runtime_plans import attention_plan, widths_plan

from graphkv.runtime import PAD_SLOT_ID, BlockTables
from graphkv.runtime.ops.reference import slot_mapping_ref
from graphkv.runtime.tables.slots import host_slot_mappings

SEQ_LENS = (1, 54, 97, 232)


def _step(seq_lens, query_lens):
    """query_start_loc, positions and each token's batch row of rows ending at seq_lens."""
    qsl = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(query_lens).cumsum(0)
    positions = torch.cat([torch.arange(n - q, n) for n, q in zip(seq_lens, query_lens)])
    token_batch_row = torch.repeat_interleave(torch.arange(len(seq_lens)), torch.tensor(query_lens))
    return qsl, positions, token_batch_row


def _fill_random_pages(tables: BlockTables, seq_lens, seed):
    """Give row r enough random distinct pages per group for seq_lens[r]."""
    rng = np.random.default_rng(seed)
    free = rng.permutation(np.arange(1, tables.num_blocks))
    taken = 0
    for r, n in enumerate(seq_lens):
        ids = []
        for g, group in enumerate(tables.plan.groups):
            count = 1 if group.is_ssm else min(-(-n // group.block_size), tables.max_pages[g])
            ids.append(free[taken:taken + count].tolist())
            taken += count
        tables.append(r, ids)


def _host_slots(tables, rows, qsl, positions, token_batch_row, max_tokens):
    out = np.full((tables.num_groups, max_tokens), PAD_SLOT_ID, dtype=np.int64)
    host_slot_mappings(tables, rows[token_batch_row.numpy()], positions.numpy(), out)
    return torch.from_numpy(out)


@pytest.mark.parametrize("bpk", [1, 17])
def test_host_slots_equal_the_kernel_block_reference_for_awkward_lengths(bpk):
    """Prefill chunks of lengths 1, 54, 97, 232 get the reference's slots over the per-step kernel-block tables."""
    plan = attention_plan(bpk=bpk, num_blocks=40, max_num_seqs=4, max_num_batched_tokens=512, max_model_len=256)
    tables = BlockTables(plan)
    _fill_random_pages(tables, SEQ_LENS, seed=bpk)
    rows = np.array([2, 0, 3, 1])
    tables.sync(rows, 4)
    seq_lens = [SEQ_LENS[i] for i in rows]
    qsl, positions, token_row = _step(seq_lens, [min(q, n) for q, n in zip((1, 30, 97, 232), seq_lens)])
    got = _host_slots(tables, rows, qsl, positions, token_row, 512)
    want = slot_mapping_ref(qsl, positions, tables.input_tables, [plan.groups[0].kernel_block_size], 4, 512)
    assert torch.equal(got, want)


@pytest.mark.parametrize("seed", [0, 1])
def test_groups_of_different_widths_and_state_groups(seed):
    """Every attention group is read through its own pages and block size; state groups get no slots."""
    plan = widths_plan()
    tables = BlockTables(plan)
    _fill_random_pages(tables, (1, 30, 64, 40), seed)
    rows = np.array([1, 3, 0])
    tables.sync(rows, 3)
    qsl, positions, token_row = _step((30, 40, 1), (4, 6, 1))
    got = _host_slots(tables, rows, qsl, positions, token_row, 32)
    kbs = [g.kernel_block_size for g in plan.groups]
    want = slot_mapping_ref(qsl, positions, tables.input_tables, kbs, 3, 32, [g.is_ssm for g in plan.groups])
    assert torch.equal(got, want)
    assert (got[2] == PAD_SLOT_ID).all()  # documented choice: state groups have no per-token slots
    page = tables.pages_np[0][1, 0]  # row 1 holds positions 26..29 in its first 32-token page
    assert got[0, :4].tolist() == [page * 32 + p for p in range(26, 30)]

