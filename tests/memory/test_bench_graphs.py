"""`graphkv bench memory`'s graph rows on a CPU: synthetic pool measurements become rows, notes and a calibration,
and the capture's reads happen where they must (torch.cuda faked: lazy workspaces, then each key's capture)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import graphkv
from graphkv.plan.allocations.blas_workspaces import blas_workspaces
from graphkv.memory.bench import LAZY_WORKSPACES, PhaseRow, _capture, graph_rows
from graphkv.memory.graph_pool_reader import CaptureMemory, KeyMemory, PoolUsage
from graphkv.memory.meters import MeterChoice
from graphkv.memory.progress import Progress
from graphkv.models.demo import DemoOptions, demo_plan
from graphkv.models.tiny_hybrid import TinyHybridConfig, model_kv
from graphkv.plan.graph_keys import capture_keys
from graphkv.spec.budget import Budget

from fake_cuda_memory import MIB, POOL, FakeAllocator

LAZY = 34_603_008  # cuBLAS 32 MiB + cuBLASLt 1 MiB on Hopper: what an H200 measured (torch 2.11)
DEMO_KEYS = (8, 4, 2, 1)  # the demo's decode keys (token counts), largest first


def _kept(n):
    return 1000 + 10 * n


def _captured(process_bytes=None):
    """Keys 8, 4, 2, 1 keeping 1000 + 10 n B; the first peaking 300 B x 8 above what it keeps; one 2 MiB segment."""
    keys = tuple(KeyMemory(num_tokens=n, uniform=True, peak_bytes=_kept(n) + (300 * n if n == 8 else 0),
                           kept_bytes=_kept(n), reserved_bytes=2 * MIB if n == 8 else 0, pool_kept_bytes=_kept(n))
                 for n in DEMO_KEYS)
    pool = PoolUsage(reserved_bytes=2 * MIB, allocated_bytes=sum(_kept(n) for n in DEMO_KEYS))
    return CaptureMemory(keys=keys, lazy_workspace_bytes=LAZY, process_bytes=process_bytes, pool=pool)


def _rows(plan, captured, lazy_workspace_bytes=0):
    return graph_rows(plan, captured, why="not measured: CUDA graphs need a GPU",
                      hidden_size=TinyHybridConfig().hidden_size, lazy_workspace_bytes=lazy_workspace_bytes,
                      device="cuda:0", process_method="NVML per-process used memory")


def test_each_key_row_is_what_it_keeps_and_the_first_adds_its_workspace():
    """A lazy workspaces row first (its prediction as given), then keys 8, 4, 2, 1: 2 MiB (the first key's footprint:
    the segment it opened, more than its 3,480 B peak), 1,040, 1,020, 1,010 B with peak, kept and reserved in
    memory.json; notes compare the pool and name the process meter's growth."""
    plan = demo_plan(DemoOptions())
    graphs = _rows(plan, _captured(process_bytes=40 * MIB))
    lazy, *keys = graphs.rows
    assert (lazy.phase, lazy.predicted_bytes, lazy.measured_bytes, lazy.num_tokens) == (LAZY_WORKSPACES, 0, LAZY, None)
    assert [r.phase for r in keys] == [f"graph_pool decode({n})" for n in DEMO_KEYS]
    assert [r.measured_bytes for r in keys] == [2 * MIB, 1040, 1020, 1010]
    assert [r.predicted_bytes for r in keys] == [e.nbytes for e in plan.ledger.graph_keys]
    assert keys[0].to_dict("tiny-hybrid") == {
        "model": "tiny-hybrid", "phase": "graph_pool decode(8)", "predicted_bytes": plan.ledger.graph_keys[0].nbytes,
        "measured_bytes": 2 * MIB, "method": "capture pool (memory_snapshot): footprint (its peak, "
                                             "max_memory_allocated, or the segments it opened, whichever is more)",
        "measured_reserved_bytes": 2 * MIB, "measured_peak_bytes": 3480, "measured_kept_bytes": 1080}
    assert keys[1].method == "capture pool (memory_snapshot): kept" and keys[1].reserved_note is None
    model_sum = sum(e.nbytes for e in plan.ledger.graph_keys)
    assert graphs.notes == (
        f"graph_pool (pool reserved): the capture pool's segments hold 2,097,152 B (4,150 B allocated) after 4 captured "
        f"keys; their rows sum to 2,100,222 B measured, the model to {model_sum:,} B ({2 * MIB - model_sum:+,} B reserved "
        "vs the model)",
        "warming up and capturing every key cost this process 41,943,040 B of device memory (NVML per-process used "
        "memory; NVML adds the graphs' driver-side memory to the pool and the lazy workspaces)",
        "held-out keys: the model fitted to every other key predicts the other 2 keys' kept bytes; furthest "
        "decode(4): 1,040 B measured, 1,040 B predicted (+0 B, +0.00 %) — within the bar of 5 % or 64 KiB")
    assert graphs.held_out == graphs.notes[-1]


def test_the_fit_follows_the_rows_and_a_plan_calibrated_by_it_predicts_them_exactly():
    """Fitted: 1000 B per graph, 10 B outputs and (2 MiB - 1080 B) / 8 = 262,009 B workspace per token (the first key's
    2 MiB segment), the lazy workspace as measured; the demo
    compiled with it predicts every graph row to the byte, and PyTorch's workspace rule for Hopper the lazy row."""
    plan = demo_plan(DemoOptions())
    fitted = _rows(plan, _captured()).calibration
    assert fitted is not None and fitted.calibrated and fitted.hidden_size == 64
    assert (fitted.per_graph_bytes, fitted.output_bytes_per_token, fitted.workspace_bytes_per_token,
            fitted.lazy_workspace_bytes) == (1000.0, 10.0, 262009.0, float(LAZY))
    assert fitted.source == "fitted to 4 keys of tiny-hybrid on cuda:0"
    calibrated = graphkv.compile(model_kv(TinyHybridConfig()), plan.limits, Budget.kv_bytes(DemoOptions().kv_memory),
                                 graph_pool=fitted)
    again = _rows(calibrated, _captured(), lazy_workspace_bytes=blas_workspaces("sm_90", num_streams=1).allocated_bytes_per_stream)
    assert all(r.predicted_bytes == r.measured_bytes for r in again.rows)


def test_unmeasured_graph_rows_say_why_and_fit_nothing():
    """No capture (a CPU): one row per key, measured None with the reason, no lazy row, no calibration, no note."""
    plan = demo_plan(DemoOptions())
    graphs = _rows(plan, None)
    assert [r.measured_bytes for r in graphs.rows] == [None] * 4 and graphs.calibration is None and not graphs.notes
    assert all(r.method == "not measured: CUDA graphs need a GPU" for r in graphs.rows)
    assert set(graphs.rows[0].to_dict("m")) == {"model", "phase", "predicted_bytes", "measured_bytes", "method"}


def test_a_row_with_only_reserved_bytes_writes_them_without_a_prediction():
    """A graph row's reserved bytes go to memory.json without predicted_reserved_bytes (none is predicted)."""
    row = PhaseRow(phase="graph_pool decode(1)", predicted_bytes=128, measured_bytes=512, method="m", num_tokens=1,
                   uniform=True, measured_reserved_bytes=0, measured_peak_bytes=512, measured_kept_bytes=512)
    assert row.to_dict("m") == {"model": "m", "phase": "graph_pool decode(1)", "predicted_bytes": 128,
                                "measured_bytes": 512, "method": "m", "measured_reserved_bytes": 0,
                                "measured_peak_bytes": 512, "measured_kept_bytes": 512}


class _Stream:
    """A stand-in for torch.cuda.Stream (the capture stream and torch's current stream)."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass


class _Meter:
    """A process meter (as NVML's) over the fake allocator."""

    method = "fake meter"

    def __init__(self, allocator):
        self.allocator = allocator

    def read(self):  # the allocator's bytes plus 1 MiB of driver-side memory per captured graph
        return self.allocator.allocated + MIB * self.allocator.num_graphs


def test_capture_warms_workspaces_on_the_capture_stream_then_reads_the_pool_around_each_key(monkeypatch):
    """The workspace warm-up and every key's warm-up land in the lazy row; each key's capture runs on the same
    stream into the pool read around it: kept 1000 + 10 n B, the first peaking 300 B x 8 above it."""
    from graphkv.memory import bench
    from graphkv.runtime import Step, allocate
    from graphkv.runtime.capture import piecewise

    plan = demo_plan(DemoOptions())
    kv, step = allocate(plan, "cpu"), Step(plan, "cpu")
    fake = FakeAllocator().install(monkeypatch)
    streams, entered, log = [], [], []

    def warm(stream, dtype, device):
        streams.append(stream)
        log.append(("warm", dtype))
        fake.allocate(LAZY)

    def forward(input_ids):
        if not any(event == "forward" for event, _ in log):  # lazy state allocated on the first call (a warm-up)
            fake.allocate(4096)
        log.append(("forward", input_ids.shape[0]))
        return torch.zeros(input_ids.shape[0], 4)

    def capture_graph(fn, pool, stream=None, *, release_workspaces=True):
        assert pool == POOL and stream is streams[0], "every key on the capture stream, into the measured pool"
        outputs = fn()
        n = outputs.shape[0]
        assert not release_workspaces, "the stream's workspaces were primed into the pool before the first key"
        fake.capture(workspace_bytes=300 * n if n == 8 else 0, kept_bytes=_kept(n), new_segment=n == 8)
        return object(), outputs

    for name, value in {"graph_pool_handle": lambda: POOL, "Stream": _Stream, "current_stream": _Stream,
                        "stream": lambda s: entered.append(s) or contextlib.nullcontext(),
                        "is_available": lambda: True}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(bench, "_warm_workspaces", warm)
    monkeypatch.setattr(piecewise, "capture_graph", capture_graph)
    monkeypatch.setattr(piecewise, "prime_blas_workspaces",
                        lambda pool, stream: log.append(("prime", pool is POOL and stream is streams[0])))
    monkeypatch.setattr(piecewise, "graph_device", lambda device: True)
    before = _Meter(fake).read()
    keys = capture_keys(plan.cudagraph, plan.limits)
    captured = _capture(plan, torch.device("cpu"), MeterChoice(meter=_Meter(fake), nvml_line=None, method="fake"),
                        kv, step, lambda pool, s: forward, Progress(False), keys)
    assert log[0] == ("warm", torch.float32) and len(streams) == 1
    assert log.count(("prime", True)) == 1 and log.index(("prime", True)) == 5  # after the workspace and 4 key warm-ups
    assert len(entered) == 4 and all(s is streams[0] for s in entered)  # every key warmed up on the capture stream
    assert captured.lazy_workspace_bytes == LAZY + 4096
    assert captured.keys == _captured().keys
    assert captured.pool == PoolUsage(reserved_bytes=2 * MIB, allocated_bytes=sum(_kept(n) for n in (8, 4, 2, 1)))
    graphs_bytes = captured.pool.allocated_bytes + 4 * MIB  # what they keep, and 1 MiB of driver memory each
    assert captured.process_bytes == _Meter(fake).read() - before == LAZY + 4096 + graphs_bytes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the demo's capture into a real pool (the "
                                                           "tests above check the same logic with faked reads)")
def test_the_demo_capture_reads_its_pool_on_a_gpu():
    """On a GPU: every key keeps >= 0 B, reserves whole 2 MiB granules, the first peaks at least what it keeps, and
    its row is its footprint: at least its peak and the segments it opened."""
    from graphkv.memory.command import MemoryBenchOptions, bench_memory

    run = bench_memory(MemoryBenchOptions(models=("demo",), device="cuda", progress=False))[0]
    keys = [r for r in run.rows if r.num_tokens is not None]
    assert keys and all(r.measured_kept_bytes is not None and r.measured_kept_bytes >= 0 for r in keys)
    assert all(r.measured_reserved_bytes is not None and r.measured_reserved_bytes % (2 * MIB) == 0 for r in keys)
    assert keys[0].measured_peak_bytes >= keys[0].measured_kept_bytes
    assert keys[0].measured_bytes >= max(keys[0].measured_peak_bytes, keys[0].measured_reserved_bytes)
    lazy = next(r for r in run.rows if r.phase == LAZY_WORKSPACES)
    # PyTorch's rule for one stream (cuBLAS + cuBLASLt; 34,603,008 B on an H200, torch 2.11), to the byte. Torch 2.13
    # documents the cuBLASLt workspace as sharing the cuBLAS one by default: 1 MiB less there.
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 12):
        assert lazy.measured_bytes == lazy.predicted_bytes, (lazy.measured_bytes, lazy.predicted_bytes)
    else:
        assert lazy.measured_bytes in (lazy.predicted_bytes, lazy.predicted_bytes - MIB), lazy.measured_bytes
    assert run.calibration is not None and run.calibration.lazy_workspace_bytes == lazy.measured_bytes


def test_keys_the_forward_did_not_capture_are_left_out_of_rows_sums_and_fit():
    """A key measured None (a PIECEWISE key of a forward without piecewise runners) is a 'not captured' row; the
    fit starts at the first captured key (its peak gives the workspace) and the pool's sums cover captured keys."""
    plan = demo_plan(DemoOptions())
    full = _captured()
    keys = (None,) + full.keys[1:]  # the largest key not captured: the fit's first key is 4 tokens
    pool = PoolUsage(reserved_bytes=2 * MIB, allocated_bytes=sum(_kept(n) for n in DEMO_KEYS[1:]))
    partial = CaptureMemory(keys=keys, lazy_workspace_bytes=LAZY, pool=pool, not_captured="PIECEWISE mixed graphs not "
                            "captured: the forward has no graphkv piecewise runners")
    graphs = _rows(plan, partial)
    rows = [r for r in graphs.rows if r.num_tokens is not None]
    assert rows[0].measured_bytes is None
    assert rows[0].method == ("not measured: not captured (PIECEWISE mixed graphs not captured: the forward has no "
                              "graphkv piecewise runners)")
    assert [r.measured_bytes for r in rows[1:]] == [1040, 1020, 1010]  # 4 tokens first: its peak is its kept bytes
    assert partial.pool_bytes == 1040 + 1020 + 1010
    assert graphs.notes[0].startswith("1 of 4 keys not captured (PIECEWISE mixed graphs not captured")
    cal = graphs.calibration
    assert cal is not None and cal.source == "fitted to 3 keys of tiny-hybrid on cuda:0"
    assert (round(cal.per_graph_bytes, 6), round(cal.output_bytes_per_token, 6), cal.workspace_bytes_per_token) == \
        (1000.0, 10.0, 0.0)
    none = CaptureMemory(keys=(None,) * 4, lazy_workspace_bytes=LAZY, pool=PoolUsage(reserved_bytes=0,
                                                                                     allocated_bytes=0))
    assert _rows(plan, none).calibration is None


def test_the_lazy_row_is_predicted_from_the_gpus_compute_capability_and_the_process_settings(monkeypatch):
    """bench's prediction for one stream: 32 + 1 MiB on an sm_90 GPU, 8 MiB + 128 KiB + 1 MiB on sm_80, and what
    CUBLAS_WORKSPACE_CONFIG says (torch.cuda faked: a CPU has no device to ask)."""
    from graphkv.memory import bench

    capability = {"cuda:0": (9, 0), "cuda:1": (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability[device])
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    monkeypatch.delenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", raising=False)
    assert bench._lazy_workspace_bytes("cuda:0") == 34_603_008
    assert bench._lazy_workspace_bytes("cuda:1") == 8 * MIB + 128 * 1024 + MIB
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # 128 KiB, and cuBLASLt capped at it
    assert bench._lazy_workspace_bytes("cuda:0") == 2 * 128 * 1024
