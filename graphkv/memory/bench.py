"""``graphkv bench memory``: plan -> allocate -> build the step -> capture, each phase measured beside
what the plan's ledger predicted.

Phases and how each is measured (the row's ``method`` says which applied):

- ``kv_pool``: ``allocate(plan, device)``. GPU: ``torch.cuda.memory_allocated`` before and after,
  predicted by ``plan.ledger.cuda_memory().pool`` (the caching allocator's charge: 512 B blocks, a
  large block handed out whole when under 1 MiB of its segment would remain), and
  ``torch.cuda.memory_reserved`` beside its predicted segments (a note; the cache is emptied first,
  as the prediction starts from an allocator with no cached free block); a note adds what the
  process paid in device memory by NVML per process or torch's reserved bytes. CPU: the pool's live
  storages, predicted ``plan.pool_bytes``.
- ``static_buffers``: ``Step(plan, device)``'s device buffers. GPU: as ``kv_pool``, predicted by
  ``plan.ledger.cuda_memory().static_buffers`` (the buffers are far below NVML's 2 MiB granularity);
  CPU: the step's torch tensors, summed by address, predicted
  ``plan.ledger.runtime_bytes(device).device_bytes - plan.pool_bytes``.
- ``host_buffers``: the step's pinned staging and host arrays; predicted
  ``runtime_bytes(device).host_bytes``; live storages on either device (NVML sees no host memory).
- ``lazy workspaces (cuBLAS)`` (GPU, graphs captured): every key is warmed up and captured on one
  explicit capture stream; PyTorch's cached cuBLAS workspaces are freed first (a pooled stream may
  hold some from earlier work in the process), then before the first capture one small matmul in
  the model's dtype runs on it, so cuBLAS allocates that stream's workspace outside the graph pool (the
  captures then release it and take the capture stream's from the pool: the first key's footprint). Measured:
  ``torch.cuda.memory_allocated`` growth over that matmul and every key's warm-up; predicted by
  PyTorch's rule for one stream on this GPU's compute capability and this process's
  ``CUBLAS_WORKSPACE_CONFIG`` / ``CUBLASLT_WORKSPACE_SIZE``
  (:mod:`graphkv.plan.allocations.blas_workspaces`; the ledger's ``lazy workspaces`` entry charges
  one such set per stream, reserved).
- ``graph_pool <key>``: each capture key, largest first; predicted ``plan.ledger.graph_keys``.
  GPU: read through the capture's own pool (:mod:`graphkv.memory.graph_pool_reader`): the bytes
  kept allocated after the key's capture minus before (``measured_kept_bytes``: the pool's growth and
  what a PIECEWISE capture holds outside it), the capture's
  peak above what was allocated before it (``torch.cuda.max_memory_allocated`` after a reset,
  ``measured_peak_bytes``) and the pool's new segment bytes (``measured_reserved_bytes``). The row's
  measured bytes are the kept bytes, and for the first key its footprint: its peak, or the segments
  it opened plus what it keeps outside the pool where those are more (the allocator's rounding, the
  PIECEWISE staging arena), so the rows sum to about what the pool and the arena hold: the model's shape. A note compares the pool's reserved bytes with the model's sum, and one gives
  the process meter's (NVML's) growth over the whole capture, which adds the graphs' driver-side
  memory. The demo has a forward to capture here; a preset's graphs are measured at its real shapes
  by ``graphkv.memory.command.preset_graphs``. CPU: not measured (CUDA graphs need a GPU). This
  pool-based measurement has run on an H200 for the demo (2026-11-25) and on an H100 for the demo
  and llama-3.1-8b at 1 and 2 layers (2026-11-26).
- ``total``: the sum of the rows above that were measured, against the same rows' predictions.

A GPU run with graphs measured also fits the graph-memory model (:func:`graphkv.plan.graph_pool.fit_graph_pool`:
a line through the kept bytes of every key after the first, the first key's footprint above it as the
workspace), which
``--out DIR`` writes as ``graph_calibration.json`` for ``graphkv plan --graph-calibration``.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, Iterator

import attrs

from graphkv.memory.graph_pool_reader import CaptureMemory, CapturePoolReader, KeyMemory
from graphkv.memory.held_out import held_out, held_out_line
from graphkv.memory.meters import MeterChoice
from graphkv.memory.progress import Progress
from graphkv.memory.storages import live_storages
from graphkv.plan.allocations.blas_workspaces import blas_workspaces, workspace_settings_from
from graphkv.plan.allocations.entries import AllocatorBytes
from graphkv.plan.graph_keys import capture_keys
from graphkv.plan.graph_pool import GraphPoolModel, fit_graph_pool
from graphkv.plan.plan import Plan
from graphkv.spec.dtypes import DType

__all__ = ["LAZY_WORKSPACES", "GraphRows", "MemoryRun", "PhaseRow", "graph_rows", "run_phases"]

_ALLOCATED = "torch.cuda.memory_allocated vs the caching allocator's charge (plan.ledger.cuda_memory())"
_HOST = "live storages (host memory: pinned staging and numpy arrays)"
LAZY_WORKSPACES = "lazy workspaces (cuBLAS)"
_LAZY = ("torch.cuda.memory_allocated growth over a matmul on the capture stream and every key's warm-up on it "
         "(cuBLAS keeps a workspace per stream)")
_POOL_FIRST = ("capture pool (memory_snapshot): footprint (its peak, max_memory_allocated, or the segments it "
               "opened, whichever is more)")
_POOL_LATER = "capture pool (memory_snapshot): kept"


@attrs.frozen(kw_only=True)
class PhaseRow:
    """One phase: what the plan predicted, what was measured (``None``: not measured) and how."""

    phase: str
    predicted_bytes: int
    measured_bytes: int | None
    method: str
    num_tokens: int | None = None  # graph_pool rows: the key's token count
    uniform: bool | None = None  # graph_pool rows: a decode key
    predicted_reserved_bytes: int | None = None  # GPU kv_pool / static_buffers: new allocator segments predicted
    measured_reserved_bytes: int | None = None  # ... and torch.cuda.memory_reserved's growth (graph rows: the pool's)
    measured_peak_bytes: int | None = None  # GPU graph rows: the capture's peak above what was allocated before it
    measured_kept_bytes: int | None = None  # ... and the pool bytes its graph keeps

    @property
    def error_pct(self) -> float | None:
        """``(measured - predicted) / predicted`` in percent (``None`` when not measured or predicted 0)."""
        if self.measured_bytes is None or self.predicted_bytes == 0:
            return None
        return 100.0 * (self.measured_bytes - self.predicted_bytes) / self.predicted_bytes

    def to_dict(self, model: str) -> dict[str, Any]:
        """The ``memory.json`` row (with ``predicted_reserved_bytes`` / ``measured_reserved_bytes`` where
        reserved bytes were measured, and ``measured_peak_bytes`` / ``measured_kept_bytes`` for a graph
        key read through its pool)."""
        out = {"model": model, "phase": self.phase, "predicted_bytes": self.predicted_bytes,
               "measured_bytes": self.measured_bytes, "method": self.method}
        if self.predicted_reserved_bytes is not None:
            out.update(predicted_reserved_bytes=self.predicted_reserved_bytes)
        if self.predicted_reserved_bytes is not None or self.measured_reserved_bytes is not None:
            out.update(measured_reserved_bytes=self.measured_reserved_bytes)
        if self.measured_peak_bytes is not None or self.measured_kept_bytes is not None:
            out.update(measured_peak_bytes=self.measured_peak_bytes, measured_kept_bytes=self.measured_kept_bytes)
        return out

    @property
    def reserved_note(self) -> str | None:
        """One line comparing reserved bytes (``None`` when not measured)."""
        if self.predicted_reserved_bytes is None or self.measured_reserved_bytes is None:
            return None
        return (f"{self.phase} reserved (torch.cuda.memory_reserved): {self.measured_reserved_bytes:,} B measured, "
                f"{self.predicted_reserved_bytes:,} B predicted (new allocator segments), "
                f"{self.measured_reserved_bytes - self.predicted_reserved_bytes:+,} B")


@attrs.frozen(kw_only=True)
class MemoryRun:
    """Every phase of one model on one device, and the graph calibration fitted from it (GPU)."""

    model: str
    device: str
    budget: str  # how the KV budget was chosen
    rows: tuple[PhaseRow, ...]
    calibration: GraphPoolModel | None
    notes: tuple[str, ...] = ()
    held_out: str | None = None  # the held-out check of the calibration (graphkv.memory.held_out), when run
    # A preset's graph memory at real shapes (graphkv.memory.command.preset_graphs): the runs of its
    # reduced-depth models, and the one-line outcome (the calibration, or why none was measured).
    graph_runs: tuple["MemoryRun", ...] = ()
    graph_summary: str | None = None
    holds: bool | None = None  # --full-depth: whether the whole-depth capture held within its calibration

    def with_graph_runs(self) -> tuple["MemoryRun", ...]:
        """This run followed by its reduced-depth graph runs (what ``memory.json`` and the plot show)."""
        return (self, *self.graph_runs)


def run_phases(plan: Plan, device: Any, choice: MeterChoice, *, budget: str, progress: Progress,
               forward_for: Callable[[Any, Any], Any] | None = None, hidden_size: int | None = None) -> MemoryRun:
    """Allocate ``plan`` on ``device``, build its :class:`~graphkv.runtime.Step`, capture its keys when
    ``forward_for(pool, step)`` gives a capturable forward on a GPU, and measure every phase with
    ``choice``'s meter (live storages on a CPU; graph keys through their capture pool). ``hidden_size``:
    the model's, recorded with a fitted calibration. Everything allocated is released on return."""
    import torch

    from graphkv.runtime import Step, allocate

    kind = device.type
    predicted = plan.ledger.runtime_bytes(kind)
    cuda = kind == "cuda"
    meter = choice.meter
    rows: list[PhaseRow] = []
    notes: list[str] = []

    progress.start(f"{plan.model_name}: allocate KV pool")
    charged = plan.ledger.cuda_memory()
    if cuda:  # the charge is predicted from an allocator with no cached free block
        gc.collect()  # a previous run's objects freed late (reference cycles) would land inside this run's readings
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        cached = _counters(device)
        if cached.reserved > cached.allocated:
            notes.append(f"the caching allocator held {cached.reserved - cached.allocated:,} B of free blocks in "
                         "segments still in use before the pool: reserved bytes may come out below the prediction")
    before = meter.read() if cuda and meter is not None else 0
    start = _counters(device)
    pool = allocate(plan, device)
    after_pool = _counters(device)
    if cuda:
        rows.append(_cuda_row("kv_pool", charged.pool, start, after_pool))
        if meter is not None:
            notes.append(f"the KV pool cost this process {meter.read() - before:,} B of device memory "
                         f"({choice.method}: allocator segments included)")
    else:
        rows.append(PhaseRow(phase="kv_pool", predicted_bytes=plan.pool_bytes,
                             measured_bytes=live_storages(pool).runtime_bytes(kind).device_bytes,
                             method="live storages: torch tensors"))
    progress.done(f"{plan.model_name}: allocate KV pool")

    step = Step(plan, device)
    counted = live_storages(step).runtime_bytes(kind)
    if cuda:
        rows.append(_cuda_row("static_buffers", charged.static_buffers, after_pool, _counters(device)))
    else:
        rows.append(PhaseRow(phase="static_buffers", predicted_bytes=predicted.device_bytes - plan.pool_bytes,
                             measured_bytes=counted.device_bytes, method="live storages: torch tensors"))
    rows.append(PhaseRow(phase="host_buffers", predicted_bytes=predicted.host_bytes, measured_bytes=counted.host_bytes,
                         method=_HOST if cuda else "live storages: numpy arrays"))
    notes += [r.reserved_note for r in rows if r.reserved_note is not None]

    why = _why_not_captured(device, forward_for)
    keys = capture_keys(plan.cudagraph, plan.limits)
    captured: CaptureMemory | None = None
    if why is None and keys:
        assert forward_for is not None
        captured = _capture(plan, device, choice, pool, step, forward_for, progress, keys)
    graphs = graph_rows(plan, captured, why=why or "not measured", hidden_size=hidden_size,
                        lazy_workspace_bytes=_lazy_workspace_bytes(device) if captured is not None else 0,
                        device=str(device), process_method=choice.method)
    rows += graphs.rows
    notes += graphs.notes
    calibration = graphs.calibration
    measured = [r for r in rows if r.measured_bytes is not None]
    rows.append(PhaseRow(phase="total", predicted_bytes=sum(r.predicted_bytes for r in measured),
                         measured_bytes=sum(r.measured_bytes or 0 for r in measured),
                         method=f"sum of the {len(measured)} measured rows"))
    del pool, step
    if cuda:
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    return MemoryRun(model=plan.model_name, device=str(device), budget=budget, rows=tuple(rows),
                     calibration=calibration, notes=tuple(notes), held_out=graphs.held_out)


@attrs.frozen(kw_only=True)
class _Counters:
    """The caching allocator's two counters of one device, read after a synchronize."""

    allocated: int
    reserved: int


def _counters(device: Any) -> _Counters:
    """The counters now (zeros on a CPU, which has no caching allocator)."""
    if device.type != "cuda":
        return _Counters(allocated=0, reserved=0)
    import torch

    torch.cuda.synchronize(device)
    return _Counters(allocated=int(torch.cuda.memory_allocated(device)),
                     reserved=int(torch.cuda.memory_reserved(device)))


def _cuda_row(phase: str, charged: AllocatorBytes, before: _Counters, after: _Counters) -> PhaseRow:
    """A GPU phase: allocated bytes against the caching allocator's charge, reserved beside it."""
    return PhaseRow(phase=phase, predicted_bytes=charged.allocated_bytes,
                    measured_bytes=after.allocated - before.allocated, method=_ALLOCATED,
                    predicted_reserved_bytes=charged.reserved_bytes,
                    measured_reserved_bytes=after.reserved - before.reserved)


def _why_not_captured(device: Any, forward_for: Callable[[Any, Any], Any] | None) -> str | None:
    """Why the graph rows are not measured (``None``: they are)."""
    if device.type != "cuda":
        return "not measured: CUDA graphs need a GPU (a CPU runs every step eagerly)"
    if forward_for is None:
        return "not measured: no forward to capture for this model (the demo model has one)"
    return None


@attrs.frozen(kw_only=True)
class GraphRows:
    """The graph rows of a run (a lazy workspaces row first when measured), their notes, and the
    calibration fitted to them (``None`` unless every key was measured)."""

    rows: tuple[PhaseRow, ...]
    notes: tuple[str, ...]
    calibration: GraphPoolModel | None
    held_out: str | None = None  # the calibration checked on keys left out of a fit to the others (4+ keys)


def graph_rows(plan: Plan, captured: CaptureMemory | None, *, why: str, hidden_size: int | None,
               lazy_workspace_bytes: int, device: str, process_method: str) -> GraphRows:
    """One row per capture key beside the ledger's estimate, from ``captured`` (``None``: not measured,
    ``why``). Pure: a CPU test passes recorded or synthetic measurements. ``lazy_workspace_bytes``:
    the lazy workspaces row's prediction (one stream's cuBLAS workspaces, allocated); ``process_method``:
    the process meter named in the note on its growth."""
    keys = capture_keys(plan.cudagraph, plan.limits)
    estimates = plan.ledger.graph_keys
    assert len(estimates) in (0, len(keys)), "the ledger estimates every capture key"
    notes: list[str] = []
    if not estimates and keys:
        notes.append(f"graph pool not estimated: {plan.ledger.entries[-1].reason}")
    if captured is None or not keys:
        rows = tuple(PhaseRow(phase=_key_phase(key), predicted_bytes=estimates[i].nbytes if estimates else 0,
                              measured_bytes=None, method=why, num_tokens=key.num_tokens, uniform=key.uniform)
                     for i, key in enumerate(keys))
        return GraphRows(rows=rows, notes=tuple(notes), calibration=None)
    measured = captured.keys
    assert [(m.num_tokens, m.uniform) for m in measured if m is not None] == \
        [(k.num_tokens, k.uniform) for k, m in zip(keys, measured) if m is not None] and len(measured) == len(keys), \
        "one measurement (or None) per capture key, in capture order"
    rows = [PhaseRow(phase=LAZY_WORKSPACES, predicted_bytes=lazy_workspace_bytes,
                     measured_bytes=captured.lazy_workspace_bytes, method=_LAZY)]
    taken = [(key, m) for key, m in zip(keys, measured) if m is not None]
    skipped = f"not measured: not captured ({captured.not_captured or 'the forward captured no graph for it'})"
    for i, (key, m) in enumerate(zip(keys, measured)):
        predicted = estimates[i].nbytes if estimates else 0
        if m is None:
            rows.append(PhaseRow(phase=_key_phase(key), predicted_bytes=predicted, measured_bytes=None, method=skipped,
                                 num_tokens=key.num_tokens, uniform=key.uniform))
        else:
            rows.append(_key_row(key, m, predicted, first=key is taken[0][0]))
    if len(taken) < len(keys):
        notes.append(f"{len(keys) - len(taken)} of {len(keys)} keys not captured ({captured.not_captured or 'no graph'}): "
                     "the fit and the pool's sums cover the captured keys only")
    if not taken:
        return GraphRows(rows=tuple(rows), notes=tuple(notes), calibration=None)
    predicted_pool = sum(e.nbytes for e, m in zip(estimates, measured) if m is not None)
    notes.append(f"graph_pool (pool reserved): the capture pool's segments hold {captured.pool.reserved_bytes:,} B "
                 f"({captured.pool.allocated_bytes:,} B allocated) after {len(taken)} captured keys; their rows sum to "
                 f"{captured.pool_bytes:,} B measured, the model to {predicted_pool:,} B "
                 f"({captured.pool.reserved_bytes - predicted_pool:+,} B reserved vs the model)")
    if captured.process_bytes is not None:
        notes.append(f"warming up and capturing every key cost this process {captured.process_bytes:,} B of device "
                     f"memory ({process_method}; NVML adds the graphs' driver-side memory to the pool and the lazy "
                     "workspaces)")
    calibration = fit_graph_pool([k for k, _ in taken], [m.kept_bytes for _, m in taken],
                                 first_peak_bytes=taken[0][1].footprint_bytes, hidden_size=hidden_size,
                                 lazy_workspace_bytes=captured.lazy_workspace_bytes,
                                 source=f"fitted to {len(taken)} keys of {plan.model_name} on {device}")
    line = held_out_line(held_out([k for k, _ in taken], [m.kept_bytes for _, m in taken],
                                  first_peak_bytes=taken[0][1].footprint_bytes))
    if line is not None:
        notes.append(line)
    return GraphRows(rows=tuple(rows), notes=tuple(notes), calibration=calibration, held_out=line)


def _lazy_workspace_bytes(device: Any) -> int:
    """One stream's cuBLAS workspaces on ``device`` (allocated), by PyTorch's rule and this process's settings."""
    import os

    from graphkv.memory.available import cuda_arch

    return blas_workspaces(cuda_arch(device), num_streams=1,
                           settings=workspace_settings_from(os.environ)).allocated_bytes_per_stream


def _key_phase(key: Any) -> str:
    return f"graph_pool {'decode' if key.uniform else 'mixed'}({key.num_tokens})"


def _key_row(key: Any, m: KeyMemory, predicted_bytes: int, *, first: bool) -> PhaseRow:
    """A measured key: its kept bytes, plus its workspace when captured first (later keys reuse it)."""
    return PhaseRow(phase=_key_phase(key), predicted_bytes=predicted_bytes, measured_bytes=m.pool_bytes(first=first),
                    method=_POOL_FIRST if first else _POOL_LATER, num_tokens=key.num_tokens, uniform=key.uniform,
                    measured_reserved_bytes=m.reserved_bytes, measured_peak_bytes=m.peak_bytes,
                    measured_kept_bytes=m.kept_bytes)


def _matmul_dtype(plan: Plan) -> Any:
    """The dtype of the workspace warm-up's matmul: the first 2- or 4-byte floating cache dtype of the
    plan's groups (the model's activations, as a rule: the demo's float32), else float32."""
    import torch

    for group in plan.groups:
        dtype = getattr(group.spec, "dtype", None)
        if isinstance(dtype, DType) and dtype.is_floating and dtype.itemsize >= 2:
            return dtype.to_torch()
    return torch.float32


def _free_workspaces(device: Any) -> None:
    """Free every cuBLAS workspace PyTorch holds (:func:`~graphkv.runtime.capture.piecewise.release_blas_workspaces`):
    ``torch.cuda.Stream()`` hands out pooled streams, and one that already ran a matmul in this process
    would keep its workspaces, so the lazy row would read 0. (graphkv's captures do the same before the
    first capture of a pool, so their graphs hold their workspaces in their own pools.)"""
    import torch

    from graphkv.runtime.capture.piecewise import release_blas_workspaces

    torch.cuda.synchronize(device)  # ``device``'s pending matmuls; the release itself syncs the current device
    release_blas_workspaces()


def _warm_workspaces(stream: Any, dtype: Any, device: Any) -> None:
    """A small matmul (and a linear with a bias, cuBLASLt's path) on ``stream``: cuBLAS allocates that
    stream's workspaces now, outside any graph pool, and the lazy row reads their size. The first capture
    then releases them and takes the capture stream's from the graph pool (its footprint includes them)."""
    import torch

    from graphkv.runtime.capture.piecewise import on_stream

    with on_stream(stream):
        x = torch.ones(16, 16, dtype=dtype, device=device)
        torch.matmul(x, x)
        torch.nn.functional.linear(x, x, x[0])
    torch.cuda.synchronize(device)


def _capture(plan: Plan, device: Any, choice: MeterChoice, pool: Any, step: Any,
             forward_for: Callable[[Any, Any], Any], progress: Progress, keys: tuple) -> CaptureMemory:
    """Warm lazy workspaces on an explicit capture stream, then warm up and capture every key into a
    pool of its own, reading the pool around each capture (GPU only)."""
    import torch

    from graphkv.runtime.capture.graphs import capture

    graph_pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream(device)
    reader = CapturePoolReader(graph_pool, device)
    forward = capture(plan, static_inputs={"input_ids": step.input_ids}, pool=graph_pool,
                      stream=stream)(forward_for(pool, step))
    meter = choice.meter
    process_before = meter.read() if meter is not None else None
    _free_workspaces(device)
    allocated_before = reader.allocated_bytes()
    _warm_workspaces(stream, _matmul_dtype(plan), device)
    state: dict[str, Any] = {"index": 0, "lazy": None, "start": None}
    measured: list[KeyMemory | None] = []
    label = f"{plan.model_name}: capture graphs"

    @contextlib.contextmanager
    def prepare(key: Any) -> Iterator[Any]:
        with step.capture_context(key) as context:
            if state["lazy"] is not None:  # capturing: read just before the capture (the dummy step is staged)
                state["start"] = reader.start()
            yield context

    def on_key(phase: str, key: Any) -> None:
        if phase == "warm-up":
            progress.update(f"{plan.model_name}: warm up", state["index"] + 1, len(keys))
            state["index"] += 1
            if state["index"] == len(keys):  # every key warmed up: what stays allocated is lazy state
                state["lazy"], state["index"] = reader.allocated_bytes() - allocated_before, 0
                progress.start(label)
            return
        if key in forward.keys:  # a PIECEWISE key is skipped when the forward has no piecewise runners
            measured.append(reader.finish(state["start"], num_tokens=key.num_tokens, uniform=key.uniform))
        else:
            measured.append(None)
        state["index"] += 1
        progress.update(label, state["index"], len(keys))

    report = forward.capture(progress=False, prepare=prepare, on_key=on_key)
    progress.done(label)
    after = reader.read()
    process = meter.read() - process_before if meter is not None and process_before is not None else None
    return CaptureMemory(keys=tuple(measured), lazy_workspace_bytes=state["lazy"], pool=after, process_bytes=process,
                         not_captured=next(iter(report.skipped), None))
