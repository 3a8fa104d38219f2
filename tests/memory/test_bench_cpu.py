"""`graphkv bench memory` on a CPU: NVML unavailable and why, the CPU table (predicted == measured), JSON and PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graphkv.cli import main
from graphkv.plan.graph_pool import GraphPoolModel

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU table; a GPU runs test_bench_gpu.py")


def test_bench_memory_prints_the_cpu_table_and_writes_json_and_png(tmp_path, capsys):
    """Demo and llama-3.1-8b at 64 MiB: every runtime phase predicted == measured, graphs not measured on a CPU."""
    out = tmp_path / "bench"
    code = main(["bench", "memory", "--model", "demo", "--model", "llama-3.1-8b", "--kv-memory", "64MiB",
                 "--out", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert code == 0
    lines = text.splitlines()
    assert lines[1].startswith("NVML not ")  # why, in one line (unavailable here: no driver)
    assert lines[2].startswith("measured with: live storages")
    assert "  kv_pool              2,097,152 B  2,097,152 B  +0.00%  live storages: torch tensors" in lines
    assert "llama-3.1-8b: KV budget 64MiB (--kv-memory)" in lines
    assert any(line.startswith("  kv_pool ") and line.endswith("67,108,864 B  67,108,864 B  +0.00%  live storages: "
                                                                  "torch tensors") for line in lines)
    data = json.loads((out / "memory.json").read_text())
    rows = data["rows"]
    assert data["nvml"].startswith("NVML not available: ") and data["device"] == "cpu"
    assert set(rows[0]) == {"model", "phase", "predicted_bytes", "measured_bytes", "method"}
    measured = [r for r in rows if r["phase"] in ("kv_pool", "static_buffers", "host_buffers", "total")]
    assert len(measured) == 8 and all(r["predicted_bytes"] == r["measured_bytes"] for r in measured)
    demo_pool = next(r for r in rows if r["model"] == "tiny-hybrid" and r["phase"] == "kv_pool")
    assert demo_pool["measured_bytes"] == 2 * 1024 * 1024
    graphs = [r for r in rows if r["phase"].startswith("graph_pool ")]
    assert graphs and all(r["measured_bytes"] is None and "CUDA graphs need a GPU" in r["method"] for r in graphs)
    assert [r["phase"] for r in graphs if r["model"] == "tiny-hybrid"] == [
        "graph_pool decode(8)", "graph_pool decode(4)", "graph_pool decode(2)", "graph_pool decode(1)"]
    assert (out / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "graph_calibration.json").exists()
    assert "no graph_calibration.json: no capture key was measured" in text
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = readme.split("prints (after a header naming the machine):\n\n```text\n", 1)[1].split("```", 1)[0]
    assert lines[2:-2] == shown.rstrip("\n").split("\n")[1:]  # the README shows this very run (NVML line aside)


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt-5"], "--model='gpt-5': must be 'demo' or one of ["),
    (["--model", "llama-3.1-8b", "--kv-memory", "lots"], "--kv-memory='lots'"),
    (["--device", "cuda"], "--device='cuda': torch.cuda.is_available() is False"),
])
def test_bench_memory_refuses_bad_flags_in_one_line(argv, message, capsys):
    """Bad flags end in one 'graphkv: error:' line naming the flag, status 2, nothing allocated."""
    code = main(["bench", "memory", "--no-progress", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("graphkv: error: ") and message in err and len(err.strip().splitlines()) == 1


def test_bench_memory_api_refuses_an_unknown_device():
    """The API's device is checked like the flag: SpecError naming --device."""
    from graphkv.errors import SpecError
    from graphkv.memory.command import MemoryBenchOptions, bench_memory

    with pytest.raises(SpecError, match="--device='tpu': must be auto, cpu or cuda"):
        bench_memory(MemoryBenchOptions(models=("demo",), device="tpu", progress=False))


def test_bench_memory_out_must_be_a_directory(tmp_path, capsys):
    """--out naming a file is refused before anything runs."""
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["bench", "memory", "--model", "demo", "--out", str(target), "--no-progress"]) == 2
    assert "--out=" in capsys.readouterr().err


def test_a_written_calibration_plans(tmp_path, capsys):
    """A calibration file (as the GPU benchmark writes it) sets each key's graph memory in `graphkv plan --json`."""
    path = tmp_path / "graph_calibration.json"
    GraphPoolModel(per_graph_bytes=1 << 20, output_bytes_per_token=100.0, workspace_bytes_per_token=1000.0,
                   calibrated=True, source="test", hidden_size=2048).write(path, model="m", device="H100")
    assert main(["plan", "--preset", "llama-3.1-8b", "--kv-memory", "1GiB", "--max-num-seqs", "4",
                 "--max-num-batched-tokens", "16", "--max-cudagraph-capture-size", "16",
                 "--graph-calibration", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    keys = data["ledger"]["graph_keys"]
    # hidden 4096 / 2048 doubles the per-token terms: 200 B outputs, 2000 B workspace per token.
    assert [k["num_tokens"] for k in keys] == [16, 8, 4, 4, 2, 2, 1, 1]
    assert keys[0]["bytes"] == (1 << 20) + 16 * 200 + 16 * 2000 and keys[1]["bytes"] == (1 << 20) + 8 * 200
    assert "calibrated: " in keys[0]["reason"] and "(m, H100)" in keys[0]["reason"]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["plan", "--graph-calibration", str(bad)]) == 2
    assert "--graph-calibration=" in capsys.readouterr().err
