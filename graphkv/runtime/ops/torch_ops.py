"""Torch implementations of the runtime kernels, for devices where Triton does not run natively.

Each function has the signature, semantics and argument check (the same ``check_*`` function) of
its Triton launcher in ``graphkv.kernels``: the same padding rules (padding rows get the null
page 0, padding tokens and out-of-table positions get ``PAD_SLOT_ID``, negative or out-of-range
slots write nothing), and every result is written in place into the given persistent tensors.
They are a few vectorized torch operations each, on any device; on a CPU they replace Triton's
interpreter (a correctness checker: ~10 ms per launch plus ~7 ms per request) with 0.05-0.2 ms
per call, independent of the batch size.

Pick an implementation with :func:`graphkv.runtime.ops.choice.resolve_kernels` (``"auto"``:
Triton on CUDA, these elsewhere). All are checked against :mod:`graphkv.runtime.ops.reference`.
"""

from __future__ import annotations

import torch

from graphkv.kernels.block_tables import PackedTables, check_apply_row_writes, check_gather_rows
from graphkv.kernels.reshape_and_cache import check_reshape_and_cache
from graphkv.kernels.slot_mapping import check_compute_slot_mappings
from graphkv.runtime.padding import PAD_SLOT_ID
from graphkv.spec.backends import KVLayout

__all__ = ["apply_row_writes", "compute_slot_mappings", "gather_rows", "reshape_and_cache"]


def apply_row_writes(tables: PackedTables, staged: torch.Tensor, num_segments: int) -> None:
    """Apply ``num_segments`` contiguous writes with one scatter. ``staged``: ``[>= 2 * S + 1 +
    V] int64`` on the tables' device holding ``S`` destination offsets into ``tables.flat``, ``S
    + 1`` cumulative value starts, then the ``V`` values (as :meth:`BlockTables.commit` stages
    them). Not capture-safe: it reads ``V`` on the host (a sync on a GPU).

    >>> apply_row_writes(tables, staged, num_segments=len(segments))
    """
    check_apply_row_writes(tables, staged)
    if num_segments == 0:
        return
    dst = staged[:num_segments]  # [S] int64
    starts = staged[num_segments:2 * num_segments + 1]  # [S + 1] int64
    num_values = int(starts[-1])
    values = staged[2 * num_segments + 1:2 * num_segments + 1 + num_values]  # [V] int64
    # Value i of segment s goes to dst[s] + (i - starts[s]): repeat each segment's dst - start
    # over its values, then add each value's index.
    index = torch.repeat_interleave(dst - starts[:-1], starts.diff(), output_size=num_values)
    index += torch.arange(num_values, dtype=torch.int64, device=staged.device)
    tables.flat.index_copy_(0, index, values.to(torch.int32))


def gather_rows(src: PackedTables, dst: PackedTables, idx_mapping: torch.Tensor, num_reqs_padded: int) -> None:
    """``dst.tables[g][i] = src.tables[g][idx_mapping[i]]`` for ``i < num_reqs`` and null page 0
    for ``num_reqs <= i < num_reqs_padded`` and for out-of-range ``idx_mapping`` entries.
    ``idx_mapping``: ``[num_reqs] int32`` on the tables' device. Rows past ``num_reqs_padded``
    are left as they are. Capture-safe (no host sync).

    >>> gather_rows(persistent, per_step, idx_mapping[:num_reqs], num_reqs_padded)
    """
    check_gather_rows(src, dst, idx_mapping, num_reqs_padded)
    num_reqs = idx_mapping.shape[0]
    if num_reqs_padded == 0:
        return
    rows = idx_mapping.clamp(0, src.num_rows - 1)  # [num_reqs] int32, always a readable row
    out_of_range = (rows != idx_mapping).unsqueeze(1)  # [num_reqs, 1] bool: these rows get page 0
    for table, out in zip(src.tables, dst.tables):
        torch.index_select(table, 0, rows, out=out[:num_reqs])
        out[:num_reqs].masked_fill_(out_of_range, 0)
        out[num_reqs:num_reqs_padded].zero_()


def compute_slot_mappings(query_start_loc: torch.Tensor, positions: torch.Tensor, tables: PackedTables,
                          kernel_block_sizes: torch.Tensor, state_groups: torch.Tensor, num_reqs: int,
                          out: torch.Tensor) -> torch.Tensor:
    """Fill ``out`` ``[num_groups, max_num_batched_tokens] int64`` with every group's slots,
    ``table_g[r, p // kbs_g] * kbs_g + p % kbs_g`` for token ``t`` of batch row ``r`` at position
    ``p``, all groups at once.

    ``query_start_loc``: ``[>= num_reqs + 1] int32``, non-decreasing; ``positions``: ``[>=
    num_tokens] int64``; ``tables``: the gathered per-step tables, kernel blocks;
    ``kernel_block_sizes`` / ``state_groups``: ``[num_groups] int32``. Tokens from
    ``query_start_loc[num_reqs]`` to the end of ``out``, tokens whose position is negative,
    missing from ``positions`` or past the table, and every token of a state group get
    ``PAD_SLOT_ID``; tokens before ``query_start_loc[0]`` are left as they are (as in the Triton
    kernel). Capture-safe (no host sync). Returns ``out``.

    >>> compute_slot_mappings(qsl, positions, tables, kbs, state_groups, num_reqs, out=slot_mappings)
    """
    check_compute_slot_mappings(query_start_loc, positions, tables, kernel_block_sizes, state_groups, num_reqs, out)
    num_tokens, device = out.shape[1], out.device
    # Each token's batch row: -1 before the first request, num_reqs from the step's end on.
    tokens = torch.arange(num_tokens, dtype=torch.int32, device=device)
    row = torch.searchsorted(query_start_loc[:num_reqs + 1], tokens, right=True) - 1  # [T] int64
    if positions.shape[0] >= num_tokens:
        pos = positions[:num_tokens]  # [T] int64
    else:  # tokens missing from positions read as position -1 (padding)
        pos = torch.full((num_tokens,), -1, dtype=torch.int64, device=device)
        pos[:positions.shape[0]] = positions
    is_token = (row >= 0) & (row < num_reqs) & (pos >= 0)  # [T]

    kbs = kernel_block_sizes.unsqueeze(1)  # [G, 1] int32 (promoted to int64 with pos)
    width = tables.widths.unsqueeze(1)  # [G, 1] int32
    slot_width = torch.where(state_groups.unsqueeze(1) == 0, width, 0)  # a state group has no slots
    col = torch.div(pos, kbs, rounding_mode="floor")  # [G, T] int64, table column of each token
    outside = ~(is_token & (col < slot_width))  # [G, T]: padding, nothing is read
    entry = (row * width).add_(col).add_(tables.offsets.unsqueeze(1)).masked_fill_(outside, 0)  # index into flat
    kernel_block = tables.flat.take(entry)  # [G, T] int32
    slot = torch.addcmul(pos % kbs, kernel_block, kbs).masked_fill_(outside, PAD_SLOT_ID)  # [G, T] int64
    torch.where(row < 0, out, slot, out=out)
    return out


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor | None, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, *, layout: KVLayout) -> None:
    """Write ``key`` / ``value`` ``[num_tokens, H, D]`` into ``kv_cache`` at ``slot_mapping``.

    ``kv_cache``: the layer's view from ``KVPool.kv_cache`` in ``layout`` (blocks-first ``(N, 2,
    kbs, H, D)``, kv-first ``(2, N, kbs, H, D)`` incl. page-local views, or latent ``(N, kbs,
    D)`` with ``key`` ``[num_tokens, D]`` and ``value=None``; NHD and HND are strides of the
    view), same dtype as ``key``. ``slot_mapping``: ``[>= num_tokens] int64``; negative slots
    and slots ``>= N * kbs`` write nothing. Writes through the view's own strides (``index_put_``).
    Not capture-safe: selecting the written tokens syncs with a GPU.

    >>> reshape_and_cache(k, v, pool.kv_cache(name), slots[g], layout=pool.layout(name))
    """
    args = check_reshape_and_cache(key, value, kv_cache, slot_mapping, layout=layout)
    geo = args.geometry
    num_tokens, kbs = args.key.shape[0], geo.kernel_block_size
    if num_tokens == 0:
        return
    slots = slot_mapping[:num_tokens]
    written = ((slots >= 0) & (slots < geo.num_kernel_blocks * kbs)).nonzero().squeeze(1)  # [n] int64
    slots = slots.index_select(0, written)
    kernel_block, offset = slots // kbs, slots % kbs
    if args.value is None:  # latent (N, kbs, D); the checked key is [T, 1, D]
        kv_cache.index_put_((kernel_block, offset), args.key[:, 0].index_select(0, written))
        return
    # K and V planes, each (N, kbs, H, D) whichever of the first two dimensions holds the blocks.
    kv_dim = 1 - layout.block_dim
    kv_cache.select(kv_dim, 0).index_put_((kernel_block, offset), args.key.index_select(0, written))
    kv_cache.select(kv_dim, 1).index_put_((kernel_block, offset), args.value.index_select(0, written))
