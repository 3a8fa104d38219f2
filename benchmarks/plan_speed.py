"""How long `graphkv.compile` takes for every preset: the planning pass must stay under 5 ms.

For each preset (plus tensor-parallel and Mamba-cache-mode variants of the hybrid ones) the model
is built once, outside the timing; then ``graphkv.compile(model, limits, budget)`` is timed
``--repeats`` times. Prints a table (median and p90 in ms, pass/fail against the target) and
writes the same rows as JSON.

    python benchmarks/plan_speed.py                 # 50 repeats, writes benchmarks/results/plan_speed.json
    python benchmarks/plan_speed.py --repeats 200 --out /tmp/plan_speed.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import graphkv
from graphkv import Budget, GraphkvError, Limits
from graphkv.presets import list_presets, preset_model

TARGET_MS = 5.0
KV_MEMORY = "20GiB"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "plan_speed.json"


def variants(name: str) -> list[tuple[str, int, Limits]]:
    """``(label, tp, limits)`` to time for one preset: the default, and for hybrids tp=2 and the
    two prefix-caching Mamba modes."""
    base = [("tp1 auto", 1, Limits(tensor_parallel_size=1))]
    if not preset_model(name).is_hybrid:
        return base + [("tp1 len=32768", 1, Limits(max_model_len=32768, tensor_parallel_size=1))]
    return base + [
        ("tp2 auto", 2, Limits(tensor_parallel_size=2)),
        # align keeps 2 state pages per Mamba group per sequence: 128 sequences fit every preset
        ("tp1 align seqs=128", 1, Limits(mamba_cache_mode="align", max_num_seqs=128, tensor_parallel_size=1)),
        ("tp1 mamba=all", 1, Limits(mamba_cache_mode="all", tensor_parallel_size=1)),
    ]


def time_compile(model: graphkv.ModelKV, limits: Limits, budget: Budget, repeats: int) -> tuple[list[float], Any]:
    """Wall-clock milliseconds of each of ``repeats`` compiles (after one warm-up), and the plan."""
    plan = graphkv.compile(model, limits, budget)  # warm-up: imports, attrs caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        graphkv.compile(model, limits, budget)
        times.append((time.perf_counter() - start) * 1e3)
    return times, plan


def p90(values: list[float]) -> float:
    """The 90th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def measure(repeats: int) -> list[dict[str, Any]]:
    """One row per (preset, variant)."""
    budget = Budget.kv_bytes(KV_MEMORY)
    rows = []
    for name in list_presets():
        for label, tp, limits in variants(name):
            row: dict[str, Any] = {"preset": name, "variant": label}
            try:
                model = preset_model(name, tp=tp)
                times, plan = time_compile(model, limits, budget, repeats)
            except GraphkvError as e:
                row.update(error=str(e).splitlines()[0])
                rows.append(row)
                continue
            median = statistics.median(times)
            row.update(groups=len(plan.groups), num_blocks=plan.num_blocks, max_model_len=plan.max_model_len,
                       median_ms=round(median, 4), p90_ms=round(p90(times), 4), passed=median < TARGET_MS)
            rows.append(row)
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows as an aligned text table."""
    headers = ["preset", "variant", "groups", "num_blocks", "max_model_len", "median ms", "p90 ms", f"< {TARGET_MS:g} ms"]
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["preset"], r["variant"], "-", "-", "-", "-", "-", "error: " + r["error"]])
        else:
            table.append([r["preset"], r["variant"], str(r["groups"]), str(r["num_blocks"]), str(r["max_model_len"]),
                          f"{r['median_ms']:.3f}", f"{r['p90_ms']:.3f}", "pass" if r["passed"] else "FAIL"])
    widths = [max(len(row[i]) for row in [headers, *table]) for i in range(len(headers))]
    right = {2, 3, 4, 5, 6}
    return "\n".join("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     .rstrip() for row in [headers, *table])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 when any plan misses the target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50, help="timed compiles per row (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path (default: %(default)s)")
    args = parser.parse_args(argv)
    rows = measure(args.repeats)
    print(f"graphkv.compile, {KV_MEMORY} KV budget, median of {args.repeats} runs "
          f"(Python {platform.python_version()}, {platform.machine()})")
    print(format_rows(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"target_ms": TARGET_MS, "kv_memory": KV_MEMORY, "repeats": args.repeats,
                                    "python": platform.python_version(), "machine": platform.machine(),
                                    "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r.get("passed", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
