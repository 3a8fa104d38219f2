"""Ledger entries of the block tables: the host mirror and the device tables, per device kind.

The host mirror (pages per request row and group, numpy) is the single source of truth; the device
holds the tables in kernel blocks. How many copies that takes depends on the device:

- **CPU** (:class:`~graphkv.runtime.tables.host_sync.HostSync`): the device is the host. The
  step's rows (what attention reads) are one copy; with one kernel block per page everywhere the
  persistent tables *are* the mirror (one buffer, two halves); otherwise the mirror is kept in
  pages and nothing else — the persistent kernel-block tables are not kept, since nothing on the
  step path reads them. Two copies either way.
- **CUDA** (:class:`~graphkv.runtime.tables.staged_sync.StagedSync`): the mirror on the host, and
  on the device the persistent rows plus the step's rows. Three copies: the persistent rows let a
  batch whose rows changed be gathered on the device in one launch instead of sent again from the
  host. Stale columns travel as page entries through a fixed pinned staging buffer.
"""

from __future__ import annotations

from typing import Sequence

from graphkv.plan.allocations.entries import Allocation, AllocationPart, Placement
from graphkv.plan.plan import GroupPlan
from graphkv.spec._checks import cdiv
from graphkv.spec.dtypes import DType

__all__ = ["staged_entry_capacity", "table_allocations"]

_I32, _I64 = DType.INT32, DType.INT64
DEVICE, PINNED, HOST = Placement.DEVICE, Placement.PINNED, Placement.HOST


def staged_entry_capacity(groups: Sequence[GroupPlan], max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Page entries one staged write carries (CUDA): every page one full step can append — per group,
    a new page for every request plus one per ``block_size`` tokens of the step — in the persistent
    rows and the step's rows. Larger commits (rows truncated or moved) are written in several launches."""
    return 2 * sum(max_num_seqs + cdiv(max_num_batched_tokens, g.block_size) for g in groups)


def table_allocations(kind: str, groups: Sequence[GroupPlan], *, max_num_seqs: int, max_num_batched_tokens: int
                      ) -> list[Allocation]:
    """Every block-table allocation of ``groups`` on device kind ``kind`` (``"cpu"`` or ``"cuda"``)."""
    seqs, tokens, num_groups = max_num_seqs, max_num_batched_tokens, len(groups)
    entries = seqs * sum(g.block_table_width for g in groups)  # kernel blocks of one packing of every group
    mirror = seqs * sum(g.pages_per_request for g in groups)
    widths = " + ".join(str(g.block_table_width) for g in groups)
    per_packing = f"max_num_seqs {seqs} x ({widths}) kernel blocks"
    out: list[Allocation] = []
    aliased = kind == "cpu" and all(g.bpk == 1 for g in groups)
    if kind == "cuda" or aliased:
        persistent = ("persistent rows (by request)" if kind == "cuda"
                      else "the host mirror (one kernel block per page: it is the persistent table)")
        why_persistent = ("; the persistent rows let a batch whose rows changed be gathered on the device"
                          if kind == "cuda" else "")
        out.append(Allocation(
            name="tables.device", shape=(2 * entries,), dtype=_I32, placement=DEVICE,
            parts=(AllocationPart(name="persistent", offset=0, shape=(entries,)),
                   AllocationPart(name="step_rows", offset=entries, shape=(entries,))),
            reason=f"{persistent} then the step's rows (by batch row), {per_packing} each{why_persistent}"))
    else:
        out.append(Allocation(name="tables.step_rows", shape=(entries,), dtype=_I32, placement=DEVICE,
                              reason=f"the step's rows, {per_packing}; no persistent kernel-block copy on a CPU "
                                     "(nothing on the step path reads it)"))
    out.append(Allocation(name="tables.group_offsets", shape=(num_groups,), dtype=_I64, placement=DEVICE,
                          reason=f"element offset of each of the {num_groups} group tables in a packing"))
    out.append(Allocation(name="tables.group_widths", shape=(num_groups,), dtype=_I32, placement=DEVICE,
                          reason="kernel blocks per row of each group table"))
    if kind == "cpu":
        bpks = [g.bpk for g in groups]
        out.append(Allocation(
            name="tables.kernel_block_offsets", shape=(sum(bpks),), dtype=_I32, placement=DEVICE,
            parts=tuple(AllocationPart(name=str(g.index), offset=sum(bpks[:i]), shape=(g.bpk,))
                        for i, g in enumerate(groups)),
            reason="0 .. bpk - 1 per group: a page expands to kernel blocks page * bpk + k in one broadcast add"))
    if not aliased:
        out.append(Allocation(name="tables.mirror", shape=(mirror,), dtype=_I32, placement=HOST,
                              reason=(f"host mirror in pages, the source of truth: max_num_seqs {seqs} x ("
                                      + " + ".join(str(g.pages_per_request) for g in groups) + ") pages per request")))
    host = [
        ("num_pages", (num_groups, seqs), _I32, f"pages each of the {seqs} request rows holds, per group"),
        ("group_ints", (2, num_groups), _I64, "per group: where its rows start in the mirror, pages per row"),
        ("arange", (max(seqs, tokens),), _I64,
         f"0 .. max(max_num_seqs {seqs}, max_num_batched_tokens {tokens}) - 1: index arithmetic without a per-step "
         "arange (block tables and step metadata share it)"),
        ("batch_row_of", (seqs,), _I64, "the step row showing each request row (-1: none)"),
        ("shown_rows", (seqs,), _I64, "the request row each step row shows"),
    ]
    out += [Allocation(name=f"tables.{name}", shape=shape, dtype=dtype, placement=HOST, reason=reason)
            for name, shape, dtype, reason in host]
    if kind == "cuda":
        capacity = staged_entry_capacity(groups, seqs, tokens)
        staged = (f"{capacity} page entries (destination, first kernel block, bpk) of one write: "
                  f"2 x sum over groups of (max_num_seqs {seqs} + cdiv({tokens} tokens, block_size))")
        out += [
            Allocation(name="tables.staged", shape=(3 * capacity,), dtype=_I64, placement=DEVICE, reason=staged),
            Allocation(name="tables.staged_host", shape=(3 * capacity,), dtype=_I64, placement=PINNED,
                       reason="pinned twin of tables.staged (asynchronous copy)"),
            Allocation(name="tables.idx_mapping", shape=(seqs,), dtype=_I32, placement=DEVICE,
                       reason="batch row -> request row of a gather"),
            Allocation(name="tables.idx_mapping_host", shape=(seqs,), dtype=_I32, placement=PINNED,
                       reason="pinned twin of tables.idx_mapping"),
            Allocation(name="tables.device_pages", shape=(num_groups, seqs), dtype=_I32, placement=HOST,
                       reason="pages the device's persistent row holds, per group and request row"),
            Allocation(name="tables.stale_from", shape=(num_groups, seqs), dtype=_I32, placement=HOST,
                       reason="first page column the device no longer matches, per group and request row"),
            Allocation(name="tables.staged_group_ints", shape=(4, num_groups), dtype=_I64, placement=HOST,
                       reason="per group: first entry of its persistent rows and of its step rows on the device, "
                              "kernel blocks per row, kernel blocks per page"),
        ]
    return out
