"""Memory: what the runtime really holds, measured three ways, and the benchmark that sets it beside the plan.

- :mod:`~graphkv.memory.nvml` — :class:`NvmlReader`: device total / free / used and each process's
  own memory through NVML (nvidia-ml-py, imported only when opened); :class:`NvmlUnavailable` says why not;
- :mod:`~graphkv.memory.meters` — :func:`open_meter`: NVML per process, else torch.cuda statistics,
  else (a CPU) live storages, naming the method used;
- :mod:`~graphkv.memory.storages` — :func:`live_storages`: the tensors and arrays reachable from
  objects, summed by address (independent of any ledger);
- :mod:`~graphkv.memory.graph_pool_reader` — each capture key's memory read through the capture's own
  pool (reserved, kept, peak) on a GPU;
- :mod:`~graphkv.memory.held_out` — the graph-memory model checked on keys left out of its fit;
- :mod:`~graphkv.memory.preset_forward`, :mod:`~graphkv.memory.depth_fit` — a preset's real shapes at
  two reduced depths through graphkv.hf, extrapolated to its own depth;
- :mod:`~graphkv.memory.bench`, :mod:`~graphkv.memory.command` — ``graphkv bench memory``.

Names are imported lazily, so ``import graphkv.memory`` imports neither torch nor pynvml.
"""

from __future__ import annotations

from graphkv._lazy import lazy_exports

__all__ = ["DeviceMemory", "MemoryBenchOptions", "NvmlReader", "NvmlUnavailable", "StorageSum", "bench_memory",
           "live_storages", "open_meter"]

_LAZY = {
    "DeviceMemory": "graphkv.memory.nvml",
    "NvmlReader": "graphkv.memory.nvml",
    "NvmlUnavailable": "graphkv.memory.nvml",
    "StorageSum": "graphkv.memory.storages",
    "live_storages": "graphkv.memory.storages",
    "open_meter": "graphkv.memory.meters",
    "MemoryBenchOptions": "graphkv.memory.command",
    "bench_memory": "graphkv.memory.command",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
