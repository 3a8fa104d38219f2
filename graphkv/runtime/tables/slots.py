"""Slot mappings computed on the host, from the block tables' host mirror.

The slot of a token at position ``p`` in an attention group is ``page[p // block_size] *
block_size + p % block_size``, which equals the kernel-block formula ``table[p // kbs] * kbs + p %
kbs`` because page ``b`` is kernel blocks ``b * bpk .. b * bpk + bpk - 1``. The host holds every
row's pages, so a step's slots are one fancy index and two arithmetic ops per group, written
straight into the staging array the device copy reads (no kernel launch, no device gather).
State (Mamba) groups have no per-token slots.
"""

from __future__ import annotations

import numpy as np

from graphkv.runtime.tables.block_tables import BlockTables

__all__ = ["host_slot_mappings"]


def host_slot_mappings(tables: BlockTables, token_rows: np.ndarray, positions: np.ndarray,
                       out: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Write ``out[g, :n]`` (``out``: ``[num_groups, >= n] int64``) for every attention group ``g``
    from request row ``token_rows[t]`` and position ``positions[t]`` of each of ``n`` tokens
    (``[n] int64``; each row must hold the page of each of its positions). State groups' rows are
    left as they are. Returns ``(g, pages)`` per attention group: the page each token is written
    into. Host-only (numpy)."""
    n = positions.shape[0]
    written = []
    for g, bs in enumerate(tables.block_sizes):
        if tables.plan.groups[g].is_ssm:
            continue
        page = tables.pages_np[g][token_rows, positions // bs]
        np.add(page * bs, positions % bs, out=out[g, :n])
        written.append((g, page))
    return written
