"""Step 5: the shapes of the flex mask index buffers (``flex.{g}.kv_num_blocks``, ``flex.{g}.kv_indices``).

These are the only step buffers whose shapes are decided here: the runtime reads them when it sizes
each flex group's mask allocations (:func:`graphkv.plan.allocations.runtime.runtime_allocations`)
and its mask geometry. Every buffer the runtime really allocates — block tables, slot mappings,
step metadata, these masks — is listed, with its placement, in ``plan.ledger.allocations(kind)``.

Sizes come from the step's token budget (``max_num_batched_tokens``), never from a sequence length
where a step size is meant: upstream's flex backend sized index rows from ``max_model_len`` and
crashed whenever ``max_num_batched_tokens > max_model_len``.
"""

from __future__ import annotations

from typing import Sequence

from graphkv.plan.plan import BufferSpec, GroupPlan, StaticBuffers
from graphkv.spec._checks import cdiv
from graphkv.spec.dtypes import DType
from graphkv.spec.limits import Limits
from graphkv.spec.model import ModelKV

__all__ = ["flex_kv_indices_width", "plan_buffers"]


def flex_kv_indices_width(*, q_tile_tokens: int, max_model_len: int, kernel_block_size: int, max_num_seqs: int,
                          num_kernel_blocks: int) -> int:
    """Kernel blocks one flex query tile may attend: the tile's tokens belong to at most
    ``min(q_tile, max_num_seqs)`` requests of at most ``cdiv(max_model_len, kernel_block_size)``
    kernel blocks each, and never more than the pool's distinct kernel blocks."""
    per_request = cdiv(max_model_len, kernel_block_size)
    return min(min(q_tile_tokens, max_num_seqs) * per_request, num_kernel_blocks)


def plan_buffers(model: ModelKV, limits: Limits, groups: Sequence[GroupPlan], *, max_model_len: int,
                 num_blocks: int) -> StaticBuffers:
    """The flex mask index buffers of every group with flex layers (none for other backends)."""
    tokens, seqs = limits.max_num_batched_tokens, limits.max_num_seqs
    per_step = f"max_num_batched_tokens={tokens}"
    buffers: list[BufferSpec] = []
    backend_of = {layer.index: layer.backend for layer in model.layers}  # one pass: linear in layers
    for g in groups:
        tiles = [backend_of[i].q_tile_tokens for i in g.layers if backend_of[i].q_tile_tokens is not None]
        if not tiles:
            continue
        q_tile = max(tiles)
        q_groups = cdiv(tokens, q_tile)
        width = flex_kv_indices_width(q_tile_tokens=q_tile, max_model_len=max_model_len,
                                      kernel_block_size=g.kernel_block_size, max_num_seqs=seqs,
                                      num_kernel_blocks=num_blocks * g.bpk)
        buffers.append(BufferSpec(name=f"flex.{g.index}.kv_num_blocks", shape=(q_groups,), dtype=DType.INT32,
                                  reason=f"cdiv({per_step}, q_tile={q_tile}) query tiles"))
        buffers.append(BufferSpec(
            name=f"flex.{g.index}.kv_indices", shape=(q_groups, width), dtype=DType.INT32,
            reason=(f"per query tile: min(min(q_tile {q_tile}, max_num_seqs {seqs}) x cdiv(max_model_len "
                    f"{max_model_len}, kernel block {g.kernel_block_size}), pool kernel blocks {num_blocks * g.bpk})")))
    return StaticBuffers(buffers=tuple(buffers))
