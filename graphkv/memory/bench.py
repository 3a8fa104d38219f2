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
- ``graph_pool <key>``: each capture key, largest first; predicted ``plan.ledger.graph_keys``.
  GPU: device memory after each key's capture minus before it (the warm-up's cached blocks are
  released first); only the demo model has a forward to capture. CPU: not measured (CUDA graphs
  need a GPU).
- ``total``: the sum of the rows above that were measured, against the same rows' predictions.

A GPU run with graphs measured also fits the graph-memory model (:func:`graphkv.plan.graph_pool.fit_graph_pool`),
which ``--out DIR`` writes as ``graph_calibration.json`` for ``graphkv plan --graph-calibration``.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

from graphkv.memory.meters import MeterChoice
from graphkv.memory.progress import Progress
from graphkv.memory.storages import live_storages
from graphkv.plan.allocations.entries import AllocatorBytes
from graphkv.plan.graph_keys import capture_keys
from graphkv.plan.graph_pool import GraphPoolModel, fit_graph_pool
from graphkv.plan.plan import Plan

__all__ = ["MemoryRun", "PhaseRow", "run_phases"]

_ALLOCATED = "torch.cuda.memory_allocated vs the caching allocator's charge (plan.ledger.cuda_memory())"
_HOST = "live storages (host memory: pinned staging and numpy arrays)"


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
    measured_reserved_bytes: int | None = None  # ... and torch.cuda.memory_reserved's growth

    @property
    def error_pct(self) -> float | None:
        """``(measured - predicted) / predicted`` in percent (``None`` when not measured or predicted 0)."""
        if self.measured_bytes is None or self.predicted_bytes == 0:
            return None
        return 100.0 * (self.measured_bytes - self.predicted_bytes) / self.predicted_bytes

    def to_dict(self, model: str) -> dict[str, Any]:
        """The ``memory.json`` row (with ``predicted_reserved_bytes`` / ``measured_reserved_bytes`` where
        reserved bytes were measured)."""
        out = {"model": model, "phase": self.phase, "predicted_bytes": self.predicted_bytes,
               "measured_bytes": self.measured_bytes, "method": self.method}
        if self.predicted_reserved_bytes is not None:
            out.update(predicted_reserved_bytes=self.predicted_reserved_bytes,
                       measured_reserved_bytes=self.measured_reserved_bytes)
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


def run_phases(plan: Plan, device: Any, choice: MeterChoice, *, budget: str, progress: Progress,
               forward_for: Callable[[Any, Any], Any] | None = None, hidden_size: int | None = None) -> MemoryRun:
    """Allocate ``plan`` on ``device``, build its :class:`~graphkv.runtime.Step`, capture its keys when
    ``forward_for(pool, step)`` gives a capturable forward on a GPU, and measure every phase with
    ``choice``'s meter (live storages on a CPU). ``hidden_size``: the model's, recorded with a fitted
    calibration. Everything allocated is released on return."""
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

    graph_rows, calibration = _graph_phases(plan, device, choice, pool, step, forward_for, progress, notes,
                                            hidden_size)
    rows += graph_rows
    measured = [r for r in rows if r.measured_bytes is not None]
    rows.append(PhaseRow(phase="total", predicted_bytes=sum(r.predicted_bytes for r in measured),
                         measured_bytes=sum(r.measured_bytes or 0 for r in measured),
                         method=f"sum of the {len(measured)} measured rows"))
    del pool, step
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    return MemoryRun(model=plan.model_name, device=str(device), budget=budget, rows=tuple(rows),
                     calibration=calibration, notes=tuple(notes))


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


def _graph_phases(plan: Plan, device: Any, choice: MeterChoice, pool: Any, step: Any,
                  forward_for: Callable[[Any, Any], Any] | None, progress: Progress, notes: list[str],
                  hidden_size: int | None) -> tuple[list[PhaseRow], GraphPoolModel | None]:
    """One row per capture key; measured on a GPU when there is a forward to capture."""
    keys = capture_keys(plan.cudagraph, plan.limits)
    estimates = plan.ledger.graph_keys
    assert len(estimates) in (0, len(keys)), "the ledger estimates every capture key"
    if device.type != "cuda":
        why = "not measured: CUDA graphs need a GPU (a CPU runs every step eagerly)"
    elif forward_for is None:
        why = "not measured: no forward to capture for this model (the demo model has one)"
    elif choice.meter is None:
        why = "not measured: no device meter"
    else:
        why = None
    measured: dict[int, int] = {}
    if why is None and keys:
        measured = _capture(plan, device, choice, pool, step, forward_for, progress, keys)
    rows = []
    for i, key in enumerate(keys):
        est = estimates[i].nbytes if estimates else 0
        label = f"graph_pool {'decode' if key.uniform else 'mixed'}({key.num_tokens})"
        rows.append(PhaseRow(phase=label, predicted_bytes=est, measured_bytes=measured.get(i),
                             method=choice.method if i in measured else (why or "not measured"),
                             num_tokens=key.num_tokens, uniform=key.uniform))
    if not estimates and keys:
        notes.append(f"graph pool not estimated: {plan.ledger.entries[-1].reason}")
    calibration = None
    if len(measured) == len(keys) and keys:
        values = [measured[i] for i in range(len(keys))]
        calibration = fit_graph_pool(keys, values, hidden_size=hidden_size,
                                     source=f"fitted to {len(keys)} keys of {plan.model_name} on {device}")
    return rows, calibration


def _capture(plan: Plan, device: Any, choice: MeterChoice, pool: Any, step: Any,
             forward_for: Callable[[Any, Any], Any], progress: Progress, keys: tuple) -> dict[int, int]:
    """Capture every key, measuring this process's device memory after each one."""
    import torch

    from graphkv.runtime.capture.graphs import capture

    forward = capture(plan, static_inputs={"input_ids": step.input_ids})(forward_for(pool, step))
    meter = choice.meter
    assert meter is not None
    state: dict[str, Any] = {"last": None, "index": 0}
    measured: dict[int, int] = {}
    label = f"{plan.model_name}: capture graphs"

    def on_key(phase: str, key: Any) -> None:
        torch.cuda.synchronize(device)
        if phase == "warm-up":
            progress.update(f"{plan.model_name}: warm up", state["index"] + 1, len(keys))
            state["index"] += 1
            if state["index"] == len(keys):  # every key warmed up: release the warm-up's cached blocks
                torch.cuda.empty_cache()
                state["last"], state["index"] = meter.read(), 0
                progress.start(label)
            return
        now = meter.read()
        measured[state["index"]] = now - state["last"]
        state["last"] = now
        state["index"] += 1
        progress.update(label, state["index"], len(keys))

    forward.capture(progress=False, prepare=step.capture_context, on_key=on_key)
    progress.done(label)
    return measured
