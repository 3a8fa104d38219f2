"""Sizes of one flex-attention group's persistent mask buffers, read from a :class:`Plan`."""

from __future__ import annotations

import attrs

from graphkv.errors import PlanError, Problem, SpecError
from graphkv.plan.plan import Plan
from graphkv.runtime.flex.views import flex_kv_block_stride, flex_kv_tokens
from graphkv.spec.layers import LayerKind

__all__ = ["FlexMaskGeometry", "plan_kv_block_stride"]


def _positive(instance: object, attribute: "attrs.Attribute[int]", value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(Problem(field=attribute.name, value=value, limit="must be an int >= 1",
                                fix="read it from the cache view with flex_kv_block_stride(kv_cache), "
                                    "or build the geometry with FlexMaskGeometry.from_plan"))


@attrs.frozen(kw_only=True)
class FlexMaskGeometry:
    """Everything a flex mask build needs to know about one KV-cache group, as plain ints.

    The query side is tiled in ``q_tile_tokens`` tiles over at most ``max_num_batched_tokens``
    packed tokens; the key side is the whole pool, ``num_kernel_blocks`` kernel blocks of
    ``kernel_block_size`` tokens (kernel blocks ``0 .. bpk-1`` are the null page), kernel block
    ``b`` at flex kv block ``b * kv_block_stride`` of the flat K/V view (1: split kv-first cache,
    2: page-local one; see :mod:`graphkv.runtime.flex.views`). ``window`` is the sliding
    window in tokens (``None``: full causal attention).
    """

    group_index: int
    q_tile_tokens: int
    kernel_block_size: int
    bpk: int
    num_kernel_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_table_width: int
    kv_indices_width: int
    window: int | None = None
    kv_block_stride: int = attrs.field(default=1, validator=_positive)
    searched_width: int | None = None  # columns of kv_indices a build fills, when fewer than kv_indices_width

    @property
    def num_q_tiles(self) -> int:
        """Query tiles of a full step: ``cdiv(max_num_batched_tokens, q_tile_tokens)``."""
        return -(-self.max_num_batched_tokens // self.q_tile_tokens)

    @property
    def max_padded_tokens(self) -> int:
        """The longest query (padded) a step may pass: whole tiles."""
        return self.num_q_tiles * self.q_tile_tokens

    @property
    def num_kv_blocks(self) -> int:
        """Flex kv blocks of the flat K/V view: ``(num_kernel_blocks - 1) * kv_block_stride + 1``."""
        return self.kv_tokens // self.kernel_block_size

    @property
    def kv_tokens(self) -> int:
        """Length of the flat key/value view (:func:`flex_kv_tokens`): every token slot of the
        pool, plus the gaps between kernel blocks when ``kv_block_stride > 1``."""
        return flex_kv_tokens(self.num_kernel_blocks, self.kernel_block_size, self.kv_block_stride)

    def for_device(self, device: object) -> "FlexMaskGeometry":
        """This geometry for buffers on ``device``: on CPU ``kv_indices`` spans the whole flat view
        (``num_kv_blocks`` columns), because torch 2.13's compiled CPU flex kernel asserts
        ``kv_indices.shape[-1] * kernel_block_size >= key length``, of which a build fills the plan's
        width (``searched_width``); elsewhere the plan's width."""
        import torch

        if torch.device(device).type == "cpu" and self.num_kv_blocks > self.kv_indices_width:
            # A tile still uses at most the plan's width: only those columns are searched per step.
            return attrs.evolve(self, kv_indices_width=self.num_kv_blocks, searched_width=self.kv_indices_width)
        return self

    @classmethod
    def from_plan(cls, plan: Plan, group_index: int) -> "FlexMaskGeometry":
        """The geometry of ``plan.groups[group_index]``, ``kv_block_stride`` included (read off the
        layers' pool views, see :func:`plan_kv_block_stride`); raises :class:`PlanError` when that
        group has no flex buffers (another backend), a layer kind flex masks do not cover, or a
        cache layout flex cannot view."""
        group = plan.groups[group_index]
        names = (f"flex.{group_index}.kv_num_blocks", f"flex.{group_index}.kv_indices")
        if any(n not in plan.buffers for n in names):
            raise PlanError(Problem(field=f"groups[{group_index}].backends", value=list(group.backends),
                                    limit="the plan has no flex mask buffers for this group",
                                    fix="declare the group's layers with the 'flex' backend"))
        if group.kind not in (LayerKind.FULL_ATTENTION, LayerKind.SLIDING_WINDOW):
            raise PlanError(Problem(field=f"groups[{group_index}].kind", value=group.kind.value,
                                    limit="flex masks cover full and sliding-window attention only",
                                    fix="use another backend for this layer kind"))
        held = {d.name: getattr(d.spec, "window", None) for d in plan.layers if d.index in group.layers}
        chunked = [d.name for d in plan.layers if d.index in group.layers and getattr(d.spec, "chunk", None)]
        if chunked or len(set(held.values())) > 1:
            what = (f"chunked-local layers ({', '.join(chunked[:3])}) allocated as full attention" if chunked else
                    "sliding-window layers allocated as full attention beside layers of another window")
            raise PlanError(Problem(
                field=f"groups[{group_index}]", value=dict(list(held.items())[:4]),
                limit=f"flex masks take one sliding window and no chunk per group; this group holds {what} "
                      "(disable_hybrid_kv_cache_manager, its automatic choice for chunked-local attention, or vLLM's "
                      "full-allocation fallback beside MLA)",
                fix="plan with disable_hybrid_kv_cache_manager=False to keep local layers in groups of their own; a "
                    "plan that takes vLLM's fallback beside MLA cannot be served by graphkv's flex runtime yet"))
        tiles = [d.backend.q_tile_tokens for d in plan.layers
                 if d.index in group.layers and d.backend.q_tile_tokens is not None]
        kv_indices = plan.buffers[names[1]]
        return cls(group_index=group_index, q_tile_tokens=max(tiles), kernel_block_size=group.kernel_block_size,
                   bpk=group.bpk, num_kernel_blocks=plan.num_blocks * group.bpk,
                   max_num_seqs=plan.limits.max_num_seqs, max_num_batched_tokens=plan.limits.max_num_batched_tokens,
                   block_table_width=group.block_table_width, kv_indices_width=kv_indices.shape[1],
                   window=getattr(group.spec, "window", None),
                   kv_block_stride=plan_kv_block_stride(plan, group_index))

    def check_inputs(self, **tensors: object) -> None:
        """Raise :class:`SpecError` naming every bound tensor whose shape or dtype is wrong."""
        import torch

        want = {
            "block_table": ((self.max_num_seqs, None), torch.int32),
            "query_start_loc": ((self.max_num_seqs + 1,), torch.int32),
            "seq_lens": ((self.max_num_seqs,), torch.int32),
            "kv_num_blocks": ((self.num_q_tiles,), torch.int32),
            "kv_indices": ((self.num_q_tiles, self.kv_indices_width), torch.int32),
        }
        problems = []
        for name, t in tensors.items():
            if t is None:
                continue
            shape, dtype = want[name]
            ok = (isinstance(t, torch.Tensor) and t.dtype == dtype and t.dim() == len(shape)
                  and all(w is None or s == w for s, w in zip(t.shape, shape)) and t.is_contiguous())
            if not ok:
                got = (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__
                fix = "pass the persistent buffer allocated from the plan"
                if name == "kv_indices":
                    fix += " (on CPU with num_kernel_blocks columns, see FlexMaskGeometry.for_device)"
                problems.append(Problem(field=name, value=got,
                                        limit=f"must be a contiguous {dtype} tensor of shape "
                                              f"{tuple('any' if w is None else w for w in shape)}",
                                        fix=fix))
        if problems:
            raise SpecError(*problems)


def plan_kv_block_stride(plan: Plan, group_index: int) -> int:
    """The flex kv block stride ``r`` of ``plan.groups[group_index]`` in the pool
    :func:`graphkv.runtime.allocate` builds: each layer's view is laid out on a ``meta`` tensor
    by the pool's own geometry (:func:`graphkv.runtime.pool.allocate.layer_geometry`) and ``r`` is read
    off its strides (:func:`graphkv.runtime.flex.views.flex_kv_block_stride`), so plan and
    pool cannot disagree. No device memory is touched.

    Raises :class:`PlanError` when a layer's cache cannot be viewed by flex attention, or when the
    group's layers would get different strides (their slots' pages differ)."""
    import torch

    from graphkv.runtime.pool.allocate import layer_geometry, page_local_slots
    from graphkv.runtime.pool.views import AttentionGeometry, attention_view

    group = plan.groups[group_index]
    local = page_local_slots(plan)
    strides: dict[str, int] = {}
    for decl in plan.layers:
        if decl.index not in group.layers:
            continue
        geo = layer_geometry(plan, decl, local)
        assert isinstance(geo, AttentionGeometry), "flex groups hold attention layers"
        slot = torch.empty(plan.num_blocks * geo.page_size_bytes, dtype=torch.uint8, device="meta")
        try:
            strides[decl.name] = flex_kv_block_stride(attention_view(slot, geo))
        except SpecError as e:
            raise PlanError(*(attrs.evolve(p, field=f"{decl.name}.{p.field}") for p in e.problems)) from None
    if len(set(strides.values())) > 1:
        raise PlanError(Problem(field=f"groups[{group_index}].layers", value=strides,
                                limit="every layer of a flex group needs the same kv block stride (its slots' "
                                      "page bytes per kernel block differ)",
                                fix="give the group's layers equal page sizes (page_size_padded) or their own slots"))
    return next(iter(strides.values()))
