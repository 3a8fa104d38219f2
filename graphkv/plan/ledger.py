"""Step 7: attribute every byte of the KV budget, and list what is allocated beside it.

The pool's pages are shared by all groups, so the split is stated at the plan's design point:
``max_concurrency`` requests of ``max_model_len`` tokens, each holding its worst-case pages in
every group. Per group, those pages' bytes split into real KV data, page padding (Mamba states
padded up to the attention page) and empty slots (a group with fewer layers than ``gs``).
"""

from __future__ import annotations

from typing import Sequence

from graphkv.plan.plan import Capacity, CaptureSizes, GroupPlan, Ledger, LedgerEntry, SlotPlan, StaticBuffers
from graphkv.spec.model import ModelKV

__all__ = ["build_ledger", "estimate_graph_pool_bytes"]

_ACTIVATION_COPIES = 4  # live hidden-state-sized tensors a captured step typically holds at once


def estimate_graph_pool_bytes(model: ModelKV, capture_sizes: CaptureSizes) -> tuple[int, str]:
    """A rough size of the shared CUDA-graph memory pool (graphs captured largest first share it)."""
    largest = max((*capture_sizes.decode, *capture_sizes.mixed), default=0)
    if not largest:
        return 0, "no graphs are captured"
    if model.hidden_size is None:
        return 0, "unknown: the model declares no hidden_size (measure it with the NVML benchmark)"
    n = largest * model.hidden_size * 2 * _ACTIVATION_COPIES
    return n, (f"estimate: largest captured step {largest} tokens x hidden_size {model.hidden_size} x 2 bytes x "
               f"{_ACTIVATION_COPIES} live activations; graphs share one pool, captured largest first")


def build_ledger(*, budget_bytes: int, capacity: Capacity, groups: Sequence[GroupPlan], slots: Sequence[SlotPlan],
                 buffers: StaticBuffers, graph_pool: tuple[int, str]) -> Ledger:
    """Every byte of ``budget_bytes`` attributed; static buffers and graph pool listed beside it."""
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
    entries.append(LedgerEntry(name="static buffers", nbytes=buffers.total_bytes, in_kv_budget=False,
                               reason=f"{len(buffers.buffers)} persistent step buffers (block tables, slot mapping, "
                                      "inputs, flex masks)"))
    entries.append(LedgerEntry(name="graph pool", nbytes=graph_pool[0], in_kv_budget=False, reason=graph_pool[1]))
    ledger = Ledger(budget_bytes=budget_bytes, entries=tuple(entries))
    assert ledger.kv_total_bytes == budget_bytes, (ledger.kv_total_bytes, budget_bytes)
    return ledger

