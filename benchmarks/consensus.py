"""compile_consensus over 4 gloo ranks on this CPU: how long the agreement takes, beside its collectives alone.

Four processes join one gloo group (tcp://127.0.0.1, a free port). For each model and layout, every
rank plans its own shard / stage from its own budget (10, 11, 12, 13 GiB) and the ranks agree.
Per call, interleaved and after a barrier so every rank starts together:

- ``compile_consensus``: the whole call — local plan, monitored barrier, exchange of reports,
  agreement, every stage's agreed plan;
- the peer, ``collectives``: the same monitored barrier and ``all_gather_object`` of the same
  report and nothing else — what any agreement over torch.distributed pays;
- ``local plan``: ``graphkv.compile`` of the rank's own model (no communication).

The medians (per rank; the table shows the slowest rank's) and ``ratio = compile_consensus /
collectives``. Target: compile_consensus well under a second (< 1 s, the ``< 1 s`` column). The
last column is the same agreement simulated in one process (``graphkv plan --tp --pp``'s path).
torch runs 1 thread per rank (``--threads``).

    python benchmarks/consensus.py        # --repeats 30, writes benchmarks/results/consensus.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from timing import interleaved_medians

RANKS = 4
CASES = (("qwen3-next-80b-a3b", 2, 2), ("llama-3.1-8b", 4, 1), ("deepseek-v3", 1, 4), ("jamba-mini-1.5", 2, 2))
TARGET_S = 1.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "consensus.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def _worker(rank: int, port: int, repeats: int, threads: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    import graphkv
    from graphkv import Budget, Limits
    from graphkv.distributed import budget_report, compile_consensus
    from graphkv.presets import preset_model

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS,
                            timeout=timedelta(seconds=60))
    wait = timedelta(seconds=30)
    rows = []
    for preset, tp, pp in CASES:
        whole = preset_model(preset)
        local = whole.shard(tp, rank % tp).stage(pp, rank // tp)
        limits, budget = Limits(max_num_seqs=64), Budget.kv_bytes(f"{10 + rank}GiB")
        report = budget_report(local, limits, budget, rank=rank)

        def collectives() -> None:
            dist.monitored_barrier(timeout=wait, wait_all_ranks=True)
            gathered: list[Any] = [None] * RANKS
            dist.all_gather_object(gathered, report)

        calls = {"compile_consensus": lambda: compile_consensus(local, limits, budget, timeout=30),
                 "collectives": collectives,
                 "local plan": lambda: graphkv.compile(local, limits, budget)}
        times: dict[str, list[float]] = {name: [] for name in calls}
        agreed = None
        for i in range(repeats + 3):  # 3 warm-up rounds
            for name, call in calls.items():
                dist.barrier()
                start = time.perf_counter()
                result = call()
                elapsed = time.perf_counter() - start
                if i >= 3:
                    times[name].append(elapsed)
                if name == "compile_consensus":
                    agreed = result
        assert agreed is not None
        rows.append({"preset": preset, "tp": tp, "pp": pp, "num_blocks": agreed.num_blocks,
                     "max_model_len": agreed.max_model_len, **{f"{k}_ms": _median_ms(v) for k, v in times.items()}})
    Path(out, f"{rank}.json").write_text(json.dumps({"rows": rows, "threads": torch.get_num_threads()}))
    dist.destroy_process_group()


def _simulated_ms(repeats: int) -> list[float]:
    from graphkv import Budget, Limits
    from graphkv.distributed import simulate_consensus
    from graphkv.presets import preset_model

    def simulate(preset: str, tp: int, pp: int) -> Callable[[], None]:
        whole = preset_model(preset)
        return lambda: simulate_consensus(whole, Limits(max_num_seqs=64),
                                          lambda r, _m: Budget.kv_bytes(f"{10 + r}GiB"), tp_size=tp, pp_size=pp)

    medians = interleaved_medians({case: simulate(*case) for case in CASES}, repeats)
    return [medians[case] * 1e3 for case in CASES]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table and write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (default: 1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    import torch
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(_free_port(), args.repeats, args.threads, out), nprocs=RANKS, join=True)
        per_rank = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(RANKS)]
    simulated = _simulated_ms(args.repeats)
    rows = []
    for i, (preset, tp, pp) in enumerate(CASES):
        ranks = [p["rows"][i] for p in per_rank]
        slowest = {key: max(r[key] for r in ranks) for key in ("compile_consensus_ms", "collectives_ms", "local plan_ms")}
        rows.append({**ranks[0], **slowest, "ratio": slowest["compile_consensus_ms"] / slowest["collectives_ms"],
                     "simulated_ms": simulated[i], "under_target": slowest["compile_consensus_ms"] < TARGET_S * 1e3})
    threads = per_rank[0]["threads"]
    print(f"compile_consensus over {RANKS} gloo ranks on one host, median of {args.repeats} (slowest rank's median; "
          f"Python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs, torch threads "
          f"{threads} per rank)")
    header = (f"{'preset':<20}{'tp x pp':>8}{'num_blocks':>12}{'local plan ms':>15}{'collectives ms':>16}"
              f"{'consensus ms':>14}{'ratio':>8}{'< 1 s':>7}{'1-process ms':>14}")
    print(header)
    for r in rows:
        print(f"{r['preset']:<20}{str(r['tp']) + ' x ' + str(r['pp']):>8}{r['num_blocks']:>12}"
              f"{r['local plan_ms']:>15.2f}{r['collectives_ms']:>16.2f}{r['compile_consensus_ms']:>14.2f}"
              f"{r['ratio']:>7.2f}x{'pass' if r['under_target'] else 'FAIL':>7}{r['simulated_ms']:>14.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                                    "threads_per_rank": threads, "repeats": args.repeats, "rows": rows}, indent=2)
                        + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["under_target"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
