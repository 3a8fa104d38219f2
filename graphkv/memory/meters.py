"""How this process's device memory is measured, in order of preference, each naming itself.

1. **NVML, per process** (:class:`NvmlProcessMeter`): the bytes NVML's running-processes query
   reports for this pid — everything the process holds on the GPU (CUDA context, caching
   allocator segments, graph memory the driver keeps), and nothing a co-tenant holds.
2. **torch.cuda statistics** (:class:`TorchCudaMeter`): the caching allocator's reserved bytes of
   this process, when NVML cannot be read or cannot see this pid; it misses the CUDA context and
   driver-side graph memory.
3. **Live storages** (:func:`graphkv.memory.storages.live_storages`) on a CPU, where there is no
   device: the runtime's tensors and arrays summed by address (the caller passes the objects).

:func:`open_meter` picks the first that works and says why the others did not.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import attrs

from graphkv.memory.nvml import NvmlReader, NvmlUnavailable

__all__ = ["DeviceMeter", "MeterChoice", "NvmlProcessMeter", "TorchCudaMeter", "open_meter"]

LIVE_STORAGES = "live storages (the runtime's tensors and arrays, summed by address)"


class DeviceMeter(Protocol):
    """Reads this process's device memory in bytes; ``method`` names how."""

    method: str

    def read(self) -> int:
        """Bytes this process holds on the device now."""
        ...  # pragma: no cover - a protocol

    def close(self) -> None:
        """Release what the meter holds."""
        ...  # pragma: no cover - a protocol


class NvmlProcessMeter:
    """NVML's per-process used memory of this pid on one device."""

    def __init__(self, reader: NvmlReader, pid: int | None = None) -> None:
        self._reader = reader
        self._pid = os.getpid() if pid is None else pid
        self.method = f"NVML per-process used memory (pid {self._pid}, device {reader.index})"

    def read(self) -> int:
        """This pid's bytes now (0 before the process has a context on the device)."""
        used, _ = self._reader.read().process_bytes(self._pid)
        return used or 0

    def close(self) -> None:
        """Shut NVML down."""
        self._reader.close()


class TorchCudaMeter:
    """torch's caching-allocator bytes of this process on one CUDA device."""

    method = "torch.cuda.memory_reserved (this process's caching allocator; misses the CUDA context and " \
             "driver-side graph memory)"

    def __init__(self, device: Any) -> None:
        self._device = device

    def read(self) -> int:
        """Reserved bytes now (after a synchronize)."""
        import torch

        torch.cuda.synchronize(self._device)
        return int(torch.cuda.memory_reserved(self._device))

    def close(self) -> None:
        """Nothing to release."""


@attrs.frozen(kw_only=True)
class MeterChoice:
    """The meter chosen for a device (``None`` on a CPU: measure live storages), the NVML line
    (``None`` when NVML was used) and the method's name."""

    meter: DeviceMeter | None
    nvml_line: str | None
    method: str


def open_meter(device: Any, *, nvml: Any = None) -> MeterChoice:
    """The best meter for ``device`` (a ``torch.device``): NVML per process, else torch.cuda
    statistics on a GPU, else live storages on a CPU. ``nvml``: the NVML module (default pynvml)."""
    index = device.index if getattr(device, "index", None) is not None else 0
    reader = NvmlReader.open(index if device.type == "cuda" else 0, nvml=nvml)
    if device.type != "cuda":
        line = str(reader) if isinstance(reader, NvmlUnavailable) else \
            "NVML not used: the runtime runs on a CPU (no device memory to read)"
        if not isinstance(reader, NvmlUnavailable):
            reader.close()
        return MeterChoice(meter=None, nvml_line=line, method=LIVE_STORAGES)
    if isinstance(reader, NvmlUnavailable):
        meter = TorchCudaMeter(device)
        return MeterChoice(meter=meter, nvml_line=str(reader), method=meter.method)
    import torch

    torch.empty(1, device=device)  # this process has a CUDA context on the device from here on
    torch.cuda.synchronize(device)
    used, why = reader.read().process_bytes()
    if used is None:  # per-process memory not reported (MIG, WDDM), or this pid invisible (a PID namespace)
        reader.close()
        meter = TorchCudaMeter(device)
        return MeterChoice(meter=meter, nvml_line=f"NVML per-process memory not available: {why}", method=meter.method)
    nvml_meter = NvmlProcessMeter(reader)
    return MeterChoice(meter=nvml_meter, nvml_line=None, method=nvml_meter.method)
