"""Shipped graph calibrations: lookup by architecture and preset, labels checked, used by `plan --gpu`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import graphkv.calibrations as calibrations
from graphkv.calibrations import ARCH_OF_GPU, missing_reason, shipped_calibration, shipped_calibrations
from graphkv.cli import main
from graphkv.errors import SpecError
from graphkv.plan.graph_pool import CALIBRATION_FORMAT
from graphkv.spec.budget import KNOWN_GPUS

LABELS = {"model": "llama-3.1-8b", "arch": "sm_90", "device_name": "NVIDIA H100 80GB HBM3", "graphkv": "0.0.0",
          "torch": "2.11.0+cu130", "cuda": "13.0"}
COEFFICIENTS = {"per_graph_bytes": 4096.0, "output_bytes_per_token": 8192.0, "workspace_bytes_per_token": 65536.0,
                "hidden_size": 4096}


def write(directory: Path, name: str, **fields: object) -> Path:
    path = directory / name
    path.write_text(json.dumps({"format": CALIBRATION_FORMAT, **COEFFICIENTS, **LABELS, **fields}))
    return path


def test_every_known_gpu_has_an_architecture() -> None:
    assert set(ARCH_OF_GPU) == set(KNOWN_GPUS)
    assert ARCH_OF_GPU["h100"] == ARCH_OF_GPU["h200"] == "sm_90"


def test_the_package_ships_llama_measured_on_an_h100() -> None:
    """llama-3.1-8b for sm_90, labelled with the H100 and versions it was measured with; 90 keys at 2 layers kept;
    its model reserves the 8192-token key's 1,264,584,704 B footprint (the segments its capture opened and the staging
    arena) at 32 layers;
    nothing else ships."""
    (shipped,) = shipped_calibrations()
    assert (shipped.file, shipped.model, shipped.arch, shipped.device_name, shipped.torch) == (
        "llama-3.1-8b.sm_90.json", "llama-3.1-8b", "sm_90", "NVIDIA H100 80GB HBM3", "2.11.0+cu130")
    model = shipped_calibration("H100", "llama-3.1-8b").graph_pool
    assert model.calibrated and model.hidden_size == 4096 and model.lazy_workspace_bytes == 34_603_008
    assert (model.per_graph_bytes + (model.output_bytes_per_token + model.workspace_bytes_per_token) * 8192
            == pytest.approx(1_264_584_704, rel=1e-4))  # the 2-layer footprint; 1 KiB less per layer extrapolated
    assert model.output_bytes_per_token < 1.0  # graphs keep weak views of their outputs
    data = json.loads((Path(calibrations.__file__).parent / "llama-3.1-8b.sm_90.json").read_text())
    assert len(data["keys"]) == 90 and data["num_layers"] == 32 and "within the bar" in data["held_out"]
    assert shipped_calibration("H200", "llama-3.1-8b") is not None  # sm_90 too
    assert shipped_calibration("A100-80GB", "llama-3.1-8b") is None
    assert "shipped: llama-3.1-8b (sm_90)" in missing_reason("H100", "qwen3-next-80b-a3b")


def test_lookup_matches_architecture_and_preset(tmp_path: Path) -> None:
    write(tmp_path, "llama-3.1-8b.sm_90.json")
    write(tmp_path, "gpt-oss-20b.sm_90.json", model="gpt-oss-20b", per_graph_bytes=1.0)
    found = shipped_calibration("h200", "llama-3.1-8b", directory=tmp_path)  # an H100's serves an H200 (sm_90)
    assert found is not None and found.file == "llama-3.1-8b.sm_90.json"
    assert found.graph_pool.per_graph_bytes == 4096.0 and found.graph_pool.calibrated
    assert found.label == "llama-3.1-8b on NVIDIA H100 80GB HBM3 (sm_90; graphkv 0.0.0, torch 2.11.0+cu130, CUDA 13.0)"
    assert shipped_calibration("A100-80GB", "llama-3.1-8b", directory=tmp_path) is None  # sm_80
    assert shipped_calibration("H100", "qwen3-next-80b-a3b", directory=tmp_path) is None  # another model
    assert "shipped: gpt-oss-20b (sm_90), llama-3.1-8b (sm_90)" in missing_reason("H100", "x", directory=tmp_path)


@pytest.mark.parametrize("fields, message", [
    ({"arch": ""}, "must name its model, arch, device_name, graphkv, torch, cuda"),
    ({"torch": None}, "calibration[bad.json]='torch'"),
    ({"per_graph_bytes": -1}, "calibration[bad.json].per_graph_bytes=-1"),
])
def test_a_bad_file_is_named(tmp_path: Path, fields: dict, message: str) -> None:
    write(tmp_path, "bad.json", **fields)
    with pytest.raises(SpecError, match=None) as caught:
        shipped_calibrations(tmp_path)
    assert message in str(caught.value)
    assert "could not be read" in missing_reason("H100", "x", directory=tmp_path)


def test_plan_gpu_reserves_graph_memory_from_a_shipped_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`graphkv plan --gpu H100 --preset P` uses the calibration shipped for (sm_90, P), and says which."""
    argv = ["plan", "--preset", "llama-3.1-8b", "--gpu", "H100", "--json"]
    assert main(argv) == 0
    uncalibrated = json.loads(capsys.readouterr().out)
    write(tmp_path, "llama-3.1-8b.sm_90.json")
    monkeypatch.setattr(calibrations, "_directory", lambda directory: tmp_path if directory is None else Path(directory))
    assert main(argv) == 0
    calibrated = json.loads(capsys.readouterr().out)
    graph = [e for e in calibrated["ledger"]["entries"] if e["name"] == "graph pool"][0]
    assert "calibrated: llama-3.1-8b.sm_90.json" in graph["reason"]
    assert calibrated["budget"]["graph_reserve_bytes"] != uncalibrated["budget"]["graph_reserve_bytes"]
    assert main(argv[:-1]) == 0
    assert "graph pool from the shipped calibration of llama-3.1-8b on NVIDIA H100 80GB HBM3" in capsys.readouterr().out
    # --graph-calibration overrides it; --graph-reserve leaves the reserve to the user (no lookup)
    assert main(argv[:-1] + ["--graph-reserve", "2GiB"]) == 0
    assert "shipped calibration" not in capsys.readouterr().out
