"""Every allocation of a plan's runtime on one device kind, in the order the runtime makes them."""

from __future__ import annotations

from typing import Sequence

from graphkv.plan.allocations.entries import Allocation, Placement
from graphkv.plan.allocations.flex import flex_allocations, flex_sizes, kv_block_stride
from graphkv.plan.allocations.step import ownership_allocations, staging_allocations, step_allocations
from graphkv.plan.allocations.tables import table_allocations
from graphkv.plan.plan import GroupPlan, SlotPlan, StaticBuffers
from graphkv.spec.dtypes import DType
from graphkv.spec.limits import Limits
from graphkv.spec.model import LayerDecl

__all__ = ["pool_allocations", "runtime_allocations"]


def pool_allocations(slots: Sequence[SlotPlan], num_blocks: int) -> list[Allocation]:
    """One raw byte tensor per pool slot: ``num_blocks x page bytes``."""
    return [Allocation(name=f"kv_pool.slot{s.index}", shape=(num_blocks * s.page_size_bytes,), dtype=DType.UINT8,
                       placement=Placement.DEVICE,
                       reason=f"num_blocks {num_blocks} x {s.page_size_bytes} B pages of slot {s.index} "
                              f"({len(s.layers)} layer(s), one per group)")
            for s in slots]


def runtime_allocations(kind: str, *, limits: Limits, groups: Sequence[GroupPlan], slots: Sequence[SlotPlan],
                        layers: Sequence[LayerDecl], num_blocks: int, buffers: StaticBuffers) -> tuple[Allocation, ...]:
    """What ``allocate(plan, device)`` and ``Step(plan, device)`` (its block tables, page ownership,
    staging and flex mask builders) allocate on a device of kind ``kind`` (``"cpu"`` or ``"cuda"``)."""
    seqs, tokens = limits.max_num_seqs, limits.max_num_batched_tokens
    out = pool_allocations(slots, num_blocks)
    out += table_allocations(kind, groups, max_num_seqs=seqs, max_num_batched_tokens=tokens)
    out += ownership_allocations(groups, num_blocks=num_blocks, max_num_seqs=seqs)
    out += staging_allocations(kind, groups, max_num_seqs=seqs, max_num_batched_tokens=tokens)
    out += step_allocations(kind, groups, max_num_batched_tokens=tokens)
    backend_of = {d.index: d.backend for d in layers}
    for g in groups:
        name = f"flex.{g.index}.kv_indices"
        if name not in buffers:
            continue
        tile = max(backend_of[i].q_tile_tokens for i in g.layers if backend_of[i].q_tile_tokens is not None)
        sizes = flex_sizes(kind, g, q_tile_tokens=tile, kv_indices=buffers[name], max_num_seqs=seqs,
                           num_blocks=num_blocks, stride=kv_block_stride(g, slots, layers, num_blocks))
        out += flex_allocations(f"flex.{g.index}", sizes)
    names = [a.name for a in out]
    assert len(set(names)) == len(names), "allocation names are unique"
    return tuple(out)
