"""The runtime's allocations as ledger entries, computed by the planner (pure, no torch).

:mod:`~graphkv.plan.allocations.entries` holds the types; :mod:`~graphkv.plan.allocations.runtime`
lists every allocation of a plan on a device kind (KV pool, block tables, step staging, page
ownership, flex mask builders); the runtime allocates from these entries;
:mod:`~graphkv.plan.allocations.rounding` models what PyTorch's CUDA caching allocator charges for them
(:class:`CudaMemory`, ``plan.ledger.cuda_memory()``).
"""

from graphkv.plan.allocations.entries import (DEVICE_KINDS, Allocation, AllocationPart, AllocatorBytes, CudaMemory,
                                              Placement, RuntimeBytes, check_device_kind)
from graphkv.plan.allocations.rounding import AllocatorCharge, AllocatorPool

__all__ = ["DEVICE_KINDS", "Allocation", "AllocationPart", "AllocatorBytes", "AllocatorCharge", "AllocatorPool",
           "CudaMemory", "Placement", "RuntimeBytes", "check_device_kind"]
