"""Step 3: bucket layers into KV-cache groups that share block tables and pool slots.

Layers with equal specs form a bucket. When every layer needs the same pages per request
(one ``uniform_type_key``: full attention and MLA alike, or sliding layers of one window, or
chunked layers of one chunk) but their page sizes differ, all of them form one group with a
slot each (vLLM's ``UniformTypeKVCacheSpecs``). Otherwise pages must all be one size so any page
index can hold any group's page: a smaller page that divides the largest scales that bucket's
block size up; a non-MLA attention page that does not keeps its block size and is padded to the
largest page (vLLM 0.33 ``unify_kv_cache_spec_page_size``; the padding is a ledger entry); an
MLA page that does not divide is refused. The group size ``gs`` (layers per group, = slots in
the pool) is the smallest bucket, unless the largest bucket is under 1.5x the smallest, then the
largest; a bucket of ``n`` layers becomes ``cdiv(n, gs)`` groups, group ``i`` of ``g`` taking
layers ``i, i+g, i+2g, …``.

When an MLA page does not divide, vLLM 0.33's full-allocation fallback is tried before refusing
(:mod:`graphkv.plan.promotion`): sliding-window layers beside MLA are allocated as full attention
and every layer goes into one group with a slot each.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from graphkv.errors import PlanError, Problem
from graphkv.plan.promotion import Promotion, fallback_refusal, promote_layers
from graphkv.spec._checks import cdiv
from graphkv.spec.layers import LayerSpec, PromotedLocalSpec
from graphkv.spec.model import LayerDecl

__all__ = ["GroupDraft", "Grouping", "build_groups", "group_size_rule", "group_spec"]


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
    slot_per_layer: bool = False  # one group whose layers differ in page size: slot j is sized to layer j
    promotion: Promotion | None = None  # local-attention layers allocated as full attention, if any

    def layers_as_planned(self, layers: Sequence[LayerDecl]) -> tuple[LayerDecl, ...]:
        """``layers`` with the specs the groups hold (promoted layers as :class:`PromotedLocalSpec`)."""
        planned = {layer.index: layer for g in self.groups for layer in g.layers}
        return tuple(planned.get(layer.index, layer) for layer in layers)


def group_size_rule(bucket_sizes: Sequence[int]) -> int:
    """``min`` bucket size, or ``max`` when ``max < 1.5 * min`` (fewer, fuller groups)."""
    smallest, largest = min(bucket_sizes), max(bucket_sizes)
    return largest if largest < 1.5 * smallest else smallest


def build_groups(layers: Sequence[LayerDecl], block_size: int) -> Grouping:
    """Group ``layers`` (Mamba pages already padded) at ``block_size``. Pure; linear in layers."""
    buckets: dict[LayerSpec, list[LayerDecl]] = {}
    for layer in layers:
        buckets.setdefault(layer.spec, []).append(layer)

    if len(buckets) > 1 and _uniform_type(buckets):
        return _one_group(layers, block_size)

    largest = max(spec.page_size_bytes(block_size) for spec in buckets)
    notes: list[str] = []
    drafts: list[tuple[LayerSpec, list[LayerDecl], int]] = []
    for spec, members in buckets.items():
        page = spec.page_size_bytes(block_size)
        bucket_bs = block_size
        if page != largest:
            if not spec.is_ssm and largest % page == 0:
                bucket_bs = block_size * (largest // page)
                notes.append(f"{spec.describe()}: page {page} B < {largest} B, block size scaled to {bucket_bs} tokens")
            elif not spec.is_ssm and not spec.kind.is_latent:  # latent caches are read in whole token rows
                # vLLM 0.33 unify_kv_cache_spec_page_size: a non-MLA attention page that does not divide is padded
                notes.append(f"{spec.describe()}: page {page} B does not divide {largest} B, padded to {largest} B "
                             f"({largest - page} B padding per page, a ledger entry)")
            else:
                why = (f"the {spec.kind.value} page of {page} B ({members[0].name}) does not divide the largest page "
                       f"of {largest} B, and only non-MLA attention pages are padded")
                refusal = fallback_refusal(layers)
                if refusal is None:  # vLLM 0.33 _try_get_full_allocation_fallback_groups
                    promoted, promotion = promote_layers(
                        layers, reason=f"vLLM 0.33's full-allocation fallback: page sizes cannot be unified, {why}")
                    return attrs.evolve(_one_group(promoted, block_size), promotion=promotion)
                raise PlanError(Problem(
                    field="layers", value=f"{members[0].name} ({spec.describe()})",
                    limit=f"its page of {page} bytes at block_size={block_size} must divide the largest page "
                          f"({largest} bytes) so all groups share one page size; only non-MLA attention pages are "
                          f"padded, and vLLM 0.33's full-allocation fallback does not apply: {refusal}",
                    fix=f"pad the smaller page (page_size_padded={largest}) or choose a block_size where page sizes "
                        "divide"))
        drafts.append((spec, members, bucket_bs))

    gs = group_size_rule([len(members) for _, members, _ in drafts])
    groups: list[GroupDraft] = []
    for spec, members, bucket_bs in drafts:
        count = cdiv(len(members), gs)
        for i in range(count):
            groups.append(GroupDraft(spec=spec, layers=tuple(members[i::count]), block_size=bucket_bs,
                                     page_size_bytes=largest))
    return Grouping(groups=tuple(groups), group_size=gs, slot_page_bytes=(largest,) * gs, notes=tuple(notes))


def group_spec(layers: Sequence[LayerDecl]) -> LayerSpec:
    """The spec a one-group-of-slots group reports: a layer that keeps every token by its own
    spec, not a promoted local layer (which keeps its window for attention), where there is one."""
    return next((layer.spec for layer in layers if not isinstance(layer.spec, PromotedLocalSpec)), layers[0].spec)


def _one_group(layers: Sequence[LayerDecl], block_size: int) -> Grouping:
    """Layers that all need the same pages per request: one group, one slot per layer sized to
    its own page (vLLM's ``UniformTypeKVCacheSpecs``)."""
    pages = {layer.spec: layer.spec.page_size_bytes(block_size) for layer in layers}
    slot_pages = tuple(pages[layer.spec] for layer in layers)
    group = GroupDraft(spec=group_spec(layers), layers=tuple(layers), block_size=block_size, page_size_bytes=max(slot_pages))
    promoted = any(isinstance(layer.spec, PromotedLocalSpec) for layer in layers)
    note = ("layers need the same pages per request" + (" once local attention is allocated as full" if promoted else "")
            + (" but differ in page size" if len(set(slot_pages)) > 1 else "")
            + ": one group, each layer its own slot sized to its own page")
    return Grouping(groups=(group,), group_size=len(layers), slot_page_bytes=slot_pages, slot_per_layer=True,
                    notes=(note,))




def _uniform_type(buckets: dict[LayerSpec, list[LayerDecl]]) -> bool:
    """Whether every bucket needs the same pages per request (one ``uniform_type_key``, not a state)."""
    keys = {spec.uniform_type_key for spec in buckets}
    return len(keys) == 1 and None not in keys
