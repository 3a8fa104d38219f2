"""The planning layer: a pure compiler pass from descriptors to a frozen :class:`Plan`."""

from graphkv.plan.compile import compile_plan
from graphkv.plan.plan import (BlockSizeChoice, BufferSpec, Capacity, CaptureSizes, CudaGraphPlan, GroupPlan, Ledger,
                               LedgerEntry, Plan, SlotPlan, StaticBuffers)

__all__ = ["BlockSizeChoice", "BufferSpec", "Capacity", "CaptureSizes", "CudaGraphPlan", "GroupPlan", "Ledger",
           "LedgerEntry", "Plan", "SlotPlan", "StaticBuffers", "compile_plan"]
