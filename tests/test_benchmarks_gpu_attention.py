"""benchmarks/gpu_attention.py: its CPU mode runs graphkv's decode kernel, paged flex and SDPA on the same data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_mode_runs_every_contender_on_one_tiny_cell(tmp_path: Path) -> None:
    """One 2-request x 600-token cell: three contenders side by side, graphkv split in nine (16 programs want 17
    splits to fill 132 SMs twice; a 38-block table allows 9 of at least 64 tokens), outputs equal SDPA's."""
    out = tmp_path / "gpu_attention.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu_attention.py", "--requests", "2", "--tokens", "600",
                           "--repeats", "1", "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "torch threads 1" in done.stdout and "vs sdpa" in done.stdout
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert (row["requests"], row["cached_tokens"], row["num_splits"]) == (2, 600, 9)
    assert all(row[f"{name}_ms"] > 0 for name in ("graphkv", "flex", "sdpa"))
    assert row["graphkv_max_diff"] < 0.02 and row["flex_max_diff"] < 0.02
    assert result["copy_gbps"] > 0
