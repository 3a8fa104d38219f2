"""Block-table kernels: apply staged row writes (one launch per step) and gather per-step tables.

Every group's table is ``[max_num_seqs, width_g] int32`` with its own width; the tables of all
groups are packed back to back in one flat buffer (:class:`PackedTables`), so one launch covers
all groups: a program reads its group's offset and width from two small device arrays.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import torch
import triton
import triton.language as tl

from graphkv.errors import Problem, SpecError

__all__ = ["PackedTables", "apply_row_writes", "check_apply_row_writes", "check_gather_rows", "gather_rows"]


@attrs.frozen(kw_only=True, eq=False)
class PackedTables:
    """Per-group ``[num_rows, width_g] int32`` tables packed in one flat device buffer."""

    flat: torch.Tensor  # [sum_g num_rows * width_g] int32
    tables: tuple[torch.Tensor, ...]  # views [num_rows, width_g] of ``flat``
    offsets: torch.Tensor  # [num_groups] int64, element offset of each table in ``flat``
    widths: torch.Tensor  # [num_groups] int32
    num_rows: int

    @classmethod
    def zeros(cls, num_rows: int, widths: Sequence[int], device: "str | torch.device") -> "PackedTables":
        """Allocate zeroed tables (every entry points at the null page 0)."""
        starts = [0]
        for w in widths:
            starts.append(starts[-1] + num_rows * w)
        flat = torch.zeros(starts[-1], dtype=torch.int32, device=device)
        tables = tuple(flat[s:s + num_rows * w].view(num_rows, w) for s, w in zip(starts, widths))
        return cls(flat=flat, tables=tables, num_rows=num_rows,
                   offsets=torch.tensor(starts[:-1], dtype=torch.int64, device=device),
                   widths=torch.tensor(list(widths), dtype=torch.int32, device=device))

    @property
    def num_groups(self) -> int:
        """Number of packed tables."""
        return len(self.tables)


@triton.jit
def _apply_row_writes_kernel(
    flat_ptr,  # [total] int32, packed tables
    staged_ptr,  # [2 * num_segments + 1 + num_values] int64: dst offsets, value starts (cumulative), values
    NUM_SEGMENTS,
    TILE: tl.constexpr,
):
    seg = tl.program_id(0).to(tl.int64)
    dst = tl.load(staged_ptr + seg)
    begin = tl.load(staged_ptr + NUM_SEGMENTS + seg)
    end = tl.load(staged_ptr + NUM_SEGMENTS + seg + 1)
    values_ptr = staged_ptr + 2 * NUM_SEGMENTS + 1
    for start in range(begin, end, TILE):
        idx = start + tl.arange(0, TILE).to(tl.int64)
        in_segment = idx < end
        vals = tl.load(values_ptr + idx, mask=in_segment, other=0)
        tl.store(flat_ptr + dst + (idx - begin), vals.to(tl.int32), mask=in_segment)


def check_apply_row_writes(tables: PackedTables, staged: torch.Tensor) -> None:
    """Raise :class:`SpecError` unless ``staged`` is int64 on the tables' device (the argument
    check of :func:`apply_row_writes`, shared by every implementation)."""
    if staged.dtype != torch.int64 or staged.device != tables.flat.device:
        raise SpecError(Problem(field="staged", value=(staged.dtype, staged.device),
                                limit=f"must be int64 on {tables.flat.device}",
                                fix="stage writes through BlockTables.commit()"))


def apply_row_writes(tables: PackedTables, staged: torch.Tensor, num_segments: int) -> None:
    """Apply ``num_segments`` contiguous writes in one launch. ``staged``: ``[>= 2 * S + 1 + V]
    int64`` on the tables' device holding ``S`` destination offsets into ``tables.flat``, ``S + 1``
    cumulative value starts, then the ``V`` values. Capture-safe (no allocation)."""
    check_apply_row_writes(tables, staged)
    if num_segments == 0:
        return
    _apply_row_writes_kernel[(num_segments,)](tables.flat, staged, num_segments, TILE=256)


@triton.jit
def _gather_rows_kernel(
    src_ptr,  # [total] int32, packed persistent tables
    dst_ptr,  # [total] int32, packed per-step input tables (same packing)
    offsets_ptr,  # [num_groups] int64
    widths_ptr,  # [num_groups] int32
    idx_mapping_ptr,  # [num_reqs] int32, batch row -> persistent row
    NUM_REQS,
    NUM_ROWS,
    TILE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    base = tl.load(offsets_ptr + group)
    width = tl.load(widths_ptr + group).to(tl.int64)
    is_real = row < NUM_REQS
    src_row = tl.load(idx_mapping_ptr + row, mask=is_real, other=0).to(tl.int64)
    # Padding rows (row >= NUM_REQS) and out-of-range persistent rows read nothing and get the
    # null page 0. (Scalar conditions are folded into a vector bound: the interpreter turns
    # ``vector_bool & scalar_bool`` into an int mask.)
    is_real = is_real & (src_row >= 0) & (src_row < NUM_ROWS)
    copy_width = tl.where(is_real, width, 0)
    for start in range(0, width, TILE):
        col = start + tl.arange(0, TILE).to(tl.int64)
        in_row = col < width
        vals = tl.load(src_ptr + base + src_row * width + col, mask=col < copy_width, other=0)
        tl.store(dst_ptr + base + row * width + col, vals, mask=in_row)


def check_gather_rows(src: PackedTables, dst: PackedTables, idx_mapping: torch.Tensor, num_reqs_padded: int) -> None:
    """Raise :class:`SpecError` unless the arguments of :func:`gather_rows` fit together (``dst``
    packed like ``src``, ``idx_mapping`` 1-D int32 on their device, ``num_reqs <= num_reqs_padded
    <= max_num_seqs``); shared by every implementation."""
    if src.flat.shape != dst.flat.shape or src.num_groups != dst.num_groups:
        raise SpecError(Problem(field="dst", value=tuple(dst.flat.shape),
                                limit=f"must pack like src {tuple(src.flat.shape)}",
                                fix="allocate both with PackedTables.zeros(num_rows, widths)"))
    if idx_mapping.dim() != 1 or idx_mapping.dtype != torch.int32 or idx_mapping.device != src.flat.device:
        raise SpecError(Problem(field="idx_mapping", value=(tuple(idx_mapping.shape), idx_mapping.dtype),
                                limit=f"must be a 1-D int32 tensor on {src.flat.device}",
                                fix="pass the persistent idx_mapping buffer sliced to [:num_reqs]"))
    num_reqs = idx_mapping.shape[0]
    if not num_reqs <= num_reqs_padded <= src.num_rows:
        raise SpecError(Problem(field="num_reqs_padded", value=num_reqs_padded,
                                limit=f"must satisfy num_reqs={num_reqs} <= num_reqs_padded <= "
                                      f"max_num_seqs={src.num_rows}",
                                fix="pad the batch to a captured size no larger than max_num_seqs"))


def gather_rows(src: PackedTables, dst: PackedTables, idx_mapping: torch.Tensor, num_reqs_padded: int) -> None:
    """``dst.tables[g][i] = src.tables[g][idx_mapping[i]]`` for ``i < num_reqs`` and null page 0
    for ``num_reqs <= i < num_reqs_padded``, all groups in one launch. ``idx_mapping``: ``[num_reqs]
    int32`` on the tables' device. Rows past ``num_reqs_padded`` are left as they are.
    Capture-safe (no allocation, no host sync)."""
    check_gather_rows(src, dst, idx_mapping, num_reqs_padded)
    num_reqs = idx_mapping.shape[0]
    if num_reqs_padded == 0:
        return
    _gather_rows_kernel[(num_reqs_padded, src.num_groups)](src.flat, dst.flat, src.offsets, src.widths, idx_mapping,
                                                           num_reqs, src.num_rows, TILE=256)
