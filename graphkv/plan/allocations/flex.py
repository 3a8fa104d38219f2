"""Ledger entries of one flex-attention group's mask builder: its masks, workspace and constants.

Sizes (``S = max_num_seqs``, ``T = max_padded_tokens``, ``W`` = block table width in kernel
blocks, ``Q`` query tiles, ``N`` kernel blocks of the pool, ``K`` columns of ``kv_indices``, ``F =
min(W, searched columns)`` full blocks a tile can have): the masks (partial and full block lists)
take ``4 * (2Q + 2QK + 2T + N)`` bytes, the per-table-entry workspace ``18 * S * W`` (two bool
masks, two int32 bounds and an int64 scatter index), the per-tile counts ``4 * (Q + 2) * N``, the
full-block search ``21 * Q * F`` (three int32, a bool and an int64 per column) and ``30 Q``
per-tile scratch, the per-row and per-token scratch ``13 S + 5 T`` and the constants ``4 * (S + T
+ 2W + Q K + 3Q + 15)``. The large terms — ``18 S W``, ``4 (Q + 2) N`` and the two block lists'
``4 Q K`` each — grow with the pool and the table width. The same function sizes the plan's ledger
and the runtime's :class:`~graphkv.runtime.flex.mask.FlexMaskBuilder`.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from graphkv.plan.allocations.entries import Allocation, AllocationPart, Placement
from graphkv.plan.plan import BufferSpec, GroupPlan, SlotPlan
from graphkv.spec.backends import CacheOrder
from graphkv.spec.dtypes import DType
from graphkv.spec.model import LayerDecl

__all__ = ["FULL_SCALARS", "TILE_CONSTS", "TILE_INTS", "FlexSizes", "flex_allocations", "flex_sizes"]

_I32, _I64, _BOOL = DType.INT32, DType.INT64, DType.BOOL
# Views of the full-block search's per-tile scratch and 0-d constants (graphkv.runtime.flex.full_blocks).
TILE_INTS = ("row", "rowbase", "last", "lmax", "lmin", "first", "count")
TILE_CONSTS = ("tile_last", "tile_window")  # per query tile, written once
FULL_SCALARS = ("zero", "minus_one", "one_minus_kbs", "kernel_block_size", "table_width", "last_entry",
                "last_kernel_block", "kv_block_stride", "full_width")


@attrs.frozen(kw_only=True)
class FlexSizes:
    """The sizes one flex group's buffers depend on."""

    max_num_seqs: int
    max_padded_tokens: int  # query tiles x q_tile: the longest padded step
    block_table_width: int  # kernel blocks per row
    num_q_tiles: int
    num_kernel_blocks: int
    kv_indices_width: int  # columns of kv_indices on the device kind (a CPU: the whole flat view)
    searched_width: int | None = None  # columns the build fills when fewer (a CPU: the plan's width); None: all


def kv_block_stride(group: GroupPlan, slots: Sequence[SlotPlan], layers: Sequence[LayerDecl], num_blocks: int) -> int:
    """Flex kv blocks between consecutive kernel blocks of ``group``'s caches: 1 for a split kv-first
    cache, ``(page bytes / bpk / itemsize) / (kbs x heads x head size)`` for a page-local one (its
    kernel blocks interleave K, V and other layers' bytes). The runtime reads the same number off
    the pool's views (:func:`graphkv.runtime.flex.geometry.plan_kv_block_stride`)."""
    if num_blocks * group.bpk <= 1:
        return 1
    slot_of = {i: s for s in slots for i in s.layers}
    for decl in layers:
        if decl.index not in group.layers:
            continue
        slot = slot_of[decl.index]
        if not slot.page_local or decl.backend.kv_layout.order is not CacheOrder.KV_FIRST:
            return 1
        spec = decl.spec
        elements = slot.page_size_bytes // group.bpk // spec.dtype.itemsize
        return max(1, elements // (group.kernel_block_size * spec.num_kv_heads * spec.head_size))
    return 1


def flex_sizes(kind: str, group: GroupPlan, *, q_tile_tokens: int, kv_indices: BufferSpec, max_num_seqs: int,
               num_blocks: int, stride: int) -> FlexSizes:
    """``group``'s flex sizes on device kind ``kind``: on a CPU ``kv_indices`` spans the whole flat K/V
    view (torch's compiled CPU flex kernel needs it), elsewhere the plan's width."""
    tiles, width = kv_indices.shape
    nkb = num_blocks * group.bpk
    searched = None
    if kind == "cpu" and (nkb - 1) * stride + 1 > width:
        # The kernel reads at most `width` columns of a tile; only those are searched each step, so a
        # step's mask build does not grow with the pool on a CPU either.
        searched, width = width, (nkb - 1) * stride + 1
    return FlexSizes(max_num_seqs=max_num_seqs, max_padded_tokens=tiles * q_tile_tokens,
                     block_table_width=group.block_table_width, num_q_tiles=tiles, num_kernel_blocks=nkb,
                     kv_indices_width=width, searched_width=searched)


def flex_allocations(prefix: str, sizes: FlexSizes) -> list[Allocation]:
    """Every tensor of one mask builder (all on the device), named ``{prefix}.{what}``."""
    s, t, w = sizes.max_num_seqs, sizes.max_padded_tokens, sizes.block_table_width
    q, n, k = sizes.num_q_tiles, sizes.num_kernel_blocks, sizes.kv_indices_width
    searched = k if sizes.searched_width is None else sizes.searched_width
    full = min(w, searched)  # a tile's full blocks are one request's table entries, and listed blocks
    rows = [
        ("kv_num_blocks", (q,), _I32, f"kernel blocks each of the {q} query tiles attends"),
        ("kv_indices", (q, k), _I32, f"the kernel blocks of each query tile, {k} columns"),
        ("full_kv_num_blocks", (q,), _I32, "full blocks of each query tile: seen whole by every query (no mask_mod)"),
        ("full_kv_indices", (q, k), _I32, f"the full blocks of each query tile, {k} columns like kv_indices"),
        ("token_row", (t,), _I32, f"batch row of each packed query token ({t} = {q} tiles, padded)"),
        ("token_pos", (t,), _I32, "position of each packed query token (-1: padding)"),
        ("kernel_block_logical", (n,), _I32, f"logical index of each of the pool's {n} kernel blocks (-1: not live)"),
        ("row_valid", (s,), _BOOL, "workspace: batch rows of the step"),
        ("row_ints", (3, s), _I32, "workspace: first query position, masked query end, last query token per row"),
        ("token_tmp", (t,), _I32, "workspace: per packed token"),
        ("token_pad", (t,), _BOOL, "workspace: padding tokens"),
        ("entry_live", (s, w), _BOOL, f"workspace per table entry ({s} rows x {w} kernel blocks): live entries"),
        ("entry_tmp", (s, w), _BOOL, "workspace per table entry: comparisons"),
        ("entry_lo", (s, w), _I32, "workspace per table entry: first query token needing it"),
        ("entry_hi", (s, w), _I32, "workspace per table entry: logical index, then last query token needing it"),
        ("entry_index", (s, w), _I64, "workspace per table entry: scatter index (torch's scatter ops take int64)"),
        ("tile_ints", (len(TILE_INTS), q), _I32, "workspace per query tile: first row, its first table entry, last "
                                                 "query, full range's bounds (logical, then table entries), length"),
        ("tile_flags", (2, q), _BOOL, "workspace per query tile: several requests or padding, whole range read back"),
        ("full_ints", (3, q, full), _I32, f"workspace per (query tile, full-list column), {full} columns: table "
                                          "entry, kernel block, logical index it is read at"),
        ("full_read_back", (q, full), _BOOL, "workspace per (query tile, full-list column): read at its own index"),
        ("full_index", (q, full), _I64, "workspace per (query tile, full-list column): (tile, kernel block) index "
                                        "cleared from the partial counts"),
        ("tile_counts", (q + 2, n), _I32, "per (query tile, kernel block): difference array, then ranks; a step over "
                                          "t tiles dumps dead entries in row t + 1"),
        ("row_ids", (s,), _I32, "constant 0 .. max_num_seqs - 1"),
        ("token_ids", (t,), _I32, "constant 0 .. max_padded_tokens - 1"),
        ("logical_ids", (2, w), _I32, "constants: logical index and first token of each table column"),
        ("ranks", (q, searched), _I32, "constant 1 .. searched kv_indices columns per tile (the batched binary "
                                       "search's targets)"),
        ("dump_index", (q + 2,), _I32, "constant: first (tile, kernel block) index of each tile's dump row"),
        ("tile_consts", (2, q), _I32, "constants per query tile: its last token, and -(its first token) - window"),
        ("full_scalars", (len(FULL_SCALARS),), _I32, "0-d constants of the full-block search: " +
                                                     ", ".join(FULL_SCALARS)),
        ("scalars", (4,), _I32, "0-d values: the step's request count, +1, -1 and INT32_MAX"),
    ]
    if searched < k:
        rows.append(("kv_indices_searched", (q, searched), _I32,
                     f"scratch: the {searched} columns a tile may use, searched each step (kv_indices is wider "
                     "for the CPU kernel)"))
    return [Allocation(name=f"{prefix}.{name}", shape=shape, dtype=dtype, placement=Placement.DEVICE, reason=why,
                       parts=_parts(name, shape))
            for name, shape, dtype, why in rows]


def _parts(name: str, shape: tuple[int, ...]) -> tuple[AllocationPart, ...]:
    if name == "row_ints":
        s = shape[1]
        return tuple(AllocationPart(name=p, offset=i * s, shape=(s,)) for i, p in enumerate(("row_ctx", "row_ends",
                                                                                              "row_last")))
    if name in ("tile_ints", "tile_consts"):
        q = shape[1]
        names = TILE_INTS if name == "tile_ints" else TILE_CONSTS
        return tuple(AllocationPart(name=p, offset=i * q, shape=(q,)) for i, p in enumerate(names))
    if name == "full_scalars":  # 0-d each
        return tuple(AllocationPart(name=p, offset=i, shape=()) for i, p in enumerate(FULL_SCALARS))
    if name == "logical_ids":
        w = shape[1]
        return (AllocationPart(name="logical_ids", offset=0, shape=(w,)),
                AllocationPart(name="logical_start", offset=w, shape=(w,)))
    if name == "scalars":
        return tuple(AllocationPart(name=p, offset=i, shape=()) for i, p in enumerate(("num_reqs", "plus_one",
                                                                                      "minus_one", "int32_max")))
    return ()
