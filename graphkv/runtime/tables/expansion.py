"""Page -> kernel-block expansion on host memory: the numpy twin of the ``write_pages`` kernel.

A page entry ``(dst, first, bpk)`` writes kernel blocks ``first .. first + bpk - 1`` (``first =
page * bpk``) at ``dst .. dst + bpk - 1`` of a flat int32 table buffer; ``first = -1`` is the null
page and writes ``bpk`` zeros. On a CPU the "device" tables are host memory, so
:class:`~graphkv.runtime.tables.device.DeviceTables` writes them with this function directly (no
staging copy, no kernel); it is checked against the same reference as the Triton and torch
versions (:func:`graphkv.runtime.ops.reference.write_pages_ref`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["page_first_blocks", "write_pages_host"]


def page_first_blocks(pages: np.ndarray, bpk: "np.ndarray | int") -> np.ndarray:
    """``[n] int64`` first kernel block of each page (``page * bpk``), ``-1`` for the null page 0."""
    return np.where(pages > 0, pages * bpk, -1)


def write_pages_host(flat: np.ndarray, dst: np.ndarray, first: np.ndarray, bpk: "np.ndarray | int") -> None:
    """Write page entries into ``flat`` (``[total] int32``, host memory): entry ``e`` puts ``first[e]
    + k`` (zeros when ``first[e] < 0``) at ``dst[e] + k`` for ``k < bpk`` (an int for all entries,
    or ``[n]`` per entry). ``dst`` / ``first``: ``[n] int64``. Entries must not overlap."""
    if isinstance(bpk, (int, np.integer)):
        if bpk == 1:
            flat[dst] = np.maximum(first, 0)
            return
        k = np.arange(bpk)
        values = first[:, None] + k
        values[first < 0] = 0
        flat[dst[:, None] + k] = values
        return
    width = int(bpk.max()) if bpk.size else 1
    if width == 1 or (bpk == width).all():
        write_pages_host(flat, dst, first, width)
        return
    k = np.arange(width)
    inside = k < bpk[:, None]  # [n, width]: the kernel blocks each entry writes
    values = first[:, None] + k
    values[first < 0] = 0
    flat[(dst[:, None] + k)[inside]] = values[inside]
