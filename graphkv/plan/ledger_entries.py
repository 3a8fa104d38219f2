"""The ledger's types: every byte of the KV budget attributed, what sits beside the pool, and the
runtime's allocations per device kind (built by :mod:`graphkv.plan.ledger`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from graphkv.plan.allocations.entries import Allocation, CudaMemory, RuntimeBytes, check_device_kind

if TYPE_CHECKING:
    from graphkv.plan.graph_pool import GraphKeyEstimate

__all__ = ["Ledger", "LedgerEntry"]


@attrs.frozen(kw_only=True)
class LedgerEntry:
    """Bytes attributed to one purpose, with the reason for the number."""

    name: str
    nbytes: int
    reason: str
    in_kv_budget: bool  # True: part of the KV budget; False: allocated beside it
    on_device: bool = True  # False: host memory (pinned staging, host bookkeeping), not GPU memory


@attrs.frozen(kw_only=True)
class Ledger:
    """Step 7: every byte of the KV budget attributed (``kv_entries`` sum to ``budget_bytes``),
    plus what is allocated beside the pool (static buffers, allocator rounding, lazy cuBLAS workspaces, host buffers,
    estimated graph pool).

    ``cpu_allocations`` / ``cuda_allocations``: every tensor and array the runtime allocates on that
    device kind (KV pool, block tables, staging, page ownership, flex masks), which the runtime
    allocates from; ``graph_keys``: the estimated graph memory of each capture key, largest first."""

    budget_bytes: int
    entries: tuple[LedgerEntry, ...]
    cpu_allocations: tuple[Allocation, ...] = ()
    cuda_allocations: tuple[Allocation, ...] = ()
    graph_keys: tuple["GraphKeyEstimate", ...] = ()

    def allocations(self, device: str) -> tuple[Allocation, ...]:
        """Every allocation of the runtime on ``device`` (``"cuda"`` or ``"cpu"``; ``"cuda:1"`` too),
        in the order the runtime makes them. :class:`SpecError` for another device."""
        return self.cuda_allocations if check_device_kind(device) == "cuda" else self.cpu_allocations

    def runtime_bytes(self, device: str) -> RuntimeBytes:
        """What ``allocate(plan, device)`` and ``Step(plan, device)`` allocate, to the byte:
        ``device_bytes`` (on the device, the KV pool included) and ``host_bytes`` (pinned staging and
        host bookkeeping; on a CPU, a staging array that is itself the buffer counts once, as device).

        >>> from graphkv import Budget, FullAttentionSpec, Limits, ModelKV, compile
        >>> model = ModelKV.from_specs("tiny", [(FullAttentionSpec(num_kv_heads=8, head_size=128), "flash_attn")] * 2)
        >>> plan = compile(model, Limits(max_model_len=4096, max_num_seqs=8), Budget.kv_bytes("1GiB"))
        >>> plan.ledger.runtime_bytes("cuda")  # 2 x 512 MiB pool slots + 369300 B of step buffers on the GPU
        RuntimeBytes(device_bytes=1074111124, host_bytes=640041)
        >>> plan.ledger.runtime_bytes("cpu")  # no pinned twins; the host mirror is the persistent table
        RuntimeBytes(device_bytes=1074086136, host_bytes=278849)
        """
        return RuntimeBytes.of(self.allocations(device))

    def cuda_memory(self) -> CudaMemory:
        """What ``allocate(plan, "cuda")`` and then ``Step(plan, "cuda")`` make
        ``torch.cuda.memory_allocated`` and ``torch.cuda.memory_reserved`` grow by: each ``DEVICE``
        allocation of :meth:`allocations` ``("cuda")`` charged by PyTorch's caching allocator (512 B
        blocks, 2 MiB small segments, 20 MiB or 2 MiB-rounded large ones;
        :mod:`~graphkv.plan.allocations.rounding`), in ledger order, from an allocator with no cached
        free block and default settings. :meth:`runtime_bytes` keeps the tensors' own bytes. Pure.

        >>> from graphkv import Budget, FullAttentionSpec, Limits, ModelKV, compile
        >>> model = ModelKV.from_specs("tiny", [(FullAttentionSpec(num_kv_heads=8, head_size=128), "flash_attn")] * 2)
        >>> plan = compile(model, Limits(max_model_len=4096, max_num_seqs=8), Budget.kv_bytes("1GiB"))
        >>> memory = plan.ledger.cuda_memory()
        >>> memory.pool  # two 512 MiB slots, whole multiples of 2 MiB: a segment each # doctest: +NORMALIZE_WHITESPACE
        AllocatorBytes(num_allocations=2, tensor_bytes=1073741824, allocated_bytes=1073741824,
                       reserved_bytes=1073741824)
        >>> memory.static_buffers  # 8 buffers of 369300 B in 512 B blocks, all in one 2 MiB small segment
        AllocatorBytes(num_allocations=8, tensor_bytes=369300, allocated_bytes=371712, reserved_bytes=2097152)
        """
        return CudaMemory.of(self.cuda_allocations)

    @property
    def kv_entries(self) -> tuple[LedgerEntry, ...]:
        """Entries that split the KV budget."""
        return tuple(e for e in self.entries if e.in_kv_budget)

    @property
    def other_entries(self) -> tuple[LedgerEntry, ...]:
        """Entries outside the KV budget."""
        return tuple(e for e in self.entries if not e.in_kv_budget)

    @property
    def beside_pool_device_bytes(self) -> int:
        """GPU bytes allocated beside the KV pool: the runtime's static device buffers on a CUDA device +
        the caching allocator's rounding (the segments ``memory_reserved`` grows by beyond the pool's and
        the static buffers' tensors, :meth:`cuda_memory`) + PyTorch's lazy cuBLAS workspaces + the estimated graph pool (host buffers are
        host memory and do not count)."""
        return sum(e.nbytes for e in self.other_entries if e.on_device)

    @property
    def kv_total_bytes(self) -> int:
        """Sum of the KV-budget entries (equals ``budget_bytes``)."""
        return sum(e.nbytes for e in self.kv_entries)

    @property
    def graph_pool_bytes(self) -> int:
        """The estimated CUDA-graph pool: the sum of :attr:`graph_keys`."""
        return sum(k.nbytes for k in self.graph_keys)
