"""benchmarks/decode_kernel_sweep.py: its CPU mode times two kernel settings beside SDPA on one tiny cell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_modules import benchmark_module

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_mode_sweeps_settings_and_cache_orders_beside_sdpa(tmp_path: Path) -> None:
    """Cell 3 x 97 with 1 and 2 splits over the NHD cache and its HND copy: every output equals SDPA's, each setting's
    ratio to SDPA recorded."""
    out = tmp_path / "sweep.json"
    done = subprocess.run([sys.executable, "benchmarks/decode_kernel_sweep.py", "--repeats", "1", "--strides", "nhd",
                           "hnd", "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "torch threads 1" in done.stdout and "vs sdpa" in done.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["requests"], r["cached_tokens"], r["splits"], r["warps"], r["stages"], r["tile_tokens"], r["stride"])
            for r in rows] == [(3, 97, 1, 4, 2, 16, "nhd"), (3, 97, 1, 4, 2, 16, "hnd"), (3, 97, 2, 4, 2, 16, "nhd"),
                               (3, 97, 2, 4, 2, 16, "hnd")]
    for r in rows:
        assert r["max_diff"] < 0.02 and r["ms"] > 0
        assert r["vs_sdpa"] == pytest.approx(r["ms"] / r["sdpa_ms"], rel=1e-2)


def test_a_malformed_cell_is_refused_with_the_flag() -> None:
    """--cells 32by4096 exits 2 naming the flag and the expected form."""
    done = subprocess.run([sys.executable, "benchmarks/decode_kernel_sweep.py", "--cells", "32by4096"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "--cells: '32by4096' is not REQUESTSxTOKENS" in done.stderr


def test_the_hnd_copy_holds_the_same_values_with_head_slabs_contiguous() -> None:
    """hnd_copy keeps the logical shape and every value; each (kv, page, head) slab of kbs x dim is contiguous."""
    import torch

    hnd_copy = benchmark_module("decode_kernel_sweep").hnd_copy
    cache = torch.arange(2 * 5 * 16 * 8 * 4, dtype=torch.float32).reshape(2, 5, 16, 8, 4)
    hnd = hnd_copy(cache)
    assert hnd.shape == cache.shape and torch.equal(hnd, cache)
    assert hnd.stride() == (5 * 8 * 16 * 4, 8 * 16 * 4, 4, 16 * 4, 1)
