"""Step 3: bucket layers into KV-cache groups that share block tables and pool slots.

Layers with equal specs form a bucket. Pages must all be one size so any page index can hold any
group's page: a smaller attention page divides the largest and that bucket's block size is scaled
up. The group size ``gs`` (layers per group, = slots in the pool) is the smallest bucket, unless
the largest bucket is under 1.5x the smallest, then the largest; a bucket of ``n`` layers becomes
``cdiv(n, gs)`` groups, group ``i`` of ``g`` taking layers ``i, i+g, i+2g, …``.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from graphkv.errors import PlanError, Problem
from graphkv.spec._checks import cdiv
from graphkv.spec.layers import FullAttentionSpec, LayerSpec, MLASpec
from graphkv.spec.model import LayerDecl

__all__ = ["GroupDraft", "Grouping", "build_groups", "group_size_rule"]


@attrs.frozen(kw_only=True)
class GroupDraft:
    """A group before kernel block sizes and page counts are known."""

    spec: LayerSpec
    layers: tuple[LayerDecl, ...]
    block_size: int
    page_size_bytes: int


@attrs.frozen(kw_only=True)
class Grouping:
    """Groups plus the pool slot layout they imply."""

    groups: tuple[GroupDraft, ...]
    group_size: int
    slot_page_bytes: tuple[int, ...]  # bytes per page of each pool slot
    notes: tuple[str, ...]


def group_size_rule(bucket_sizes: Sequence[int]) -> int:
    """``min`` bucket size, or ``max`` when ``max < 1.5 * min`` (fewer, fuller groups)."""
    smallest, largest = min(bucket_sizes), max(bucket_sizes)
    return largest if largest < 1.5 * smallest else smallest


def build_groups(layers: Sequence[LayerDecl], block_size: int) -> Grouping:
    """Group ``layers`` (Mamba pages already padded) at ``block_size``. Pure."""
    buckets: dict[LayerSpec, list[LayerDecl]] = {}
    for layer in layers:
        buckets.setdefault(layer.spec, []).append(layer)

    if len(buckets) > 1 and _uniform_type(buckets):
        # One attention type whose layers differ only in size: one group, one slot per layer.
        group = GroupDraft(spec=layers[0].spec, layers=tuple(layers), block_size=block_size,
                           page_size_bytes=max(layer.spec.page_size_bytes(block_size) for layer in layers))
        return Grouping(groups=(group,), group_size=len(layers),
                        slot_page_bytes=tuple(layer.spec.page_size_bytes(block_size) for layer in layers),
                        notes=("layers share one attention type but differ in size: one group, each layer its own "
                               "slot sized to its own page",))

    largest = max(spec.page_size_bytes(block_size) for spec in buckets)
    notes: list[str] = []
    drafts: list[tuple[LayerSpec, list[LayerDecl], int]] = []
    for spec, members in buckets.items():
        page = spec.page_size_bytes(block_size)
        bucket_bs = block_size
        if page != largest:
            if spec.is_ssm or largest % page:
                raise PlanError(Problem(
                    field="layers", value=f"{members[0].name} ({spec.describe()})",
                    limit=f"its page of {page} bytes at block_size={block_size} must divide the largest page "
                          f"({largest} bytes) so all groups share one page size",
                    fix="pad the smaller page (page_size_padded) or choose a block_size where page sizes divide"))
            bucket_bs = block_size * (largest // page)
            notes.append(f"{spec.describe()}: page {page} B < {largest} B, block size scaled to {bucket_bs} tokens")
        drafts.append((spec, members, bucket_bs))

    gs = group_size_rule([len(members) for _, members, _ in drafts])
    groups: list[GroupDraft] = []
    for spec, members, bucket_bs in drafts:
        count = cdiv(len(members), gs)
        for i in range(count):
            groups.append(GroupDraft(spec=spec, layers=tuple(members[i::count]), block_size=bucket_bs,
                                     page_size_bytes=largest))
    return Grouping(groups=tuple(groups), group_size=gs, slot_page_bytes=(largest,) * gs, notes=tuple(notes))


def _uniform_type(buckets: dict[LayerSpec, list[LayerDecl]]) -> bool:
    types = {type(spec) for spec in buckets}
    return len(types) == 1 and next(iter(types)) in (FullAttentionSpec, MLASpec)
