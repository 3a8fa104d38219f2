"""The runtime's allocations as ledger entries, computed by the planner (pure, no torch).

:mod:`~graphkv.plan.allocations.entries` holds the types; :mod:`~graphkv.plan.allocations.runtime`
lists every allocation of a plan on a device kind (KV pool, block tables, step staging, page
ownership, flex mask builders); the runtime allocates from these entries.
"""

from graphkv.plan.allocations.entries import (DEVICE_KINDS, Allocation, AllocationPart, Placement, RuntimeBytes,
                                              check_device_kind)

__all__ = ["DEVICE_KINDS", "Allocation", "AllocationPart", "Placement", "RuntimeBytes", "check_device_kind"]
