"""The planning layer: a pure compiler pass from descriptors to a frozen :class:`Plan`."""

from graphkv.plan.allocations import Allocation, AllocatorBytes, CudaMemory, Placement, RuntimeBytes
from graphkv.plan.compile import compile_plan
from graphkv.plan.graph_pool import GraphKeyEstimate, GraphPoolModel
from graphkv.plan.plan import (BlockSizeChoice, BufferSpec, Capacity, CaptureSizes, CudaGraphPlan, GroupPlan, Ledger,
                               LedgerEntry, Plan, SlotPlan, StaticBuffers)

__all__ = ["Allocation", "AllocatorBytes", "BlockSizeChoice", "BufferSpec", "Capacity", "CaptureSizes", "CudaGraphPlan",
           "CudaMemory", "GraphKeyEstimate", "GraphPoolModel", "GroupPlan", "Ledger", "LedgerEntry", "Placement", "Plan",
           "RuntimeBytes", "SlotPlan", "StaticBuffers", "compile_plan"]
