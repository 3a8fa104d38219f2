"""Does a preset's whole-depth capture hold within the calibration the planner reserves from?

``graphkv plan --gpu H100 --preset P`` reserves graph memory from the calibration shipped for P on
that GPU's architecture (:mod:`graphkv.calibrations`), measured at two reduced depths and
extrapolated to P's own. :func:`check_full_depth` (``graphkv bench memory --model P --full-depth``)
builds P at its own depth with random weights, plans it with that calibration (so each capture
key's row predicts what the plan reserves), captures every key through the capture's own pool and
compares: the graph pool the keys measured plus the lazy workspaces, against the plan's graph pool
plus its lazy-workspace line. :func:`holds_within` is the comparison, pure.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from graphkv.errors import GraphkvError

__all__ = ["FullDepthCheck", "Holding", "check_full_depth", "holds_within"]


@attrs.frozen(kw_only=True)
class Holding:
    """The comparison of one whole-depth run: ``measured_bytes`` (every captured key's row and the lazy
    workspaces) against ``reserved_bytes`` (the plan's estimates of the same rows); ``holds`` when every
    key was captured and measured <= reserved; ``line`` says it in one sentence."""

    measured_bytes: int
    reserved_bytes: int
    holds: bool
    line: str


def holds_within(rows: Sequence[Any], *, calibration: str) -> Holding | None:
    """Compare the graph rows of a run (:class:`~graphkv.memory.bench.PhaseRow` s: the lazy-workspaces row
    and one per capture key) with the plan's estimates, which come from ``calibration`` (its label).
    ``None`` when no key was measured (a CPU, or a forward that captured nothing); a key not captured
    makes the comparison cover the captured ones, say so, and not hold (the plan reserves for every key)."""
    from graphkv.memory.bench import LAZY_WORKSPACES

    keys = [r for r in rows if r.num_tokens is not None]
    measured = [r for r in keys if r.measured_bytes is not None]
    if not measured:
        return None
    lazy = [r for r in rows if r.phase == LAZY_WORKSPACES and r.measured_bytes is not None]
    taken = measured + lazy
    got = sum(r.measured_bytes for r in taken)
    reserved = sum(r.predicted_bytes for r in taken)
    missing = len(keys) - len(measured)
    verdict = ("CANNOT TELL against" if missing else "holds within" if got <= reserved else "EXCEEDS")
    line = (f"{verdict} the calibration {calibration}: {len(measured)} keys and the lazy workspaces measured "
            f"{got:,} B against {reserved:,} B reserved ({got - reserved:+,} B, "
            f"{100.0 * (got - reserved) / reserved if reserved else 0.0:+.2f} %)"
            + (f"; {missing} of {len(keys)} keys not captured" if missing else ""))
    return Holding(measured_bytes=got, reserved_bytes=reserved, holds=not missing and got <= reserved, line=line)


@attrs.frozen(kw_only=True)
class FullDepthCheck:
    """A preset captured at its own depth: the ``run`` (``None`` when nothing was built), the
    :class:`Holding` (``None`` when not measured) and a one-line ``summary``."""

    name: str
    num_layers: int
    run: Any
    holding: Holding | None
    summary: str


def check_full_depth(name: str, device: Any, choice: Any, progress: Any, *, limits: Any, kv_bytes: int,
                     calibration: Any = None, dtype: str = "bfloat16",
                     compile: bool | str | None = "piecewise",  # noqa: A002 - PagedModel's
                     **overrides: Any) -> FullDepthCheck:
    """Capture preset ``name`` at its own depth (random weights in ``dtype``, ``limits``' capture keys with
    ``max_model_len`` at most 4096, a pool of ``kv_bytes``), planned with ``calibration`` (a
    :class:`~graphkv.calibrations.ShippedCalibration`; default: the one shipped for this GPU), and
    check that what the keys measure holds within what the plan reserves (:func:`holds_within`).
    ``compile``: the :class:`~graphkv.hf.PagedModel` compile mode. Nothing is built without a
    calibration, or on a CPU unless ``overrides`` shrink the widths (tests); a failure (a capture error,
    out of memory) is the summary. Needs the GPU memory of the whole model: 16 GB of bf16 weights for
    llama-3.1-8b, beside the pool."""
    import torch

    from graphkv.calibrations import missing_reason, shipped_calibration
    from graphkv.memory.bench import run_phases
    from graphkv.memory.preset_forward import graph_limits, preset_forward
    from graphkv.presets import load_preset_config

    total = int(load_preset_config(name)["num_hidden_layers"])

    def skipped(why: str, run: Any = None) -> FullDepthCheck:
        return FullDepthCheck(name=name, num_layers=total, run=run, holding=None, summary=f"not checked at {total} "
                              f"layers: {why}")

    if device.type != "cuda" and not overrides:
        return skipped("CUDA graphs need a GPU")
    if calibration is None:
        if device.type != "cuda":
            return skipped("no calibration given (a GPU reads the one shipped for it)")
        gpu = torch.cuda.get_device_name(device)
        calibration = shipped_calibration(gpu, name)
        if calibration is None:
            return skipped(missing_reason(gpu, name))
    try:
        target = preset_forward(name, total, device, limits=graph_limits(limits), kv_bytes=kv_bytes, dtype=dtype,
                                compile=compile, graph_pool=calibration.graph_pool, **overrides)
        run = run_phases(target.plan, device, choice, budget=f"{kv_bytes:,} B (whole-depth check)", progress=progress,
                         forward_for=target.forward_for, hidden_size=target.hidden_size)
    except (GraphkvError, RuntimeError) as e:  # a capture error, out of memory, a compile failure
        return skipped(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
    holding = holds_within(run.rows, calibration=calibration.label)
    if holding is None:
        first = next((r for r in run.rows if r.num_tokens is not None), None)
        return skipped(first.method if first is not None else "the plan captures no key", run)
    return FullDepthCheck(name=name, num_layers=total, run=run, holding=holding,
                          summary=f"at {total} layers the graph pool {holding.line}")
