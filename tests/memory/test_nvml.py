"""The NVML reader against a stand-in NVML module: error paths, units and per-process filtering.

The stand-in is a module object passed as ``nvml=``; nothing global is patched.
"""

from __future__ import annotations

import ctypes
import os
import types

import pytest
import torch

from graphkv.errors import MeasurementError
from graphkv.memory.meters import open_meter
from graphkv.memory.nvml import NOT_AVAILABLE, NvmlReader, NvmlUnavailable

GIB = 1 << 30
ME = os.getpid()


class _Error(Exception):
    """The stand-in's NVMLError."""


class _FunctionNotFound(_Error):
    """The stand-in's NVMLError_FunctionNotFound."""


def fake_nvml(*, init_error: str | None = None, count: int = 1, processes=None, queries=("_v3", "_v2", ""),
              missing=(), query_error: str | None = None, memory_error: str | None = None) -> types.ModuleType:
    """A module with pynvml's function names; ``processes``: (pid, usedGpuMemory) pairs; ``missing``:
    query suffixes that raise FunctionNotFound (an older driver)."""
    m = types.ModuleType("fake_pynvml")
    m.NVMLError, m.NVMLError_FunctionNotFound = _Error, _FunctionNotFound
    m.calls = []

    def init():
        if init_error:
            raise _Error(init_error)

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"

    def memory(h):
        if memory_error:
            raise _Error(memory_error)
        return types.SimpleNamespace(total=80 * GIB, free=80 * GIB - 7 * GIB - 123, used=7 * GIB + 123)

    m.nvmlDeviceGetMemoryInfo = memory
    for suffix in queries:
        def query(h, suffix=suffix):
            m.calls.append(f"query{suffix}")
            if suffix in missing:
                raise _FunctionNotFound("Function Not Found")
            if query_error:
                raise _Error(query_error)
            return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in (processes or [])]
        setattr(m, f"nvmlDeviceGetComputeRunningProcesses{suffix}", query)
    return m


def test_init_failure_says_nvml_is_unavailable_and_why():
    """A missing driver is one line, 'NVML not available: ...', not an exception."""
    got = NvmlReader.open(nvml=fake_nvml(init_error="NVML Shared Library Not Found"))
    assert isinstance(got, NvmlUnavailable)
    assert str(got) == ("NVML not available: nvmlInit failed: NVML Shared Library Not Found (no NVIDIA driver or GPU "
                        "on this machine)")


def test_a_device_index_that_does_not_exist_is_unavailable_and_shuts_nvml_down():
    """Device 2 of one: says so, and NVML is shut down again."""
    nvml = fake_nvml(count=1)
    got = NvmlReader.open(2, nvml=nvml)
    assert str(got) == "NVML not available: device index 2 is not one of the 1 NVIDIA device(s)"
    assert nvml.calls == ["shutdown"]


def test_totals_are_exact_bytes_and_the_name_is_text():
    """80 GiB total, 7 GiB + 123 B used: bytes as NVML gives them (beyond 32 bits, no MiB rounding)."""
    with NvmlReader.open(nvml=fake_nvml()) as reader:
        got = reader.read()
    assert (got.total_bytes, got.used_bytes, got.free_bytes) == (80 * GIB, 7 * GIB + 123, 73 * GIB - 123)
    assert got.name == "NVIDIA H100 80GB HBM3" and got.index == 0


def test_this_process_is_picked_out_of_the_running_processes():
    """Three processes: this pid's 3 GiB is this process's memory; a co-tenant's 5 GiB is not."""
    nvml = fake_nvml(processes=[(123, 5 * GIB), (ME, 3 * GIB + 7), (456, None)])
    with NvmlReader.open(nvml=nvml) as reader:
        got = reader.read()
    assert got.process_bytes() == (3 * GIB + 7, f"NVML running processes, pid {ME}")
    assert got.process_bytes(123) == (5 * GIB, "NVML running processes, pid 123")
    used, why = got.process_bytes(456)
    assert used is None and "no per-process memory for pid 456 (MIG or WDDM)" in why
    used, why = got.process_bytes(999)
    assert used is None and "pid 999 is not among the 3 compute process(es)" in why


@pytest.mark.parametrize("raw", [None, NOT_AVAILABLE, ctypes.c_ulonglong(-1)])
def test_not_available_memory_is_none_never_a_huge_number(raw):
    """usedGpuMemory None, 2**64 - 1 or a ctypes NVML_VALUE_NOT_AVAILABLE: unknown, not 16 EiB."""
    with NvmlReader.open(nvml=fake_nvml(processes=[(ME, raw)])) as reader:
        assert reader.read().process_bytes()[0] is None


def test_ctypes_values_become_ints():
    """A binding that hands back c_ulonglong values still gives plain int bytes."""
    with NvmlReader.open(nvml=fake_nvml(processes=[(ME, ctypes.c_ulonglong(12345678901))])) as reader:
        assert reader.read().process_bytes()[0] == 12345678901


def test_an_older_driver_without_the_v3_query_falls_back_to_v2_and_remembers():
    """_v3 raises FunctionNotFound: _v2 answers, and later reads ask _v2 directly."""
    nvml = fake_nvml(processes=[(ME, GIB)], missing=("_v3",))
    with NvmlReader.open(nvml=nvml) as reader:
        assert reader.read().process_bytes()[0] == GIB
        assert reader.read().process_bytes()[0] == GIB
    assert nvml.calls == ["query_v3", "query_v2", "query_v2", "shutdown"]


def test_bindings_with_only_the_unversioned_query_work():
    """A binding without _v2/_v3 names uses nvmlDeviceGetComputeRunningProcesses."""
    with NvmlReader.open(nvml=fake_nvml(processes=[(ME, 2 * GIB)], queries=("",))) as reader:
        assert reader.read().process_bytes()[0] == 2 * GIB


def test_no_running_processes_query_at_all_says_so():
    """Without any query the processes are unknown, with the reason."""
    with NvmlReader.open(nvml=fake_nvml(queries=())) as reader:
        got = reader.read()
    assert got.processes is None
    assert got.process_bytes() == (None, "NVML's running-processes query is not supported by this driver")


def test_nvml_errors_while_reading_are_measurement_errors():
    """A failing memory query or process query mid-run raises MeasurementError naming the call."""
    with NvmlReader.open(nvml=fake_nvml(memory_error="GPU is lost")) as reader:
        with pytest.raises(MeasurementError, match=r"nvml device 0='NVIDIA H100 80GB HBM3': nvmlDeviceGetMemoryInfo "
                                                   r"failed: GPU is lost; check the GPU with nvidia-smi"):
            reader.read()
    with NvmlReader.open(nvml=fake_nvml(query_error="Unknown Error")) as reader:
        with pytest.raises(MeasurementError, match="nvmlDeviceGetComputeRunningProcesses_v3 failed: Unknown Error"):
            reader.read()


def test_close_is_idempotent_and_a_closed_reader_refuses_to_read():
    """close() twice shuts NVML down once; read() after close is a MeasurementError."""
    nvml = fake_nvml()
    reader = NvmlReader.open(nvml=nvml)
    reader.close()
    reader.close()
    assert nvml.calls == ["shutdown"]
    with pytest.raises(MeasurementError, match="the reader was closed; open a new NvmlReader"):
        reader.read()


def test_on_a_cpu_the_meter_is_live_storages_and_names_why_not_nvml():
    """A CPU run measures live storages and prints NVML's line: unavailable with its reason, or not needed."""
    cpu = torch.device("cpu")
    choice = open_meter(cpu, nvml=fake_nvml(init_error="Driver Not Loaded"))
    assert choice.meter is None and choice.method.startswith("live storages")
    assert choice.nvml_line == "NVML not available: nvmlInit failed: Driver Not Loaded (no NVIDIA driver or GPU on " \
                               "this machine)"
    nvml = fake_nvml()
    choice = open_meter(cpu, nvml=nvml)
    assert choice.nvml_line == "NVML not used: the runtime runs on a CPU (no device memory to read)"
    assert nvml.calls == ["shutdown"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU and NVML may load; the stand-in tests "
                                                      "cover the unavailable path")
def test_the_real_binding_on_this_machine_says_why_nvml_is_unavailable():
    """pynvml imported for real on a machine without an NVIDIA driver: one 'NVML not available' line."""
    got = NvmlReader.open()
    assert isinstance(got, NvmlUnavailable) and str(got).startswith("NVML not available: ")
