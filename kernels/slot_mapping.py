"""Slot mapping: the cache slot of every token of a step, for every KV-cache group, in one launch.

For group ``g`` and token ``t`` of batch row ``r`` at position ``p``::

    slot = table_g[r, p // kbs_g] * kbs_g + p % kbs_g      (kernel-block units)

which equals ``page_table[r, p // block_size] * block_size + p % block_size`` (whole pages), since
page ``b`` is kernel blocks ``b * bpk ..``. Tokens past the step's last real token, up to the
buffer size, get :data:`PAD_SLOT_ID` inside the kernel (no host-side fill). State (Mamba) groups
get :data:`PAD_SLOT_ID` for every token: they have no per-token slots, and their state page is
column 0 of their gathered table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphkv.errors import Problem, SpecError
from graphkv.kernels.block_tables import PackedTables
from graphkv.runtime.padding import PAD_SLOT_ID

__all__ = ["PAD_SLOT_ID", "check_compute_slot_mappings", "compute_slot_mappings"]


@triton.jit
def _slot_mapping_kernel(
    tables_ptr,  # [total] int32, packed per-step tables [max_num_seqs, width_g] per group, kernel blocks
    offsets_ptr,  # [num_groups] int64, element offset of each group's table
    widths_ptr,  # [num_groups] int32
    kernel_block_sizes_ptr,  # [num_groups] int32
    state_groups_ptr,  # [num_groups] int32, 1: state group (all slots padding)
    query_start_loc_ptr,  # [>= num_reqs + 1] int32
    positions_ptr,  # [>= num_tokens] int64
    out_ptr,  # [num_groups, max_num_batched_tokens] int64
    out_stride,
    NUM_REQS,
    NUM_POSITIONS,
    MAX_NUM_TOKENS,
    PAD_SLOT: tl.constexpr,
    TILE: tl.constexpr,
):
    group = tl.program_id(0)
    req = tl.program_id(1)
    out_row = out_ptr + group.to(tl.int64) * out_stride
    if req == NUM_REQS:
        # One extra program per group pads the tail of the persistent buffer.
        tail = tl.load(query_start_loc_ptr + NUM_REQS).to(tl.int64)
        for start in range(tail, MAX_NUM_TOKENS, TILE):
            tok = start + tl.arange(0, TILE).to(tl.int64)
            is_tail = tok < MAX_NUM_TOKENS
            tl.store(out_row + tok, tl.full([TILE], PAD_SLOT, tl.int64), mask=is_tail)
    else:
        base = tl.load(offsets_ptr + group)
        width = tl.load(widths_ptr + group).to(tl.int64)
        kbs = tl.load(kernel_block_sizes_ptr + group).to(tl.int64)
        # A state group has no slots: an empty table width makes every token padding.
        slot_width = tl.where(tl.load(state_groups_ptr + group) == 0, width, 0)
        row_ptr = tables_ptr + base + req.to(tl.int64) * width
        q_start = tl.load(query_start_loc_ptr + req).to(tl.int64)
        q_end = tl.load(query_start_loc_ptr + req + 1).to(tl.int64)
        for start in range(q_start, q_end, TILE):
            tok = start + tl.arange(0, TILE).to(tl.int64)
            is_token = (tok < q_end) & (tok < MAX_NUM_TOKENS)
            has_pos = is_token & (tok < NUM_POSITIONS)
            pos = tl.load(positions_ptr + tok, mask=has_pos, other=-1).to(tl.int64)
            col = pos // kbs
            in_table = has_pos & (pos >= 0) & (col < slot_width)
            kernel_block = tl.load(row_ptr + col, mask=in_table, other=0).to(tl.int64)
            slot = tl.where(in_table, kernel_block * kbs + pos % kbs, PAD_SLOT)
            tl.store(out_row + tok, slot, mask=is_token)


def check_compute_slot_mappings(query_start_loc: torch.Tensor, positions: torch.Tensor, tables: PackedTables,
                                kernel_block_sizes: torch.Tensor, state_groups: torch.Tensor, num_reqs: int,
                                out: torch.Tensor) -> None:
    """Raise :class:`SpecError` unless the arguments of :func:`compute_slot_mappings` have its
    dtypes, shapes and device (shared by every implementation)."""
    device = tables.flat.device
    num_groups = tables.num_groups
    checks = (
        ("query_start_loc", query_start_loc, torch.int32, (num_reqs + 1,)),
        ("positions", positions, torch.int64, (0,)),
        ("kernel_block_sizes", kernel_block_sizes, torch.int32, (num_groups,)),
        ("state_groups", state_groups, torch.int32, (num_groups,)),
    )
    for name, t, dtype, min_shape in checks:
        if t.dim() != 1 or t.dtype != dtype or t.device != device or t.shape[0] < min_shape[0]:
            raise SpecError(Problem(field=name, value=(tuple(t.shape), t.dtype, str(t.device)),
                                    limit=f"must be a 1-D {dtype} tensor on {device} with >= {min_shape[0]} entries",
                                    fix=f"pass the persistent {name} buffer"))
    if out.dim() != 2 or out.shape[0] != num_groups or out.dtype != torch.int64 or out.device != device \
            or out.stride(1) != 1:
        raise SpecError(Problem(field="out", value=(tuple(out.shape), out.dtype),
                                limit=f"must be [num_groups={num_groups}, max_num_batched_tokens] int64 with "
                                      f"contiguous rows on {device}",
                                fix="pass the persistent slot_mapping buffer"))
    if not 0 <= num_reqs <= tables.num_rows:
        raise SpecError(Problem(field="num_reqs", value=num_reqs, limit=f"must be in [0, {tables.num_rows}]",
                                fix="pass the number of real batch rows"))


def compute_slot_mappings(query_start_loc: torch.Tensor, positions: torch.Tensor, tables: PackedTables,
                          kernel_block_sizes: torch.Tensor, state_groups: torch.Tensor, num_reqs: int,
                          out: torch.Tensor) -> torch.Tensor:
    """Fill ``out`` ``[num_groups, max_num_batched_tokens] int64`` with every group's slots.

    ``query_start_loc``: ``[>= num_reqs + 1] int32`` (tokens of batch row ``r`` are
    ``query_start_loc[r] .. query_start_loc[r + 1]``); ``positions``: ``[>= num_tokens] int64``;
    ``tables``: the gathered per-step tables (row ``r`` = batch row ``r``), kernel blocks;
    ``kernel_block_sizes`` / ``state_groups``: ``[num_groups] int32``. Tokens from
    ``query_start_loc[num_reqs]`` to the end of ``out`` get ``PAD_SLOT_ID``; so do tokens whose
    position is negative, missing from ``positions`` or past the table (nothing is read or
    written out of bounds). Capture-safe. Returns ``out``.
    """
    check_compute_slot_mappings(query_start_loc, positions, tables, kernel_block_sizes, state_groups, num_reqs, out)
    grid = (tables.num_groups, num_reqs + 1)
    _slot_mapping_kernel[grid](tables.flat, tables.offsets, tables.widths, kernel_block_sizes, state_groups,
                               query_start_loc, positions, out, out.stride(0), num_reqs, positions.shape[0],
                               out.shape[1],
                               PAD_SLOT=PAD_SLOT_ID, TILE=128)
    return out
