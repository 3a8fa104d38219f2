"""Torch implementations of the runtime kernels, for devices where Triton does not run natively.

Each function has the signature, semantics and argument check (the same ``check_*`` function) of
its Triton launcher in ``graphkv.kernels``: the same padding rules (padding rows get the null
page 0, negative or out-of-range slots write nothing), and every result is written in place into
the given persistent tensors.
They are a few vectorized torch operations each, on any device; on a CPU they replace Triton's
interpreter (a correctness checker: ~10 ms per launch plus ~7 ms per request) with 0.05-0.2 ms
per call, independent of the batch size.

Pick an implementation with :func:`graphkv.runtime.ops.choice.resolve_kernels` (``"auto"``:
Triton on CUDA, these elsewhere). All are checked against :mod:`graphkv.runtime.ops.reference`.
"""

from __future__ import annotations

import torch

from graphkv.kernels.block_tables import PackedTables, check_gather_rows, check_write_pages
from graphkv.kernels.reshape_and_cache import check_reshape_and_cache
from graphkv.spec.backends import KVLayout

__all__ = ["gather_rows", "reshape_and_cache", "write_pages"]


def write_pages(flat: torch.Tensor, staged: torch.Tensor, num_entries: int, max_bpk: int) -> None:
    """Apply ``num_entries`` page writes into ``flat`` with one scatter: entry ``e`` of ``staged``
    (``[>= 3 * E] int64``: destinations | first kernel blocks, ``-1`` for the null page | bpk, as
    :func:`graphkv.kernels.block_tables.write_pages` reads them) writes ``first_e + k`` (zeros for
    the null page) at ``dst_e + k`` for ``k < bpk_e``. Not capture-safe (selecting the written
    kernel blocks has a data-dependent size).

    In a step's table update (``staged``: the step's new pages, as the staging arrays hold them)::

        write_pages(tables.flat, staged, num_entries=len(dst), max_bpk=17)
    """
    check_write_pages(flat, staged, num_entries)
    if num_entries == 0:
        return
    dst, first, bpk = staged[:3 * num_entries].view(3, num_entries)  # [E] int64 each
    k = torch.arange(max_bpk, dtype=torch.int64, device=flat.device)
    inside = k < bpk[:, None]  # [E, max_bpk]
    values = torch.where(first[:, None] < 0, 0, first[:, None] + k)
    flat[(dst[:, None] + k)[inside]] = values[inside].to(torch.int32)


def gather_rows(src: PackedTables, dst: PackedTables, idx_mapping: torch.Tensor, num_reqs_padded: int) -> None:
    """``dst.tables[g][i] = src.tables[g][idx_mapping[i]]`` for ``i < num_reqs`` and null page 0
    for ``num_reqs <= i < num_reqs_padded`` and for out-of-range ``idx_mapping`` entries.
    ``idx_mapping``: ``[num_reqs] int32`` on the tables' device. Rows past ``num_reqs_padded``
    are left as they are. Capture-safe (no host sync).

    In a step's table sync (``persistent``: every request's rows; ``per_step``: the step's)::

        gather_rows(persistent, per_step, idx_mapping[:num_reqs], num_reqs_padded)
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


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor | None, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, *, layout: KVLayout) -> None:
    """Write ``key`` / ``value`` ``[num_tokens, H, D]`` into ``kv_cache`` at ``slot_mapping``.

    ``kv_cache``: the layer's view from ``KVPool.kv_cache`` in ``layout`` (blocks-first ``(N, 2,
    kbs, H, D)``, kv-first ``(2, N, kbs, H, D)`` incl. page-local views, or latent ``(N, kbs,
    D)`` with ``key`` ``[num_tokens, D]`` and ``value=None``; NHD and HND are strides of the
    view), same dtype as ``key``. ``slot_mapping``: ``[>= num_tokens] int64``; negative slots
    and slots ``>= N * kbs`` write nothing. Writes through the view's own strides (``index_put_``).
    Not capture-safe: selecting the written tokens syncs with a GPU.

    In an attention layer's forward (``k``, ``v`` its new keys and values, ``g`` its group)::

        reshape_and_cache(k, v, pool.kv_cache(name), slots[g], layout=pool.layout(name))
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
