"""Allocate the runtime's tensors and arrays from the plan's ledger entries, each exactly once.

Every persistent tensor and array of the runtime is an :class:`~graphkv.plan.allocations.Allocation`
the planner computed (shape, dtype, placement, reason); the runtime objects take theirs by name
from a :class:`LedgerBuffers`, so the ledger's bytes are what is allocated — one source of truth
for the shapes. ``DEVICE`` entries become zeroed tensors on the device, ``PINNED`` entries zeroed
page-locked host tensors (plain host tensors when the device is not CUDA), ``HOST`` entries zeroed
numpy arrays. Views named in an entry's parts come from :meth:`LedgerBuffers.part`.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

from graphkv.plan.allocations.entries import Allocation, Placement, check_device_kind
from graphkv.plan.plan import Plan

__all__ = ["LedgerBuffers"]


class LedgerBuffers:
    """The allocations ``allocations`` (by name), materialized on ``device`` when taken."""

    def __init__(self, allocations: Iterable[Allocation], device: torch.device) -> None:
        self.device = device
        self._entries = {a.name: a for a in allocations}
        self._taken: dict[str, "torch.Tensor | np.ndarray"] = {}

    @classmethod
    def of_plan(cls, plan: Plan, device: torch.device, prefixes: tuple[str, ...], *,
                layout: str | None = None) -> "LedgerBuffers":
        """``plan``'s allocations whose names start with one of ``prefixes``, in the layout of device kind
        ``layout`` (default: ``device``'s own; e.g. ``"cuda"`` for the staged block tables on a CPU)."""
        kind = check_device_kind(layout if layout is not None else device.type)
        return cls((a for a in plan.ledger.allocations(kind) if a.name.startswith(prefixes)), device)

    def tensor(self, name: str) -> torch.Tensor:
        """Allocate entry ``name`` (``DEVICE`` or ``PINNED``) as a zeroed tensor; once per name."""
        a = self._entries[name]
        assert a.placement is not Placement.HOST and name not in self._taken, name
        if a.placement is Placement.PINNED:
            out = torch.zeros(a.shape, dtype=a.dtype.to_torch(), pin_memory=self.device.type == "cuda")
        else:
            out = torch.zeros(a.shape, dtype=a.dtype.to_torch(), device=self.device)
        self._taken[name] = out
        return out

    def array(self, name: str) -> np.ndarray:
        """Allocate entry ``name`` (``HOST``) as a zeroed numpy array; once per name."""
        a = self._entries[name]
        assert a.placement is Placement.HOST and name not in self._taken, name
        out = np.zeros(a.shape, dtype=np.dtype(a.dtype.value))
        self._taken[name] = out
        return out

    def part(self, name: str, part: str) -> "torch.Tensor | np.ndarray":
        """The view ``part`` of the taken entry ``name`` (its shape; a 0-d view for ``()``)."""
        p = self._entries[name].part(part)
        flat = self._taken[name].reshape(-1)
        return flat[p.offset:p.offset + p.numel].reshape(p.shape)

    def taken(self) -> tuple[Allocation, ...]:
        """The entries allocated so far, in ledger order."""
        return tuple(a for n, a in self._entries.items() if n in self._taken)

    def untaken(self) -> list[str]:
        """Entries not allocated yet (empty once the owner has built everything)."""
        return [n for n in self._entries if n not in self._taken]
