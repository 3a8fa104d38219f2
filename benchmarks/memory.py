"""Memory, predicted vs measured: plan -> allocate -> Step -> capture, each phase of this process.

The same benchmark as ``graphkv bench memory`` (see :mod:`graphkv.memory.bench` for what each phase
measures and how; it pins torch to 1 thread), run on the demo model and on presets whose KV budget is
scaled to the available memory. The peer beside each measured number is the plan's own prediction (its
ledger), with the error in %. On a GPU it measures this process through NVML's per-process accounting (a
co-tenant changes nothing), captures the demo model's graphs key by key and writes ``graph_calibration.json``;
on a CPU it says why NVML is unavailable and sums the runtime's live storages. Takes the command's options;
``--out`` defaults to ``benchmarks/results/memory/``.

    python benchmarks/memory.py                     # demo + llama-3.1-8b; writes benchmarks/results/memory/
    python benchmarks/memory.py --model demo --model qwen3-next-80b-a3b --kv-memory 4GiB
"""

from __future__ import annotations

import sys
from pathlib import Path

from graphkv.cli import main as graphkv_main

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "memory"


def main(argv: list[str] | None = None) -> int:
    """``graphkv bench memory --out benchmarks/results/memory`` with ``argv`` (default: this command line's)."""
    argv = sys.argv[1:] if argv is None else argv
    return graphkv_main(["bench", "memory", "--out", str(DEFAULT_OUT), *argv])


if __name__ == "__main__":
    raise SystemExit(main())
