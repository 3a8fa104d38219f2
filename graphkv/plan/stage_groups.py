"""Pipeline stages: the whole model's KV-cache groups, cut down to the layers one stage holds.

Block size, kernel block sizes, groups and CUDA-graph support are decided on the whole model so
that every stage pages alike (vLLM 0.33 groups the merged specs of all workers, then projects the
groups onto each worker). A stage's pool has as many slots as its fullest group has layers on it;
a group may hold no layer on a stage and still counts its pages per request (block IDs are handed
out for every group), so all stages need the same pages per request and agree on ``max_model_len``.
"""

from __future__ import annotations

from typing import AbstractSet

import attrs

from graphkv.plan.groups import Grouping, group_spec

__all__ = ["project_grouping"]


def project_grouping(grouping: Grouping, held: AbstractSet[int], stage: str) -> Grouping:
    """``grouping`` (of the whole model) with each group keeping only the layers in ``held``
    (layer indices of the stage, described by ``stage`` in the note). Pure."""
    groups = tuple(attrs.evolve(g, layers=tuple(x for x in g.layers if x.index in held)) for g in grouping.groups)
    promotion = grouping.promotion
    if promotion is not None:  # the stage's own promoted layers, if any
        kept = tuple(x for x in promotion.layers if x.index in held)
        promotion = attrs.evolve(promotion, layers=kept) if kept else None
    if grouping.slot_per_layer:
        (group,) = groups
        slots = tuple(x.spec.page_size_bytes(group.block_size) for x in group.layers)
        # The group's spec and page as this stage holds them (a stage may hold only one kind of its layers).
        groups = (attrs.evolve(group, spec=group_spec(group.layers), page_size_bytes=max(slots)),)
    else:
        slots = (grouping.slot_page_bytes[0],) * max(len(g.layers) for g in groups)
    assert slots, "a stage holds at least one cache entry"
    counts = [len(g.layers) for g in groups]
    note = (f"{stage}: the whole model's {len(groups)} group(s) (gs = {grouping.group_size}) keep their layers on this "
            f"stage ({', '.join(map(str, counts))} per group), so its pool has {len(slots)} slot(s)")
    return attrs.evolve(grouping, groups=groups, group_size=len(slots), slot_page_bytes=slots, promotion=promotion,
                        notes=(*grouping.notes, note))
