"""``memory.png``: predicted vs measured memory per phase and per capture size (matplotlib, Agg).

One row of two panels per benchmark run: the runtime phases (KV pool, static buffers, host
buffers, and on a GPU the lazy cuBLAS workspaces) as bars on a log scale, and each capture key's graph memory against its token count,
predicted as a line and measured as points (absent where graphs were not captured, e.g. on a CPU,
which the panel says). Needs the ``bench`` extra (matplotlib).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from graphkv.extras import require
from graphkv.memory.bench import LAZY_WORKSPACES, MemoryRun

__all__ = ["write_plot"]

_PHASES = ("kv_pool", "static_buffers", "host_buffers", LAZY_WORKSPACES)


def write_plot(runs: Sequence[MemoryRun], path: "str | os.PathLike[str]") -> None:
    """Write the PNG of ``runs`` to ``path``."""
    require("bench", "matplotlib", needed_by="graphkv bench memory --out (memory.png)")
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 4 * len(runs)), squeeze=False)
    try:
        for (bars, graphs), run in zip(axes, runs):
            _phases(bars, run)
            _graphs(graphs, run)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def _phases(ax: Any, run: MemoryRun) -> None:
    rows = {r.phase: r for r in run.rows}
    names = [p for p in _PHASES if p in rows]
    xs = range(len(names))
    predicted = [max(rows[n].predicted_bytes, 1) for n in names]
    measured = [max(rows[n].measured_bytes or 0, 1) for n in names]
    ax.bar([x - 0.2 for x in xs], predicted, width=0.4, label="predicted (ledger)")
    ax.bar([x + 0.2 for x in xs], measured, width=0.4, label="measured")
    ax.set_xticks(list(xs), names)
    ax.set_yscale("log")
    ax.set_ylabel("bytes")
    ax.set_title(f"{run.model} on {run.device}: runtime phases")
    ax.legend()


def _graphs(ax: Any, run: MemoryRun) -> None:
    keys = [r for r in run.rows if r.num_tokens is not None]
    ax.set_title(f"{run.model}: graph memory per capture key")
    ax.set_xlabel("capture size (tokens)")
    ax.set_ylabel("bytes")
    if not keys:
        ax.text(0.5, 0.5, "no capture keys", ha="center", va="center", transform=ax.transAxes)
        return
    for uniform, name in ((True, "decode"), (False, "mixed")):
        mine = sorted((r for r in keys if r.uniform is uniform), key=lambda r: r.num_tokens or 0)
        if not mine:
            continue
        ax.plot([r.num_tokens for r in mine], [max(r.predicted_bytes, 1) for r in mine],
                marker="." if uniform else "x", label=f"{name}: predicted")
        seen = [r for r in mine if r.measured_bytes is not None]
        if seen:
            ax.scatter([r.num_tokens for r in seen], [r.measured_bytes for r in seen],
                       label=f"{name}: measured")
    if all(r.measured_bytes is None for r in keys):
        ax.text(0.5, 0.9, keys[0].method, ha="center", va="top", wrap=True, fontsize=8,
                transform=ax.transAxes)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend()
