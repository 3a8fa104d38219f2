"""Which pool slots keep each kv-first page's K and V inside the page (page-local layout).

A kv-first cache normally lays out K of all pages, then V of all pages ("split"), which maps page
``b`` to bytes outside ``[b*P, (b+1)*P)``; that is only safe when every layer of the slot is an
unpadded kv-first attention layer (all of them then map page ``b`` the same way). Any other slot
(shared with Mamba states, padded, or mixed layouts) must be page-local. A group's layers sit in
different slots (slot ``j`` holds layer ``j`` of every group) and flex attention needs one kv
block stride per group, so page-locality spreads across a group's slots until nothing changes.
Page-local is always correct; split is the optimisation.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from graphkv.spec.backends import CacheOrder

__all__ = ["page_local_slots"]


def page_local_slots(slot_layers: Sequence[Sequence[int]], slot_pages: Sequence[int],
                     group_layers: Sequence[Sequence[int]], layer_order: Mapping[int, CacheOrder],
                     layer_real_bytes: Mapping[int, int]) -> tuple[bool, ...]:
    """Per slot: whether its kv-first layers are page-local.

    ``slot_layers[j]`` / ``slot_pages[j]``: slot ``j``'s model layer indices and page bytes;
    ``group_layers[g]``: group ``g``'s layer indices; ``layer_order[i]`` / ``layer_real_bytes[i]``:
    layer ``i``'s backend cache order and unpadded page bytes. Pure; a fixpoint over at most
    ``len(slot_layers)`` passes.
    """
    local = [not all(layer_order[i] is CacheOrder.KV_FIRST and layer_real_bytes[i] == page for i in layers)
             for layers, page in zip(slot_layers, slot_pages)]
    slot_of = {i: j for j, layers in enumerate(slot_layers) for i in layers}
    group_slots = [sorted({slot_of[i] for i in layers}) for layers in group_layers]
    changed = True
    while changed:  # each pass marks at least one more slot
        changed = False
        for slots in group_slots:
            if any(local[j] for j in slots) and not all(local[j] for j in slots):
                for j in slots:
                    local[j] = True
                changed = True
    return tuple(local)
