"""Graph-memory calibrations shipped with graphkv, by GPU architecture and preset.

``graphkv plan --gpu NAME --preset P`` (and :func:`shipped_calibration`) reserves graph memory
from a calibration measured on a GPU of ``NAME``'s architecture for preset ``P``, when one ships
here; ``--graph-calibration PATH`` overrides it, and without either the ledger keeps the
uncalibrated default and says so. Each ``<preset>.<arch>.json`` is a ``graph_calibration.json``
that ``graphkv bench memory --model P --out DIR`` wrote on such a GPU, labelled with the card it
ran on (``device_name``), its compute capability (``arch``, e.g. ``"sm_90"``), the preset
(``model``) and the versions (``graphkv``, ``torch``, ``cuda``) — copy it here to ship it.

Graph memory depends on the kernels a capture records and on the caching allocator, so a
calibration serves the GPUs of its architecture (an H100's serves an H200: both ``sm_90``), for the
preset it was measured on only: another model's activations differ in more than its hidden size.

Shipped: ``llama-3.1-8b.sm_90.json``, measured by ``graphkv bench memory`` on an NVIDIA H100 80GB HBM3
(torch 2.11.0+cu130, CUDA 13.0; 2026-11-26) at 1 and 2 layers and extrapolated to 32: a pool of
1.18 GiB for its 90 keys, set by the 8192-token key's footprint (the 1,197 MB of segments its capture
opened and the 64 MiB staging arena it keeps outside them; later keys keep 0 to 2 KiB each, as graphs
keep weak views of their outputs). Its rows were fitted by this version's
:func:`~graphkv.plan.graph_pool.fit_graph_pool` (the fit predicts both depths' pool segments plus arena
to within 0.49 %). The footprint was the same at both depths although the capture's peak grew
4.2 MB per layer: the segments absorbed it, so the extrapolation is flat. Not yet checked: a 32-layer run holding within it. For any
other (architecture, preset), :func:`shipped_calibration` returns ``None`` and
:func:`missing_reason` says why.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from graphkv.errors import GraphkvError, Problem, SpecError
from graphkv.inputs.json_file import read_json_file
from graphkv.plan.graph_pool import GraphPoolModel
from graphkv.spec.budget import ARCH_OF_GPU, arch_of

__all__ = ["ARCH_OF_GPU", "ShippedCalibration", "missing_reason", "shipped_calibration", "shipped_calibrations"]

_SUFFIX = ".json"
_LABELS = ("model", "arch", "device_name", "graphkv", "torch", "cuda")


@attrs.frozen(kw_only=True)
class ShippedCalibration:
    """One shipped calibration: its ``model`` (preset), ``arch``, the card and versions it was
    measured with, and the :class:`GraphPoolModel` the planner uses."""

    file: str
    model: str
    arch: str
    device_name: str
    graphkv: str
    torch: str
    cuda: str
    graph_pool: GraphPoolModel

    @property
    def label(self) -> str:
        """One line for the plan's notes: what, where, with which versions."""
        return (f"{self.model} on {self.device_name} ({self.arch}; graphkv {self.graphkv}, torch {self.torch}, "
                f"CUDA {self.cuda})")


def _directory(directory: "str | os.PathLike[str] | None") -> Any:
    return resources.files(__name__) if directory is None else Path(directory)


def shipped_calibrations(directory: "str | os.PathLike[str] | None" = None) -> tuple[ShippedCalibration, ...]:
    """Every calibration in ``directory`` (default: the package's own), sorted by file name. A file
    lacking a label or with bad coefficients raises :class:`SpecError` naming it (a shipped file
    is checked by the tests, a user's directory by this)."""
    root = _directory(directory)
    files = sorted((f for f in root.iterdir() if f.name.endswith(_SUFFIX)), key=lambda f: f.name)
    out = []
    for f in files:
        data = read_json_file(os.fspath(f), field="calibration", what="a shipped graph_calibration.json")
        origin = f.name
        model = GraphPoolModel.from_dict(data, origin=origin, field=f"calibration[{origin}]")
        missing = [k for k in _LABELS if not isinstance(data.get(k), str) or not data[k]]
        if missing:
            raise SpecError(Problem(field=f"calibration[{origin}]", value=", ".join(missing),
                                    limit="a shipped calibration must name its " + ", ".join(_LABELS),
                                    fix="write it with `graphkv bench memory --model PRESET --out DIR` on the GPU"))
        out.append(ShippedCalibration(file=origin, graph_pool=model, **{k: str(data[k]) for k in _LABELS}))
    return tuple(out)


def shipped_calibration(gpu_name: str, model_name: str, *,
                        directory: "str | os.PathLike[str] | None" = None) -> ShippedCalibration | None:
    """The calibration for preset ``model_name`` on a GPU of ``gpu_name``'s architecture, or
    ``None`` when none ships (or the GPU's architecture is unknown).

    >>> shipped_calibration("H100", "llama-3.1-8b").device_name
    'NVIDIA H100 80GB HBM3'
    >>> shipped_calibration("H100", "gpt-oss-20b") is None  # none measured
    True
    """
    arch = arch_of(gpu_name)
    if arch is None:
        return None
    for c in shipped_calibrations(directory):
        if c.arch == arch and c.model == model_name:
            return c
    return None


def missing_reason(gpu_name: str, model_name: str, *, directory: "str | os.PathLike[str] | None" = None) -> str:
    """Why :func:`shipped_calibration` found none, for the plan's notes."""
    arch = arch_of(gpu_name) or "unknown"
    try:
        shipped = shipped_calibrations(directory)
    except GraphkvError as e:  # a bad file in a user's directory: say so rather than hide it
        return f"the calibrations could not be read ({e})"
    have = sorted({f"{c.model} ({c.arch})" for c in shipped})
    listed = ", ".join(have) if have else "none has been measured on a GPU yet"
    return (f"no shipped graph calibration for {model_name} on {gpu_name} ({arch}) — shipped: {listed}; "
            f"`graphkv bench memory --model PRESET --out DIR` on the GPU writes one, --graph-calibration reads it")
