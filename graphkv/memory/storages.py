"""Sum the memory that live objects hold, independently of any ledger: walk them and add up storages.

:func:`live_storages` walks everything reachable from the given roots — attributes, ``__slots__``,
containers, closures of functions held as attributes, memoryviews — and records every torch
tensor's storage and every numpy array's owning buffer as an address range. Ranges are merged, so
views, aliases (a numpy view of a torch tensor, a tensor viewing another's storage) and objects
reached twice count once. It never reads module globals (a function's globals are not walked).

This is the measurement of last resort on a CPU (no NVML, no CUDA allocator statistics), and the
independent check that a plan's ledger equals what the runtime allocates.

Example (the tiny hybrid "MAMA" on a CPU: what its pool and step hold is what the ledger says)::

    >>> import graphkv
    >>> from graphkv.models.tiny_hybrid import TinyHybridConfig, model_kv
    >>> plan = graphkv.compile(model_kv(TinyHybridConfig(pattern="MAMA")), graphkv.Limits(
    ...     max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32, num_blocks_override=8))
    >>> from graphkv.runtime import Step, allocate
    >>> pool, step = allocate(plan, "cpu"), Step(plan, "cpu")
    >>> live_storages(pool, step).cpu_tensor_bytes, plan.ledger.runtime_bytes("cpu").device_bytes
    (70156, 70156)
"""

from __future__ import annotations

import gc
import types
from typing import Any, Iterable

import attrs

from graphkv.plan.allocations.entries import RuntimeBytes

__all__ = ["StorageSum", "live_storages"]

_SKIP_TYPES = (type, types.ModuleType, types.CodeType, types.FrameType, types.BuiltinFunctionType, str, bytes,
               int, float, complex, bool, type(None))


@attrs.frozen(kw_only=True)
class StorageSum:
    """Distinct bytes held, by kind of memory."""

    cuda_bytes: int  # torch storages on CUDA devices
    cpu_tensor_bytes: int  # torch storages in pageable host memory
    pinned_bytes: int  # torch storages in page-locked host memory
    numpy_bytes: int  # numpy buffers not inside a torch storage
    num_storages: int  # distinct address ranges counted

    def runtime_bytes(self, device: str) -> RuntimeBytes:
        """These bytes as a runtime on ``device`` (``"cuda"`` or ``"cpu"``) counts them, comparable with
        ``plan.ledger.runtime_bytes(device)``: on a CPU, torch tensors are the device's buffers and numpy
        arrays host bookkeeping; on CUDA, everything in host memory is host."""
        if device == "cuda":
            return RuntimeBytes(device_bytes=self.cuda_bytes,
                                host_bytes=self.cpu_tensor_bytes + self.pinned_bytes + self.numpy_bytes)
        return RuntimeBytes(device_bytes=self.cpu_tensor_bytes, host_bytes=self.pinned_bytes + self.numpy_bytes)

    @property
    def total_bytes(self) -> int:
        """Every byte counted."""
        return self.cuda_bytes + self.cpu_tensor_bytes + self.pinned_bytes + self.numpy_bytes


def _union(ranges: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """Bytes covered by ``[start, end)`` ranges, and how many disjoint runs they form."""
    total, runs, end = 0, 0, -1
    for lo, hi in sorted(ranges):
        if hi <= lo:
            continue
        if lo >= end:
            total += hi - lo
            runs += 1
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total, runs


def _children(obj: Any) -> Iterable[Any]:
    if isinstance(obj, dict):
        return list(obj.keys()) + list(obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return obj
    if isinstance(obj, memoryview):
        return (obj.obj,)
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        if isinstance(obj, types.MethodType):
            return (obj.__self__, obj.__func__)
        return [c.cell_contents for c in (obj.__closure__ or ()) if _filled(c)] + list(obj.__defaults__ or ())
    out: list[Any] = []
    if hasattr(obj, "__dict__") and isinstance(vars(obj), dict):
        out += vars(obj).values()
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if isinstance(name, str) and name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                out.append(getattr(obj, name))
    if not out and type(obj).__module__.split(".")[0] not in ("torch", "numpy", "builtins"):
        out += [r for r in gc.get_referents(obj) if not isinstance(r, (dict, types.ModuleType))]
    return out


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def live_storages(*roots: Any) -> StorageSum:
    """The distinct storage bytes reachable from ``roots`` (see the module docstring). Imports torch
    and numpy only if they are already imported (an object holding neither needs neither)."""
    import sys

    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    cuda: list[tuple[int, int]] = []
    cpu: list[tuple[int, int]] = []
    pinned: list[tuple[int, int]] = []
    arrays: list[tuple[int, int]] = []
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SKIP_TYPES):
            continue
        seen.add(id(obj))
        if torch is not None and isinstance(obj, torch.Tensor):
            if obj.device.type == "meta":
                continue
            storage = obj.untyped_storage()
            span = (storage.data_ptr(), storage.data_ptr() + storage.nbytes())
            if obj.device.type == "cuda":
                cuda.append(span)
            elif obj.device.type == "cpu":
                (pinned if obj.is_pinned() else cpu).append(span)
            continue
        if np is not None and isinstance(obj, np.ndarray):
            root = obj
            while isinstance(root.base, np.ndarray):
                root = root.base
            if root.base is None:  # owns its buffer
                arrays.append((root.ctypes.data, root.ctypes.data + root.nbytes))
            else:  # a view of something else (a torch tensor, a memoryview): count that
                stack.append(root.base)
                lo, hi = np.lib.array_utils.byte_bounds(root)
                arrays.append((lo, hi))
            continue
        stack.extend(_children(obj))
    cuda_bytes, n_cuda = _union(cuda)
    cpu_bytes, n_cpu = _union(cpu)
    pinned_bytes, n_pinned = _union(pinned)
    host_all, n_host = _union(cpu + pinned + arrays)
    return StorageSum(cuda_bytes=cuda_bytes, cpu_tensor_bytes=cpu_bytes, pinned_bytes=pinned_bytes,
                      numpy_bytes=host_all - cpu_bytes - pinned_bytes, num_storages=n_cuda + n_host)
