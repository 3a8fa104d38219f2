"""Memory, predicted vs measured: plan -> allocate -> Step -> capture, each phase of this process.

The same benchmark as ``graphkv bench memory`` (see :mod:`graphkv.memory.bench` for what each phase
measures and how), run on the demo model and on presets whose KV budget is scaled to the available
memory. The peer beside each measured number is the plan's own prediction (its ledger), with the
error in %. On a GPU it measures this process through NVML's per-process accounting (a co-tenant
changes nothing), captures the demo model's graphs key by key and writes ``graph_calibration.json``;
on a CPU it says why NVML is unavailable and sums the runtime's live storages.

    python benchmarks/memory.py                     # demo + llama-3.1-8b; writes benchmarks/results/memory/
    python benchmarks/memory.py --model demo --model qwen3-next-80b-a3b --kv-memory 4GiB
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from graphkv.errors import GraphkvError
from graphkv.memory.command import DEFAULT_MODELS, MemoryBenchOptions, bench_memory

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "memory"


def main() -> int:
    """Parse the options, pin torch's threads, run, write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", dest="models", action="append", help=f"'demo' or a preset (default: {DEFAULT_MODELS})")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: %(default)s")
    parser.add_argument("--kv-memory", help="KV pool bytes of each preset (default: a quarter of the available memory)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}")
    try:
        bench_memory(MemoryBenchOptions(models=tuple(args.models or DEFAULT_MODELS), device=args.device,
                                        kv_memory=args.kv_memory, out=str(args.out), progress=sys.stderr.isatty()))
    except GraphkvError as e:
        print(f"memory.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
