"""Page -> kernel-block expansion: page ``b`` becomes kernel blocks ``b*bpk .. b*bpk + bpk - 1``.

Vectorized with numpy (``b * bpk + arange(bpk)`` broadcast, written straight into the host
table row); tiny appends take a plain Python path, which is faster below
:data:`SMALL_EXPANSION_KERNEL_BLOCKS` kernel blocks because converting a short list to an array
costs more than the arithmetic (measured by ``benchmarks/block_tables.py``).
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

__all__ = ["PageIds", "SMALL_EXPANSION_KERNEL_BLOCKS", "write_expanded"]

PageIds = Union[Sequence[int], np.ndarray]

# At or below this many kernel blocks per append the Python path wins (see the benchmark).
SMALL_EXPANSION_KERNEL_BLOCKS = 24

_ARANGES: dict[int, np.ndarray] = {}


def _arange(bpk: int) -> np.ndarray:
    a = _ARANGES.get(bpk)
    if a is None:
        a = _ARANGES[bpk] = np.arange(bpk, dtype=np.int64)
    return a


def write_expanded(row: np.ndarray, start: int, page_ids: PageIds, bpk: int) -> int:
    """Write the kernel blocks of ``page_ids`` into ``row[start:]`` (``row``: ``[width] int32``
    host table row); returns the end column. The caller checks the capacity first."""
    n = len(page_ids)
    end = start + n * bpk
    if bpk == 1:
        row[start:end] = page_ids
    elif n * bpk <= SMALL_EXPANSION_KERNEL_BLOCKS:
        row[start:end] = [b * bpk + k for b in page_ids for k in range(bpk)]
    else:
        ids = np.asarray(page_ids, dtype=np.int64)
        np.add((ids * bpk)[:, None], _arange(bpk), out=row[start:end].reshape(n, bpk), casting="unsafe")
    return end
