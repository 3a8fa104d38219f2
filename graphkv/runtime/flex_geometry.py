"""Sizes of one flex-attention group's persistent mask buffers, read from a :class:`Plan`."""

from __future__ import annotations

import attrs

from graphkv.errors import PlanError, Problem, SpecError
from graphkv.plan.plan import Plan
from graphkv.spec.layers import LayerKind

__all__ = ["FlexMaskGeometry"]


@attrs.frozen(kw_only=True)
class FlexMaskGeometry:
    """Everything a flex mask build needs to know about one KV-cache group, as plain ints.

    The query side is tiled in ``q_tile_tokens`` tiles over at most ``max_num_batched_tokens``
    packed tokens; the key side is the whole pool, ``num_kernel_blocks`` kernel blocks of
    ``kernel_block_size`` tokens (kernel blocks ``0 .. bpk-1`` are the null page). ``window``
    is the sliding window in tokens (``None``: full causal attention).
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

    @property
    def num_q_tiles(self) -> int:
        """Query tiles of a full step: ``cdiv(max_num_batched_tokens, q_tile_tokens)``."""
        return -(-self.max_num_batched_tokens // self.q_tile_tokens)

    @property
    def max_padded_tokens(self) -> int:
        """The longest query (padded) a step may pass: whole tiles."""
        return self.num_q_tiles * self.q_tile_tokens

    @property
    def kv_tokens(self) -> int:
        """Length of the flattened key/value sequence: every token slot of the pool."""
        return self.num_kernel_blocks * self.kernel_block_size

    def for_device(self, device: object) -> "FlexMaskGeometry":
        """This geometry for buffers on ``device``: on CPU ``kv_indices`` spans the whole pool
        (``num_kernel_blocks`` columns), because torch 2.13's compiled CPU flex kernel asserts
        ``kv_indices.shape[-1] * kernel_block_size >= key length``; elsewhere the plan's width."""
        import torch

        if torch.device(device).type == "cpu":
            return attrs.evolve(self, kv_indices_width=max(self.kv_indices_width, self.num_kernel_blocks))
        return self

    @classmethod
    def from_plan(cls, plan: Plan, group_index: int) -> "FlexMaskGeometry":
        """The geometry of ``plan.groups[group_index]``; raises :class:`PlanError` when that group
        has no flex buffers (another backend) or a layer kind flex masks do not cover."""
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
        tiles = [d.backend.q_tile_tokens for d in plan.layers
                 if d.index in group.layers and d.backend.q_tile_tokens is not None]
        kv_indices = plan.buffers[names[1]]
        return cls(group_index=group_index, q_tile_tokens=max(tiles), kernel_block_size=group.kernel_block_size,
                   bpk=group.bpk, num_kernel_blocks=plan.num_blocks * group.bpk,
                   max_num_seqs=plan.limits.max_num_seqs, max_num_batched_tokens=plan.limits.max_num_batched_tokens,
                   block_table_width=group.block_table_width, kv_indices_width=kv_indices.shape[1],
                   window=getattr(group.spec, "window", None))

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
