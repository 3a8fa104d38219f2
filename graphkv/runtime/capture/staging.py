"""Where PIECEWISE pieces read what attention computed eagerly: one staging region shared by every
piece of every key.

A piece after an attention op reads the op's output, which the eager op allocates per call outside
the graph pool. A CUDA graph reads fixed addresses, so the runner keeps a static input there and
copies each call's output into it before replaying. Held per piece and per key, those static inputs
cost (tokens x width) per layer per key: for llama-3.1-8b's 55 mixed keys about 7 GiB. Pieces run
one at a time and a staged input is read only by the piece it was staged for, so every piece of
every key can stage into the same region: :class:`StagingArena` hands out views at the start of one
buffer per (device, dtype), as large as the largest piece's staged inputs (the first key captured).
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["STAGING_ALIGN_BYTES", "StagingArena"]

STAGING_ALIGN_BYTES = 256  # each staged input starts on a 256-byte boundary (vectorised loads, TMA)


def _extent(t: torch.Tensor) -> int:
    """Elements from ``t``'s first to its last addressed element, inclusive (1 for an empty tensor)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)


class StagingArena:
    """One buffer per (device, dtype) from which a piece's staged inputs are views (see the module
    docstring). A request larger than the buffer replaces it by a larger one for later requests;
    views handed out earlier keep the old buffer alive (the graphs captured on them read it)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers held now."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def stage(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Views with each tensor's shape and strides, laid one after another (each aligned to
        :data:`STAGING_ALIGN_BYTES`) at the start of the buffer of its device and dtype, holding a
        copy of its values. Views of one call never overlap; views of different calls may."""
        offsets: list[int] = []
        ends: dict[tuple[torch.device, torch.dtype], int] = {}
        for t in tensors:
            where = (t.device, t.dtype)
            align = max(1, STAGING_ALIGN_BYTES // t.element_size())
            start = -(-ends.get(where, 0) // align) * align
            offsets.append(start)
            ends[where] = start + _extent(t)
        for where, end in ends.items():
            held = self._buffers.get(where)
            if held is None or held.numel() < end:
                self._buffers[where] = torch.empty(end, dtype=where[1], device=where[0])
        views = []
        for t, offset in zip(tensors, offsets):
            view = self._buffers[(t.device, t.dtype)].as_strided(t.shape, t.stride(), offset)
            view.copy_(t)
            views.append(view)
        return views
