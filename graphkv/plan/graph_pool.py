"""The CUDA-graph memory of each capture key: a three-term model, calibrated by measurement.

Every buffer a captured step *reads* — token ids, metadata, block tables, slot mappings, flex
masks, the KV pool — is persistent and already in the ledger; capturing a key adds only what the
forward allocates inside the graph. Graphs are captured largest first into one shared pool, so:

- the **workspace** (activations live during the forward, ``workspace_bytes_per_token x
  num_tokens``) is reserved once, by the largest key, and reused by every later key;
- each key keeps its **outputs** (``output_bytes_per_token x num_tokens``): what its graph holds
  between replays. graphkv's captures keep weak views of graph outputs
  (:mod:`graphkv.runtime.capture.weak`), whose blocks every later key reuses, so a measured
  calibration finds this term near 0; the uncalibrated default still charges a hidden-sized output
  per token per key, an upper bound;
- each key pays a **per-graph** cost (allocator rounding and anything else a graph keeps,
  ``per_graph_bytes``).

``key_bytes(first) = per_graph + output x n + workspace x n``, ``key_bytes(later) = per_graph +
output x n``; the graph pool is their sum: the largest key's footprint plus what every graph keeps.
Beside it, ``lazy_workspace_bytes`` records what lazily allocated workspaces (cuBLAS's, one set per
stream) cost once before the first capture; it is carried in the calibration, not in a key, and the
ledger charges those workspaces by PyTorch's own rule instead (its ``lazy workspaces`` entry,
:mod:`graphkv.plan.allocations.blas_workspaces`).

The coefficients depend on the model and the GPU, so they come from measurement: ``graphkv bench
memory --out DIR`` reads each key's capture through the capture's own pool
(:mod:`graphkv.memory.graph_pool_reader`: the bytes kept after the capture, the capture's peak and
the segments it opened), :func:`fit_graph_pool` fits a line ``per_graph + output x n`` through the
kept bytes of every key after the first and takes the first key's footprint above it as the
workspace, and the
benchmark writes ``graph_calibration.json``, which :meth:`GraphPoolModel.from_file` reads and
``compile(..., graph_pool=...)`` (``graphkv plan --graph-calibration PATH``) uses. The planner
reads a calibration only when given one (``graphkv plan --gpu`` also reads the ones
:mod:`graphkv.calibrations` ships: llama-3.1-8b's, measured on an H100 on 2026-11-26).

Without a calibration the default is **uncalibrated**: a workspace of ``4 x hidden_size x 2``
bytes per token (four live bf16 hidden-sized activations, the earlier fixed guess), outputs of
``hidden_size x 2`` bytes per token (a model returning hidden states; one returning logits keeps
``vocab_size x itemsize``) and no per-graph cost. It was never measured against a GPU here; treat
it as an order of magnitude, and calibrate before trusting a reserve built on it.
"""

from __future__ import annotations

import json
import math
import os
from fractions import Fraction
from typing import Any, Sequence

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.inputs.json_file import read_json_file
from graphkv.plan.graph_keys import GraphKey

__all__ = ["CALIBRATION_FORMAT", "GraphKeyEstimate", "GraphPoolModel", "fit_graph_pool"]

CALIBRATION_FORMAT = "graphkv.graph_calibration/1"
_DEFAULT_ACTIVATIONS = 4  # live hidden-state-sized tensors a captured step typically holds at once
_BF16 = 2
_MAX_COEFFICIENT = 1 << 50  # 1 PiB: a calibration coefficient beyond it is no measurement of a GPU
_MAX_HIDDEN_SIZE = 1 << 20  # the widest models are about 25k wide
_CALIBRATION_FILE = "the graph_calibration.json that `graphkv bench memory --out DIR` wrote"


@attrs.frozen(kw_only=True)
class GraphKeyEstimate:
    """The estimated graph memory of one capture key."""

    num_tokens: int
    uniform: bool
    nbytes: int
    reason: str


@attrs.frozen(kw_only=True)
class GraphPoolModel:
    """Coefficients of the per-key graph memory model (see the module docstring)."""

    per_graph_bytes: float
    output_bytes_per_token: float
    workspace_bytes_per_token: float
    calibrated: bool
    source: str  # where the coefficients come from, for the ledger's reasons
    hidden_size: int | None = None  # the hidden size they were measured at (scaled to the planned model's)
    lazy_workspace_bytes: float = 0.0  # lazy workspaces (cuBLAS) allocated once before the first capture (no key's)

    @classmethod
    def default(cls, hidden_size: int | None) -> "GraphPoolModel | None":
        """The uncalibrated default for a model of ``hidden_size`` (``None``: no estimate possible)."""
        if hidden_size is None:
            return None
        return cls(per_graph_bytes=0.0, output_bytes_per_token=float(hidden_size * _BF16),
                   workspace_bytes_per_token=float(_DEFAULT_ACTIVATIONS * hidden_size * _BF16), calibrated=False,
                   source=f"uncalibrated default: workspace {_DEFAULT_ACTIVATIONS} x hidden_size {hidden_size} x 2 B, "
                          f"outputs hidden_size x 2 B per token, no per-graph cost", hidden_size=hidden_size)

    def scaled_to(self, hidden_size: int | None) -> "GraphPoolModel":
        """These coefficients for a model of ``hidden_size``: per-token terms scale with the hidden size
        (a first-order assumption, stated in the reasons), the per-graph term does not."""
        if self.hidden_size is None or hidden_size is None or hidden_size == self.hidden_size:
            return self
        r = hidden_size / self.hidden_size
        return attrs.evolve(self, output_bytes_per_token=self.output_bytes_per_token * r,
                            workspace_bytes_per_token=self.workspace_bytes_per_token * r, hidden_size=hidden_size,
                            source=f"{self.source}, per-token terms scaled by hidden_size {hidden_size} / "
                                   f"{self.hidden_size}")

    def estimate(self, keys: Sequence[GraphKey]) -> tuple[GraphKeyEstimate, ...]:
        """Each key's bytes, ``keys`` in capture order (largest first: the first reserves the workspace)."""
        out = []
        for i, key in enumerate(keys):
            n = key.num_tokens
            outputs = self.output_bytes_per_token * n
            work = self.workspace_bytes_per_token * n if i == 0 else 0.0
            total = math.ceil(self.per_graph_bytes + outputs + work)
            parts = [f"{self.per_graph_bytes:.0f} B per graph", f"outputs {self.output_bytes_per_token:.1f} B x {n} tokens"]
            if i == 0:
                parts.append(f"workspace {self.workspace_bytes_per_token:.1f} B x {n} tokens (captured first: later "
                             "keys reuse it)")
            out.append(GraphKeyEstimate(num_tokens=n, uniform=key.uniform, nbytes=total,
                                        reason=" + ".join(parts) + f" ({self.source})"))
        return tuple(out)

    # ---- calibration files ------------------------------------------------------------------

    def to_dict(self, **measured: Any) -> dict[str, Any]:
        """The calibration file's JSON object (``measured``: extra fields, e.g. the device and keys)."""
        return {"format": CALIBRATION_FORMAT, "per_graph_bytes": self.per_graph_bytes,
                "output_bytes_per_token": self.output_bytes_per_token,
                "workspace_bytes_per_token": self.workspace_bytes_per_token,
                "lazy_workspace_bytes": self.lazy_workspace_bytes, "hidden_size": self.hidden_size,
                "source": self.source, **measured}

    def write(self, path: "str | os.PathLike[str]", **measured: Any) -> None:
        """Write the calibration file ``path`` (JSON)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(**measured), f, indent=2)
            f.write("\n")

    @classmethod
    def from_file(cls, path: "str | os.PathLike[str]", *, field: str = "graph_calibration") -> "GraphPoolModel":
        """Read a calibration file written by :meth:`write` (``graphkv bench memory --out DIR``).

        Read with :func:`~graphkv.inputs.read_json_file`: a regular file of at most 64 MiB nested at
        most 64 levels, so a FIFO, ``/dev/zero`` or a deeply nested file is refused, never a hang or a
        traceback. Raises :class:`SpecError` naming ``field`` and the file for a missing, unreadable,
        special or oversized file, bad JSON, another format, or coefficients that are not finite
        numbers >= 0. A file without ``lazy_workspace_bytes`` (written before it was measured) reads it as 0."""
        data = read_json_file(os.fspath(path), field=field, what=_CALIBRATION_FILE)
        return cls.from_dict(data, origin=str(path), field=field)

    @classmethod
    def from_dict(cls, data: Any, *, origin: str, field: str = "graph_calibration") -> "GraphPoolModel":
        """A calibration from its JSON object (``origin`` names the file in the reasons and errors)."""
        if not isinstance(data, dict) or data.get("format") != CALIBRATION_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise SpecError(Problem(field=field, value=origin, limit=f"has format {got!r}, not {CALIBRATION_FORMAT!r}",
                                    fix="write it with `graphkv bench memory --out DIR` (graph_calibration.json)"))
        problems = []
        values: dict[str, float] = {}
        for name in ("per_graph_bytes", "output_bytes_per_token", "workspace_bytes_per_token", "lazy_workspace_bytes"):
            v = data.get(name, 0.0) if name == "lazy_workspace_bytes" else data.get(name)
            if (isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v))
                    or not 0 <= v <= _MAX_COEFFICIENT):  # compared as given: a 400-digit int is no float
                shown = v if not isinstance(v, int) or v.bit_length() < 64 else f"an integer of {len(str(v))} digits"
                problems.append(Problem(field=f"{field}.{name}", value=shown,
                                        limit=f"in {origin} must be a finite number in [0, {_MAX_COEFFICIENT}] (1 PiB: "
                                              "no GPU holds more)",
                                        fix="measure again with `graphkv bench memory --out DIR`"))
            else:
                values[name] = float(v)
        hidden = data.get("hidden_size")
        if hidden is not None and (isinstance(hidden, bool) or not isinstance(hidden, int)
                                   or not 1 <= hidden <= _MAX_HIDDEN_SIZE):
            problems.append(Problem(field=f"{field}.hidden_size", value=hidden,
                                    limit=f"in {origin} must be an int in [1, {_MAX_HIDDEN_SIZE}] or null",
                                    fix="measure again with `graphkv bench memory --out DIR`"))
        if problems:
            raise SpecError(*problems)
        where = ", ".join(str(data[k]) for k in ("model", "device") if isinstance(data.get(k), str))
        return cls(**values, calibrated=True, hidden_size=hidden,
                   source=f"calibrated: {origin}" + (f" ({where})" if where else ""))


def fit_graph_pool(keys: Sequence[GraphKey], kept_bytes: Sequence[float], *, first_peak_bytes: float,
                   hidden_size: int | None, source: str, lazy_workspace_bytes: float = 0.0) -> GraphPoolModel:
    """Fit the model to what each key's capture left in its pool (pure; planning time).

    ``keys`` in capture order (largest first), ``kept_bytes`` the pool bytes each key's graph keeps
    after its capture, ``first_peak_bytes`` the first key's capture peak above what was allocated
    before it (:class:`graphkv.memory.graph_pool_reader.KeyMemory`). A least-squares line
    ``kept(n) = per_graph + output x n`` through the kept bytes of every key after the first gives
    the per-graph and output terms (the first key's capture also makes what the pool's captures
    allocate once, e.g. the PIECEWISE staging arena, so its kept bytes are no point of the line;
    with fewer than 3 keys every key is a point); ``workspace = (first_peak - kept(n_first)) /
    n_first``, the one-time allocations included. Coefficients are clamped at 0 (a negative cost is
    measurement noise): a negative slope refits a flat line, a negative intercept a line through
    the origin. ``lazy_workspace_bytes`` is carried as measured.

    >>> keys = [GraphKey(num_tokens=n, num_reqs=None, uniform=True) for n in (8, 4, 2, 1)]
    >>> fit = fit_graph_pool(keys, [5080, 1040, 1020, 1010], first_peak_bytes=5080 + 300 * 8, hidden_size=None,
    ...                      source="doc")
    >>> fit.per_graph_bytes, fit.output_bytes_per_token, fit.workspace_bytes_per_token
    (1000.0, 10.0, 800.0)
    """
    if len(keys) != len(kept_bytes) or not keys:
        raise SpecError(Problem(field="kept_bytes", value=len(kept_bytes),
                                limit=f"needs one value per key ({len(keys)})", fix="measure every captured key"))
    line = slice(1, None) if len(keys) >= 3 else slice(None)
    per_graph, slope = _kept_line([k.num_tokens for k in keys[line]], [float(b) for b in kept_bytes[line]])
    first_n = keys[0].num_tokens
    workspace = max((float(first_peak_bytes) - (per_graph + slope * first_n)) / first_n, 0.0)
    return GraphPoolModel(per_graph_bytes=per_graph, output_bytes_per_token=slope, workspace_bytes_per_token=workspace,
                          calibrated=True, source=source, hidden_size=hidden_size,
                          lazy_workspace_bytes=max(float(lazy_workspace_bytes), 0.0))


def _kept_line(num_tokens: Sequence[int], kept_bytes: Sequence[float]) -> tuple[float, float]:
    """``(intercept, slope)`` of the least-squares line through ``(n, kept)``, both >= 0, computed in
    exact fractions (byte counts that lie on a line give its integers back, not 10.000000000000002)."""
    ns, bs = [Fraction(n) for n in num_tokens], [Fraction(b) for b in kept_bytes]
    count = len(ns)
    mean_n, mean_b = sum(ns) / count, sum(bs) / count
    var = sum((n - mean_n) ** 2 for n in ns)
    if var == 0:  # one size only: no slope to fit
        return float(max(mean_b, 0)), 0.0
    slope = sum((n - mean_n) * (b - mean_b) for n, b in zip(ns, bs)) / var
    if slope < 0:
        return float(max(mean_b, 0)), 0.0
    intercept = mean_b - slope * mean_n
    if intercept < 0:  # through the origin instead
        return 0.0, float(max(sum(n * b for n, b in zip(ns, bs)) / sum(n * n for n in ns), 0))
    return float(intercept), float(slope)
