"""``graphkv bench memory --full-depth``: a preset captured at its own depth against the shipped calibration."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from graphkv.calibrations import shipped_calibration
from graphkv.memory.bench import LAZY_WORKSPACES, PhaseRow
from graphkv.memory.full_depth import check_full_depth, holds_within
from graphkv.spec.limits import Limits

SMALL = dict(hidden_size=64, intermediate_size=64, vocab_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16)


def _key(n: int, predicted: int, measured: int | None) -> PhaseRow:
    return PhaseRow(phase=f"graph_pool mixed({n})", predicted_bytes=predicted, measured_bytes=measured, method="m",
                    num_tokens=n, uniform=False)


def _lazy(predicted: int, measured: int) -> PhaseRow:
    return PhaseRow(phase=LAZY_WORKSPACES, predicted_bytes=predicted, measured_bytes=measured, method="m")


def test_holds_within_sums_the_measured_keys_and_the_lazy_workspaces_against_their_estimates() -> None:
    """Keys 1000 + 10 + 0 B and 300 B of workspaces measured against 1200 + 20 + 20 + 400 reserved: holds, -330 B."""
    rows = [PhaseRow(phase="kv_pool", predicted_bytes=5, measured_bytes=9, method="m"), _lazy(400, 300),
            _key(64, 1200, 1000), _key(8, 20, 10), _key(1, 20, 0)]
    holding = holds_within(rows, calibration="llama on H100")
    assert (holding.measured_bytes, holding.reserved_bytes, holding.holds) == (1310, 1640, True)
    assert holding.line == ("holds within the calibration llama on H100: 3 keys and the lazy workspaces measured "
                            "1,310 B against 1,640 B reserved (-330 B, -20.12 %)")


def test_holds_within_says_when_a_key_exceeds_and_when_keys_were_not_captured() -> None:
    """1,300 B measured for 1,220 B reserved EXCEEDS (+6.56 %); a key not captured is left out, named, and the check
    does not hold even below the reserve; nothing measured (a CPU) is None."""
    exceeds = holds_within([_key(64, 1200, 1290), _key(8, 20, 10)], calibration="c")
    assert not exceeds.holds and exceeds.line == ("EXCEEDS the calibration c: 2 keys and the lazy workspaces measured "
                                                  "1,300 B against 1,220 B reserved (+80 B, +6.56 %)")
    partial = holds_within([_key(64, 1200, 1000), _key(8, 20, 10), _key(1, 20, None)], calibration="c")
    assert not partial.holds and partial.line == ("CANNOT TELL against the calibration c: 2 keys and the lazy "
                                                  "workspaces measured 1,010 B against 1,220 B reserved (-210 B, "
                                                  "-17.21 %); 1 of 3 keys not captured")
    assert holds_within([_lazy(1, 1), _key(1, 20, None)], calibration="c") is None


def test_check_full_depth_builds_the_preset_at_its_own_depth_planned_with_the_calibration() -> None:
    """On a CPU (widths shrunk) llama-3.1-8b is built at all 32 layers, its keys estimated by the shipped H100
    calibration (scaled to hidden 64, as the planner scales it; the first key carries the workspace), and the check
    says nothing was measured."""
    from graphkv.memory.meters import open_meter
    from graphkv.memory.progress import Progress

    cpu = torch.device("cpu")
    shipped = shipped_calibration("H100", "llama-3.1-8b")
    check = check_full_depth("llama-3.1-8b", cpu, open_meter(cpu), Progress(False),
                             limits=Limits(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16,
                                           max_cudagraph_capture_size=16),
                             kv_bytes=1 << 20, calibration=shipped, dtype="float32", **SMALL)
    assert check.num_layers == 32 and check.run.model == "llama-3.1-8b (32 layers)" and check.holding is None
    keys = [r for r in check.run.rows if r.num_tokens is not None]
    expected = shipped.graph_pool.scaled_to(64).estimate(_keys(Limits(max_model_len=64, max_num_seqs=2,
                                                                      max_num_batched_tokens=16,
                                                                      max_cudagraph_capture_size=16)))
    assert [r.predicted_bytes for r in keys] == [e.nbytes for e in expected]
    assert keys[0].predicted_bytes > 50 * keys[1].predicted_bytes  # the workspace rides on the first (largest) key
    assert check.summary.startswith("not checked at 32 layers: not measured: CUDA graphs need a GPU")


def _keys(limits):
    """The capture keys of llama-3.1-8b's plan under ``limits``, in capture order."""
    from graphkv.plan import compile_plan
    from graphkv.plan.graph_keys import capture_keys
    from graphkv.presets import preset_model
    from graphkv.spec.budget import Budget

    plan = compile_plan(preset_model("llama-3.1-8b"), limits, Budget.kv_bytes("1GiB"))
    return capture_keys(plan.cudagraph, plan.limits)


def test_check_full_depth_without_a_gpu_or_a_calibration_builds_nothing() -> None:
    """On a CPU at the preset's own widths nothing is built; with widths shrunk but no calibration, nothing either."""
    from graphkv.memory.meters import open_meter
    from graphkv.memory.progress import Progress

    cpu = torch.device("cpu")
    args = (cpu, open_meter(cpu), Progress(False))
    plain = check_full_depth("llama-3.1-8b", *args, limits=Limits(), kv_bytes=1 << 20)
    assert plain.run is None and plain.summary == "not checked at 32 layers: CUDA graphs need a GPU"
    bare = check_full_depth("llama-3.1-8b", *args, limits=Limits(), kv_bytes=1 << 20, **SMALL)
    assert bare.run is None and bare.summary == ("not checked at 32 layers: no calibration given (a GPU reads the "
                                                 "one shipped for it)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU --full-depth builds the 16 GB model")
def test_bench_memory_full_depth_on_a_cpu_says_why_and_exits_0() -> None:
    """`graphkv bench memory --model llama-3.1-8b --full-depth` on a CPU measures the pool and says the whole-depth
    check needs a GPU."""
    done = subprocess.run([sys.executable, "-m", "graphkv.cli", "bench", "memory", "--model", "llama-3.1-8b",
                           "--full-depth", "--kv-memory", "64MiB", "--no-progress"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "llama-3.1-8b: not checked at 32 layers: CUDA graphs need a GPU" in done.stdout


def test_bench_memory_exit_status_follows_the_full_depth_verdict(monkeypatch) -> None:
    """run_bench exits 1 when a --full-depth run did not hold (EXCEEDS, or a GPU that could not check), else 0."""
    import argparse

    import graphkv.memory.command as command
    from graphkv.memory.bench import MemoryRun

    def run(holds):
        return MemoryRun(model="llama-3.1-8b", device="cuda", budget="b", rows=(), calibration=None, holds=holds)

    args = argparse.Namespace(models=["llama-3.1-8b"], device="cpu", kv_memory=None, out=None, no_progress=True,
                              full_depth=True, processes=1, compile="piecewise")
    for holds, status in ((True, 0), (None, 0), (False, 1)):
        monkeypatch.setattr(command, "bench_memory", lambda options, holds=holds: [run(True), run(holds)])
        assert command.run_bench(args) == status


def test_bench_memory_full_depth_of_the_demo_alone_is_refused(capsys) -> None:
    """--full-depth checks presets against their shipped calibration: with only --model demo it checked nothing and
    said nothing; now it exits 2 naming the flag and both fixes."""
    from graphkv.cli import main

    assert main(["bench", "memory", "--model", "demo", "--full-depth", "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == ("graphkv: error: --full-depth='--model demo': checks presets at their own depth against their "
                   "shipped calibration; the demo has neither; add --model PRESET (`graphkv presets`), or drop "
                   "--full-depth\n")


def test_bench_memory_compile_flag_takes_piecewise_or_fused(capsys) -> None:
    """--compile names how a preset's captures compile its forward: anything but piecewise / fused is refused with
    exit code 2, naming the flag and the choices."""
    from graphkv.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["bench", "memory", "--compile", "traced"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "--compile" in err and "'traced'" in err and "piecewise" in err and "fused" in err


def test_processes_pass_full_depth_and_compile_on_to_each_child(monkeypatch) -> None:
    """With --processes 3, each fresh process gets the same --full-depth and --compile as the command."""
    import argparse

    import graphkv.memory.repeat as repeat
    from graphkv.memory import command

    seen = {}
    monkeypatch.setattr(repeat, "repeat_in_processes",
                        lambda argv, processes, **kw: seen.update(argv=list(argv), processes=processes))
    args = argparse.Namespace(models=["llama-3.1-8b"], device="cuda", kv_memory=None, out=None, no_progress=True,
                              full_depth=True, processes=3, compile="fused")
    assert command.run_bench(args) == 0
    assert seen == {"argv": ["--model", "llama-3.1-8b", "--device", "cuda", "--full-depth", "--compile", "fused"],
                    "processes": 3}
