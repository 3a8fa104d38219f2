"""Block-table kernels: write staged page entries (one launch per step) and gather per-step tables.

Every group's table is ``[max_num_seqs, width_g] int32`` with its own width; the tables of all
groups are packed back to back in one flat buffer (:class:`PackedTables`), so one launch covers
all groups. :func:`write_pages` writes page entries (each expanded to its ``bpk`` kernel blocks)
at host-computed offsets, so one launch also covers several packings viewing one buffer (the
persistent rows and the per-step rows of :class:`graphkv.runtime.BlockTables`);
:func:`gather_rows` reads each group's offset and width from two small device arrays.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import torch
import triton
import triton.language as tl

from graphkv.errors import Problem, SpecError
from graphkv.kernels.launch import device_kernel

__all__ = ["PackedTables", "check_gather_rows", "check_write_pages", "gather_rows", "write_pages"]


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
        flat = torch.zeros(num_rows * sum(widths), dtype=torch.int32, device=device)
        return cls.view_of(flat, num_rows, widths)

    @classmethod
    def view_of(cls, flat: torch.Tensor, num_rows: int, widths: Sequence[int],
                index: "tuple[torch.Tensor, torch.Tensor] | None" = None) -> "PackedTables":
        """Tables packed in ``flat`` (``[num_rows * sum(widths)] int32``, e.g. a slice of a larger
        buffer that one :func:`write_pages` launch covers together with other tables). ``index``:
        the ``[num_groups] int64`` offsets and ``[num_groups] int32`` widths tensors to fill and use
        (e.g. the plan's ledger entries, shared by packings of one layout); new ones by default."""
        starts = [0]
        for w in widths:
            starts.append(starts[-1] + num_rows * w)
        assert flat.dtype == torch.int32 and flat.numel() == starts[-1], "flat must hold every table exactly"
        tables = tuple(flat[s:s + num_rows * w].view(num_rows, w) for s, w in zip(starts, widths))
        if index is None:
            index = (torch.empty(len(widths), dtype=torch.int64, device=flat.device),
                     torch.empty(len(widths), dtype=torch.int32, device=flat.device))
        offsets, width_t = index
        assert offsets.shape == width_t.shape == (len(widths),), "one offset and one width per group"
        offsets.copy_(torch.tensor(starts[:-1], dtype=torch.int64))
        width_t.copy_(torch.tensor(list(widths), dtype=torch.int32))
        return cls(flat=flat, tables=tables, num_rows=num_rows, offsets=offsets, widths=width_t)

    @property
    def num_groups(self) -> int:
        """Number of packed tables."""
        return len(self.tables)


@device_kernel(do_not_specialize=("NUM_ENTRIES",))  # launched per step, outside graphs
def _write_pages_kernel(
    flat_ptr,  # [total] int32, packed tables (kernel blocks)
    staged_ptr,  # [3 * num_entries] int64: destination offsets | first kernel block (-1: null page) | bpk
    NUM_ENTRIES,
    TILE_E: tl.constexpr,  # entries per program
    MAX_BPK: tl.constexpr,  # power of two >= every entry's bpk
):
    entry = tl.program_id(0).to(tl.int64) * TILE_E + tl.arange(0, TILE_E).to(tl.int64)  # [TILE_E]
    is_entry = entry < NUM_ENTRIES
    dst = tl.load(staged_ptr + entry, mask=is_entry, other=0)
    first = tl.load(staged_ptr + NUM_ENTRIES + entry, mask=is_entry, other=-1)
    bpk = tl.load(staged_ptr + 2 * NUM_ENTRIES + entry, mask=is_entry, other=0)
    k = tl.arange(0, MAX_BPK).to(tl.int64)  # [MAX_BPK]
    # A page entry writes kernel blocks first .. first + bpk - 1; a null entry writes bpk zeros.
    values = tl.where(first[:, None] < 0, 0, first[:, None] + k[None, :])
    in_page = is_entry[:, None] & (k[None, :] < bpk[:, None])
    tl.store(flat_ptr + dst[:, None] + k[None, :], values.to(tl.int32), mask=in_page)


def check_write_pages(flat: torch.Tensor, staged: torch.Tensor, num_entries: int) -> None:
    """Raise :class:`SpecError` unless ``flat`` is int32 and ``staged`` an int64 tensor on its
    device holding ``3 * num_entries`` values (the argument check of :func:`write_pages`, shared by
    every implementation)."""
    if flat.dtype != torch.int32:
        raise SpecError(Problem(field="flat", value=flat.dtype, limit="must be the int32 buffer of packed tables",
                                fix="pass PackedTables.flat (or the buffer several PackedTables view)"))
    if staged.dtype != torch.int64 or staged.device != flat.device or staged.numel() < 3 * num_entries:
        raise SpecError(Problem(field="staged", value=(staged.dtype, staged.device, staged.numel()),
                                limit=f"must be int64 on {flat.device} with >= 3 * num_entries = "
                                      f"{3 * num_entries} values",
                                fix="stage page writes through BlockTables (commit / sync)"))


def write_pages(flat: torch.Tensor, staged: torch.Tensor, num_entries: int, max_bpk: int) -> None:
    """Apply ``num_entries`` page writes in one launch into ``flat`` (``[total] int32``, packed
    tables). ``staged``: ``[>= 3 * E] int64`` on its device: ``E`` destination offsets into
    ``flat``, ``E`` first kernel blocks (``page * bpk``, or ``-1`` for the null page, which writes
    zeros) and ``E`` kernel blocks per page; entry ``e`` writes ``first_e + k`` (or 0) at ``dst_e
    + k`` for ``k < bpk_e <= max_bpk``. Capture-safe (no allocation, no host sync).

    >>> write_pages(tables.flat, staged, num_entries=len(dst), max_bpk=17)
    """
    check_write_pages(flat, staged, num_entries)
    if num_entries == 0:
        return
    tile = 64
    _write_pages_kernel[(triton.cdiv(num_entries, tile),)](flat, staged, num_entries, TILE_E=tile,
                                                           MAX_BPK=triton.next_power_of_2(max(max_bpk, 1)))


@device_kernel(do_not_specialize=("NUM_REQS",))  # launched per step, outside graphs
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
