"""The live-storage walk counts each buffer once, however many views, aliases and paths reach it."""

from __future__ import annotations

import attrs
import numpy as np
import torch

from graphkv.memory.storages import live_storages
from graphkv.plan.allocations.entries import RuntimeBytes


@attrs.frozen
class _Slotted:
    """An attrs class with slots holding a tensor view."""

    view: torch.Tensor


class _Holder:
    """A plain object holding arrays, views and a closure."""

    def __init__(self) -> None:
        self.base = torch.zeros(100, dtype=torch.int32)  # 400 B
        self.views = [self.base[10:20], self.base.view(10, 10)]
        self.as_numpy = self.base.numpy()[5:50]  # inside the tensor's storage: not counted again
        self.array = np.zeros(7, dtype=np.int64)  # 56 B of numpy
        self.array_view = self.array[2:5]
        self.slotted = _Slotted(self.base[1:3])
        hidden = torch.zeros(3, dtype=torch.float64)  # 24 B, reachable only through a closure
        self.fn = lambda: hidden.sum()
        self.memory = memoryview(np.zeros(4, dtype=np.int16))  # 8 B through a memoryview


def test_views_aliases_and_closures_count_once():
    """400 B tensor (and its numpy view), 24 B in a closure, 56 B + 8 B of numpy: exactly 424 + 64."""
    holder = _Holder()
    counted = live_storages(holder, holder.views, holder)  # reached twice and through several paths
    assert counted.cpu_tensor_bytes == 400 + 24
    assert counted.numpy_bytes == 56 + 8
    assert counted.runtime_bytes("cpu") == RuntimeBytes(device_bytes=424, host_bytes=64)
    assert counted.runtime_bytes("cuda") == RuntimeBytes(device_bytes=0, host_bytes=488)
    assert counted.total_bytes == 488


def test_a_numpy_array_that_views_a_tensor_counts_as_the_tensor():
    """Reached only through its numpy view, a tensor's storage still counts as a torch storage, once."""
    t = torch.zeros(16, dtype=torch.int64)
    counted = live_storages({"a": t.numpy()[3:5], "b": t.numpy()})
    assert (counted.cpu_tensor_bytes, counted.numpy_bytes) == (128, 0)


def test_module_globals_are_not_walked():
    """A function's globals (here this module's, holding big arrays) are not part of what it holds."""
    counted = live_storages(_uses_global)
    assert counted.total_bytes == 0


_BIG = np.zeros(1 << 16, dtype=np.int64)


def _uses_global() -> int:
    """Reads a module global."""
    return int(_BIG[0])


def test_zero_size_and_meta_tensors_hold_nothing():
    """Empty arrays and meta tensors count 0 bytes."""
    counted = live_storages([np.zeros(0), torch.zeros(0), torch.empty(5, device="meta")])
    assert counted.total_bytes == 0
