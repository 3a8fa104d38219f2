"""Read GPU memory through NVML (nvidia-ml-py): the device's total / free / used, and this process's own.

A device-wide free-memory delta counts every other process's allocations as one's own; NVML's
running-processes query (``nvmlDeviceGetComputeRunningProcesses``) says what each process uses, so
a co-tenant neither shrinks nor inflates this process's accounting. The reader copes with what
NVML versions and set-ups return:

- the ``_v3`` / ``_v2`` / unversioned query, whichever the library and driver provide (an older
  driver lacks the ``_v3`` symbol);
- ``usedGpuMemory`` of ``None`` (nvidia-ml-py's conversion) or ``NVML_VALUE_NOT_AVAILABLE``
  (``2**64 - 1``, from older bindings): per-process memory NVML cannot report (MIG, Windows WDDM)
  is ``None`` here, never a huge number;
- this process missing from the list (no CUDA context yet, or a container whose PID namespace
  hides host PIDs): ``None`` with the reason.

All sizes are bytes, as NVML reports them. ``pynvml`` is imported only by :meth:`NvmlReader.open`
(the ``nvml=`` argument takes any module-like object with the same functions, e.g. a stand-in in
tests). Where NVML cannot be used, :meth:`NvmlReader.open` returns :class:`NvmlUnavailable`, whose
one line says why (``NVML not available: ...``).
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from graphkv.errors import MeasurementError, Problem

__all__ = ["NOT_AVAILABLE", "DeviceMemory", "NvmlReader", "NvmlUnavailable", "ProcessMemory"]

NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
_QUERIES = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetComputeRunningProcesses")


@attrs.frozen(kw_only=True)
class ProcessMemory:
    """One process on the device: its pid and the bytes it uses (``None``: NVML cannot say)."""

    pid: int
    used_bytes: int | None


@attrs.frozen(kw_only=True)
class DeviceMemory:
    """One NVML reading of a device: totals in bytes and every compute process on it
    (``processes`` is ``None`` when the running-processes query is unsupported)."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int
    used_bytes: int
    processes: tuple[ProcessMemory, ...] | None

    def process_bytes(self, pid: int | None = None) -> tuple[int | None, str]:
        """Bytes process ``pid`` (default: this one) uses on the device, or ``None``, with the reason."""
        pid = os.getpid() if pid is None else pid
        if self.processes is None:
            return None, "NVML's running-processes query is not supported by this driver"
        for p in self.processes:
            if p.pid == pid:
                if p.used_bytes is None:
                    return None, f"NVML reports no per-process memory for pid {pid} (MIG or WDDM)"
                return p.used_bytes, f"NVML running processes, pid {pid}"
        return None, (f"pid {pid} is not among the {len(self.processes)} compute process(es) NVML lists (no CUDA "
                      "context yet, or a container PID namespace hides host PIDs)")


@attrs.frozen
class NvmlUnavailable:
    """Why NVML cannot be read here; ``str()`` is the one line to print."""

    reason: str

    def __str__(self) -> str:
        return f"NVML not available: {self.reason}"


def _bytes(value: Any) -> int | None:
    """NVML's usedGpuMemory as bytes: ``None`` for not-available (``None`` or ``2**64 - 1``)."""
    if value is None:
        return None
    value = int(getattr(value, "value", value))  # a ctypes c_ulonglong from some bindings
    return None if value >= NOT_AVAILABLE or value < 0 else value


class NvmlReader:
    """An initialized NVML handle on one device; open it with :meth:`open`, read with :meth:`read`,
    and :meth:`close` it (or use it as a context manager)."""

    def __init__(self, nvml: Any, handle: Any, index: int, name: str) -> None:
        self._nvml, self._handle, self.index, self.name = nvml, handle, index, name
        self._error = getattr(nvml, "NVMLError", Exception)
        self._query: str | None = None  # the running-processes function that works, once found
        self._closed = False

    @classmethod
    def open(cls, index: int = 0, *, nvml: Any = None) -> "NvmlReader | NvmlUnavailable":
        """NVML on device ``index``, or :class:`NvmlUnavailable` saying why not (nvidia-ml-py not
        installed, no driver, no such device). ``nvml``: the module to use (default ``import pynvml``)."""
        if nvml is None:
            try:
                import pynvml as nvml  # noqa: PLC0415 - the runtime extra's NVML binding, imported only here
            except ImportError:
                return NvmlUnavailable("nvidia-ml-py is not installed (pip install 'graphkv[runtime]')")
        error = getattr(nvml, "NVMLError", Exception)
        try:
            nvml.nvmlInit()
        except error as e:
            return NvmlUnavailable(f"nvmlInit failed: {e} (no NVIDIA driver or GPU on this machine)")
        try:
            count = int(nvml.nvmlDeviceGetCount())
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
                nvml.nvmlShutdown()
                return NvmlUnavailable(f"device index {index!r} is not one of the {count} NVIDIA device(s)")
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
        except error as e:
            nvml.nvmlShutdown()
            return NvmlUnavailable(f"device {index}: {e}")
        return cls(nvml, handle, index, name.decode() if isinstance(name, bytes) else str(name))

    def read(self) -> DeviceMemory:
        """One reading: the device's memory info and its compute processes. Raises
        :class:`MeasurementError` when NVML fails (e.g. the device went away)."""
        if self._closed:
            raise MeasurementError(Problem(field="nvml", value="closed", limit="the reader was closed",
                                           fix="open a new NvmlReader"))
        try:
            info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            total, free, used = (int(getattr(info, f)) for f in ("total", "free", "used"))
        except self._error as e:
            raise MeasurementError(Problem(field=f"nvml device {self.index}", value=self.name,
                                           limit=f"nvmlDeviceGetMemoryInfo failed: {e}",
                                           fix="check the GPU with nvidia-smi, or measure without NVML")) from None
        return DeviceMemory(index=self.index, name=self.name, total_bytes=total, free_bytes=free, used_bytes=used,
                            processes=self._processes())

    def _processes(self) -> tuple[ProcessMemory, ...] | None:
        """Every compute process on the device, through the newest query that works here."""
        names = (self._query,) if self._query is not None else _QUERIES
        for name in names:
            fn = getattr(self._nvml, name, None)
            if fn is None:
                continue
            try:
                raw = fn(self._handle)
            except self._error as e:
                if _missing_function(self._nvml, e):
                    continue  # an older driver without this version of the query
                raise MeasurementError(Problem(field=f"nvml device {self.index}", value=self.name,
                                               limit=f"{name} failed: {e}",
                                               fix="check the GPU with nvidia-smi, or measure without NVML")) from None
            self._query = name
            return tuple(ProcessMemory(pid=int(p.pid), used_bytes=_bytes(p.usedGpuMemory)) for p in raw)
        return None

    def close(self) -> None:
        """Shut NVML down (once)."""
        if not self._closed:
            self._closed = True
            try:
                self._nvml.nvmlShutdown()
            except self._error:
                pass  # shutting down a handle that already failed changes nothing for the caller

    def __enter__(self) -> "NvmlReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _missing_function(nvml: Any, error: BaseException) -> bool:
    """Whether ``error`` says the driver lacks the called function (try an older query)."""
    missing = tuple(c for c in (getattr(nvml, "NVMLError_FunctionNotFound", None),
                                getattr(nvml, "NVMLError_NotSupported", None)) if isinstance(c, type))
    if missing and isinstance(error, missing):
        return True
    code = getattr(error, "value", None)
    return code is not None and code in (getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
                                          getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3))
