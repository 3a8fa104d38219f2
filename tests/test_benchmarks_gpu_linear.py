"""benchmarks/gpu_linear.py: the decode step's matrices, torch's matmul and graphkv's small-matmul kernel side by
side (its CPU mode runs the kernel in Triton's interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from benchmark_modules import benchmark_module

ROOT = Path(__file__).resolve().parents[1]


def _gpu_linear() -> ModuleType:
    """benchmarks/gpu_linear.py as a module."""
    return benchmark_module("gpu_linear")


def test_shapes_are_the_serving_models() -> None:
    """The 0.94B model's projections (16 query heads and 8 KV heads of 128, hidden 2048, MLP 6144, vocab 32,000)."""
    assert _gpu_linear().GPU_SHAPES == {"q": (2048, 2048), "k": (1024, 2048), "v": (1024, 2048), "o": (2048, 2048),
                          "gate": (6144, 2048), "up": (6144, 2048), "down": (2048, 6144), "qkv": (4096, 2048),
                          "gate_up": (12288, 2048), "head": (32000, 2048)}


def test_step_totals_weigh_layers_and_the_head_once() -> None:
    """Per row count, unmerged and merged: each layer matrix counted ``layers`` times, the head once."""
    def cell(name: str, torch_ms: float, graphkv_ms: float, best_ms: float) -> dict:
        return {"matrix": name, "rows": 1, "torch": {"ms": torch_ms}, "graphkv": {"ms": graphkv_ms},
                "best": {"ms": best_ms}}

    rows = [cell(n, 0.01, 0.008, 0.005) for n in ("qkv", "o", "gate_up", "down")] + [cell("head", 0.1, 0.05, 0.04)]
    assert _gpu_linear().step_totals(rows, layers=2) == [
        "decode step, 1 row(s), merged: torch 180.0 us, graphkv 114.0 us (0.633x), sweep's best 80.0 us (0.444x)"]


def test_cpu_mode_runs_both_and_compares_outputs(tmp_path: Path) -> None:
    """Two tiny matrices at 3 rows: both contenders timed, graphkv's default configuration for one SM, its output
    torch's within float32 rounding; a one-configuration sweep adds its best."""
    out = tmp_path / "gpu_linear.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu_linear.py", "--rows", "3", "--matrices", "q", "head",
                           "--repeats", "1", "--sweep", "--tile-n", "4", "--tile-k", "32", "--warps", "4",
                           "--stages", "1", "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "torch threads 1" in done.stdout and "best of sweep" in done.stdout
    result = json.loads(out.read_text())
    assert [(r["matrix"], r["out_features"], r["in_features"], r["rows"]) for r in result["rows"]] == \
        [("q", 64, 64, 3), ("head", 200, 64, 3)]
    for row in result["rows"]:
        assert row["weight_bytes"] == row["out_features"] * row["in_features"] * 4
        assert row["default"] == {"tile_n": 16, "tile_k": 64, "num_warps": 4, "num_stages": 3}
        assert row["torch"]["ms"] > 0 and row["graphkv"]["ms"] > 0 and row["max_rel_diff"] < 1e-5
        assert row["best"]["config"] in ("n16/k64/w4/s3", "n4/k32/w4/s1") and row["best"]["max_rel_diff"] < 1e-5


@pytest.mark.parametrize("flags,message", [(["--rows", "17"], "--rows: [17] outside 1..16"),
                                           (["--matrices", "lm"], "--matrices: ['lm'] not among q, k, v"),
                                           (["--sweep", "--tile-n", "3"], "tile_n=3: must be a power of two")])
def test_bad_flags_stop_at_once_naming_the_flag(flags: list[str], message: str) -> None:
    """Exit code 2 and one line naming the flag, the value and the limit."""
    done = subprocess.run([sys.executable, "benchmarks/gpu_linear.py", *flags], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2 and message in done.stderr, done.stderr
