"""Step 7: attribute every byte of the KV budget, and list what is allocated beside it.

The pool's pages are shared by all groups, so the split is stated at the plan's design point:
``max_concurrency`` requests of ``max_model_len`` tokens, each holding its worst-case pages in
every group. Per group, those pages' bytes split into real KV data, page padding (Mamba states
padded up to the attention page) and empty slots (a group with fewer layers than ``gs``).

Beside the pool: the CUDA step's static device buffers (their tensor bytes), the allocator rounding
(what PyTorch's caching allocator reserves beyond the pool's and the static buffers' tensors — whole
segments, :meth:`~graphkv.plan.ledger_entries.Ledger.cuda_memory`'s reserved minus tensor bytes),
the lazy workspaces (PyTorch's cuBLAS workspaces, one set per stream that runs matmuls:
:mod:`~graphkv.plan.allocations.blas_workspaces`), the host buffers (host memory) and the estimated graph pool. The device entries sum to
:attr:`~graphkv.plan.ledger_entries.Ledger.beside_pool_device_bytes`, which
:func:`graphkv.plan.gpu_fit.compile_for_gpu` fits beside the pool.
"""

from __future__ import annotations

from typing import Sequence

from graphkv.plan.allocations.blas_workspaces import BlasWorkspaces
from graphkv.plan.allocations.entries import Allocation, CudaMemory, Placement
from graphkv.plan.graph_pool import GraphKeyEstimate
from graphkv.plan.plan import Capacity, GroupPlan, Ledger, LedgerEntry, SlotPlan

__all__ = ["build_ledger"]

def build_ledger(*, budget_bytes: int, capacity: Capacity, groups: Sequence[GroupPlan], slots: Sequence[SlotPlan],
                 cpu_allocations: tuple[Allocation, ...], cuda_allocations: tuple[Allocation, ...],
                 graph_keys: tuple[GraphKeyEstimate, ...], graph_pool_reason: str,
                 blas: BlasWorkspaces) -> Ledger:
    """Every byte of ``budget_bytes`` attributed; the runtime's static and host buffers on a GPU
    (from ``cuda_allocations``), the caching allocator's rounding of the pool and the static buffers,
    PyTorch's lazy cuBLAS workspaces (``blas``) and the graph pool (the sum of ``graph_keys``)
    listed beside it."""
    ppb = capacity.pool_bytes_per_block
    conc = capacity.max_concurrency
    entries: list[LedgerEntry] = []
    used_pages = 0
    for g in groups:
        pages = conc * g.pages_per_request
        used_pages += pages
        n_layers = len(g.layers)
        data = pages * sum(g.layer_real_page_bytes)
        padding = pages * sum(s.page_size_bytes - real for s, real in zip(slots, g.layer_real_page_bytes))
        empty = pages * sum(s.page_size_bytes for s in slots[n_layers:])
        if not n_layers:  # a pipeline stage without this group's layers still hands out its pages
            entries.append(LedgerEntry(name=f"group {g.index} empty slots", nbytes=empty, in_kv_budget=True,
                                       reason=f"{pages} pages x {len(slots)} slot(s): the group has no layer on this "
                                              "pipeline stage, but every request still gets its pages"))
            continue
        why = f"{conc} requests x {g.pages_per_request} page(s) x {n_layers} layer(s)"
        if len(set(g.layer_real_page_bytes)) == 1:
            real_reason = f"{why} x {g.real_page_size_bytes} B real page"
        else:  # one group of layers with different page sizes (a slot each)
            real_reason = f"{why} of different sizes, {sum(g.layer_real_page_bytes)} B real per page index"
        entries.append(LedgerEntry(name=f"group {g.index} {g.kind.value} KV", nbytes=data, in_kv_budget=True,
                                   reason=real_reason))
        if padding:
            entries.append(LedgerEntry(name=f"group {g.index} page padding", nbytes=padding, in_kv_budget=True,
                                       reason=f"{why} x {g.page_size_bytes - g.real_page_size_bytes} B padding per page"))
        if empty:
            entries.append(LedgerEntry(name=f"group {g.index} empty slots", nbytes=empty, in_kv_budget=True,
                                       reason=f"{conc * g.pages_per_request} pages x {len(slots) - n_layers} slots this "
                                              f"group has no layer for (gs={len(slots)})"))
    spare = capacity.usable_pages - used_pages
    entries.append(LedgerEntry(name="null page", nbytes=ppb, in_kv_budget=True,
                               reason="page 0: padding rows of block tables point at it; never handed out"))
    if spare:
        entries.append(LedgerEntry(name="spare pages", nbytes=spare * ppb, in_kv_budget=True,
                                   reason=f"{spare} usable pages left after {conc} max-length requests "
                                          "(less than one more; shorter requests use them)"))
    remainder = budget_bytes - capacity.num_blocks * ppb
    if remainder:
        entries.append(LedgerEntry(name="unallocated remainder", nbytes=remainder, in_kv_budget=True,
                                   reason=f"budget left over after {capacity.num_blocks} whole pages of {ppb} B"))
    beside = [a for a in cuda_allocations if not a.name.startswith("kv_pool.")]
    on_device = [a for a in beside if a.placement is Placement.DEVICE]
    on_host = [a for a in beside if a.placement is not Placement.DEVICE]
    owners = ", ".join(dict.fromkeys(a.owner for a in on_device))
    entries.append(LedgerEntry(name="static buffers", nbytes=sum(a.nbytes for a in on_device), in_kv_budget=False,
                               reason=f"{len(on_device)} persistent device buffers of a CUDA step ({owners}); "
                                      "ledger.allocations('cuda') lists each"))
    memory = CudaMemory.of(cuda_allocations)
    pool_extra = memory.pool.reserved_bytes - memory.pool.tensor_bytes
    static_extra = memory.static_buffers.reserved_bytes - memory.static_buffers.tensor_bytes
    inside = ", in what the pool's segments left" if static_extra < 0 else ""
    entries.append(LedgerEntry(name="allocator rounding", nbytes=pool_extra + static_extra, in_kv_budget=False,
                               reason=f"the CUDA caching allocator's segments beyond the tensors (memory_reserved, "
                                      f"what the GPU loses): pool {pool_extra:+d} B ({memory.pool.num_allocations} "
                                      f"slot(s)), static buffers {static_extra:+d} B "
                                      f"({memory.static_buffers.num_allocations} buffer(s){inside}); 512 B blocks in "
                                      "2 MiB, 20 MiB or 2 MiB-rounded segments, "
                                      "plan.ledger.cuda_memory() itemises it"))
    entries.append(LedgerEntry(name="lazy workspaces", nbytes=blas.nbytes, in_kv_budget=False, reason=blas.reason))
    entries.append(LedgerEntry(name="host buffers", nbytes=sum(a.nbytes for a in on_host), in_kv_budget=False,
                               on_device=False,
                               reason=f"{len(on_host)} pinned staging and host bookkeeping arrays "
                                      "(host memory, not GPU memory)"))
    entries.append(LedgerEntry(name="graph pool", nbytes=sum(k.nbytes for k in graph_keys), in_kv_budget=False,
                               reason=graph_pool_reason))
    ledger = Ledger(budget_bytes=budget_bytes, entries=tuple(entries), cpu_allocations=cpu_allocations,
                    cuda_allocations=cuda_allocations, graph_keys=graph_keys)
    assert ledger.kv_total_bytes == budget_bytes, (ledger.kv_total_bytes, budget_bytes)
    return ledger

