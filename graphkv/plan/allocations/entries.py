"""What the runtime allocates, as data: one :class:`Allocation` per tensor or array, with its placement.

The planner lists every tensor and array :func:`graphkv.runtime.allocate`, :class:`~graphkv.runtime.Step`
and the flex mask builders create — shape, dtype, where it lives and why it is that size — and the
runtime allocates *from* these entries (:mod:`graphkv.runtime.buffers`), so the two cannot drift.
The layout depends on the device kind the runtime runs on: on a CUDA device, host staging arrays
are pinned twins of device buffers; on a CPU the staging array *is* the buffer and counts once.

Placements, and how :meth:`RuntimeBytes` counts them:

- ``DEVICE``: on the step's device (on a CPU, a torch tensor in host memory: what the forward and
  the kernels read) — ``device_bytes``;
- ``PINNED``: page-locked host memory, the staging side of an asynchronous copy (CUDA only) — ``host_bytes``;
- ``HOST``: pageable host memory (numpy), the host's own bookkeeping — ``host_bytes``.
"""

from __future__ import annotations

import enum
import math

import attrs

from graphkv.errors import Problem, SpecError, UnknownNameError
from graphkv.plan.allocations.rounding import AllocatorCharge, charge_in_order
from graphkv.spec.dtypes import DType

__all__ = ["DEVICE_KINDS", "Allocation", "AllocationPart", "AllocatorBytes", "CudaMemory", "Placement", "RuntimeBytes",
           "check_device_kind"]

DEVICE_KINDS = ("cuda", "cpu")


class Placement(enum.Enum):
    """Where an allocation lives (see the module docstring)."""

    DEVICE = "device"
    PINNED = "pinned"
    HOST = "host"


def check_device_kind(device: object, *, field: str = "device") -> str:
    """``device`` as a device kind, ``"cuda"`` or ``"cpu"`` (``"cuda:1"`` is ``"cuda"``); anything else
    is a :class:`SpecError` naming ``field``."""
    text = str(device).strip().lower() if device is not None else ""
    kind = text.split(":", 1)[0]
    if kind not in DEVICE_KINDS or isinstance(device, bool):
        raise SpecError(Problem(field=field, value=device, limit="must be a device kind the runtime runs on: "
                                                                   "'cuda' or 'cpu'",
                                fix="pass 'cuda' for a GPU runtime or 'cpu' for a CPU one"))
    return kind


@attrs.frozen(kw_only=True)
class AllocationPart:
    """A named view into an allocation: ``shape`` elements from flat element ``offset`` on."""

    name: str
    offset: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Elements of the view."""
        return math.prod(self.shape)


@attrs.frozen(kw_only=True)
class Allocation:
    """One tensor or array the runtime allocates: ``name`` (``owner.what``), ``shape``, ``dtype``,
    ``placement`` and the ``reason`` for its size; ``parts`` name the views the runtime takes of it."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    placement: Placement
    reason: str
    parts: tuple[AllocationPart, ...] = ()

    @property
    def numel(self) -> int:
        """Elements allocated."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes allocated."""
        return self.numel * self.dtype.itemsize

    @property
    def owner(self) -> str:
        """The runtime object that allocates it: the name up to the first dot."""
        return self.name.split(".", 1)[0]

    def part(self, name: str) -> AllocationPart:
        """The view called ``name``; ``KeyError`` when there is none."""
        for p in self.parts:
            if p.name == name:
                return p
        raise UnknownNameError(Problem(field=f"{self.name} part", value=name,
                                       limit="is not one of its parts: " + (", ".join(p.name for p in self.parts)
                                                                          or "(none)"),
                                       fix="use a name from .parts"))

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict (``plan.to_dict()["ledger"]["allocations"]``)."""
        out: dict[str, object] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype.value,
                                  "placement": self.placement.value, "bytes": self.nbytes, "reason": self.reason}
        if self.parts:
            out["parts"] = [{"name": p.name, "offset": p.offset, "shape": list(p.shape)} for p in self.parts]
        return out


@attrs.frozen(kw_only=True)
class RuntimeBytes:
    """Bytes the runtime allocates on one device kind: ``device_bytes`` (on the device, the KV pool
    included) and ``host_bytes`` (pinned staging and pageable host bookkeeping)."""

    device_bytes: int
    host_bytes: int

    @property
    def total_bytes(self) -> int:
        """Device and host bytes together."""
        return self.device_bytes + self.host_bytes

    @classmethod
    def of(cls, allocations: "tuple[Allocation, ...] | list[Allocation]") -> "RuntimeBytes":
        """The sum of ``allocations`` by placement."""
        device = sum(a.nbytes for a in allocations if a.placement is Placement.DEVICE)
        return cls(device_bytes=device, host_bytes=sum(a.nbytes for a in allocations) - device)


@attrs.frozen(kw_only=True)
class AllocatorBytes:
    """Some CUDA allocations as PyTorch's caching allocator counts them
    (:mod:`~graphkv.plan.allocations.rounding`): ``tensor_bytes`` (the tensors' own bytes, as
    :class:`RuntimeBytes` counts them), ``allocated_bytes`` (what ``torch.cuda.memory_allocated``
    grows by) and ``reserved_bytes`` (what ``torch.cuda.memory_reserved`` grows by: new segments)."""

    num_allocations: int
    tensor_bytes: int
    allocated_bytes: int
    reserved_bytes: int

    @property
    def rounding_bytes(self) -> int:
        """``allocated_bytes - tensor_bytes``: the allocator's rounding."""
        return self.allocated_bytes - self.tensor_bytes

    @classmethod
    def of(cls, charges: "tuple[AllocatorCharge, ...] | list[AllocatorCharge]") -> "AllocatorBytes":
        """The sums of ``charges``."""
        return cls(num_allocations=len(charges), tensor_bytes=sum(c.nbytes for c in charges),
                   allocated_bytes=sum(c.allocated_bytes for c in charges),
                   reserved_bytes=sum(c.reserved_bytes for c in charges))


@attrs.frozen(kw_only=True)
class CudaMemory:
    """What ``allocate(plan, "cuda")`` and then ``Step(plan, "cuda")`` add to the caching allocator's
    counters, per phase: ``pool`` (the ``kv_pool.*`` slots) and ``static_buffers`` (the step's device
    buffers, which may fill what the pool's segments left), from the ledger's ``DEVICE`` allocations
    in ledger order; ``names`` and ``charges`` give each allocation's own charge. Exact under the
    conditions of :func:`~graphkv.plan.allocations.rounding.charge_in_order` (default allocator
    settings, no cached free block before the pool, nothing freed in between)."""

    pool: AllocatorBytes
    static_buffers: AllocatorBytes
    names: tuple[str, ...]
    charges: tuple[AllocatorCharge, ...]

    @property
    def allocated_bytes(self) -> int:
        """``memory_allocated`` growth of both phases."""
        return self.pool.allocated_bytes + self.static_buffers.allocated_bytes

    @property
    def reserved_bytes(self) -> int:
        """``memory_reserved`` growth of both phases."""
        return self.pool.reserved_bytes + self.static_buffers.reserved_bytes

    def charge(self, name: str) -> AllocatorCharge:
        """The charge of the allocation called ``name``; ``KeyError`` when it is not a CUDA device buffer."""
        for n, c in zip(self.names, self.charges):
            if n == name:
                return c
        raise UnknownNameError(Problem(field="CUDA device allocation", value=name,
                                       limit="is not one of the ledger's: " + ", ".join(self.names),
                                       fix="use a name from .names"))

    @classmethod
    def of(cls, allocations: "tuple[Allocation, ...] | list[Allocation]") -> "CudaMemory":
        """The charges of the ``DEVICE`` entries of ``allocations`` (a plan's CUDA allocations), in order."""
        device = [a for a in allocations if a.placement is Placement.DEVICE]
        charges = charge_in_order(a.nbytes for a in device)
        is_pool = [a.name.startswith("kv_pool.") for a in device]
        return cls(pool=AllocatorBytes.of([c for c, p in zip(charges, is_pool) if p]),
                   static_buffers=AllocatorBytes.of([c for c, p in zip(charges, is_pool) if not p]),
                   names=tuple(a.name for a in device), charges=charges)
