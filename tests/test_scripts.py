"""The scripts a person with a GPU runs first: they parse, refuse a machine without CUDA, and work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = ROOT / "scripts" / "gpu_check.sh"


def test_gpu_check_parses() -> None:
    """bash reads the whole GPU check without a syntax error."""
    subprocess.run(["bash", "-n", str(GPU_CHECK)], check=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the check would run in full (scripts/gpu_check.sh)")
def test_gpu_check_refuses_a_machine_without_cuda() -> None:
    """Without CUDA the check stops at once with exit code 2 and says why."""
    env = {k: v for k, v in os.environ.items() if k != "GPU_CHECK_ALLOW_CPU"}
    done = subprocess.run(["bash", str(GPU_CHECK)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr


def test_gpu_check_refuses_an_unknown_argument() -> None:
    """A flag the check does not know is one line on stderr and exit code 2."""
    done = subprocess.run(["bash", str(GPU_CHECK), "--fast"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown argument '--fast'" in done.stderr


@pytest.mark.slow
def test_gpu_check_runs_a_selected_step_and_writes_its_summary(tmp_path: Path) -> None:
    """One demo --hf step (on the CPU here) passes, and summary.md holds its row and the failure count."""
    env = dict(os.environ, GPU_CHECK_ALLOW_CPU="1", GPU_CHECK_OUT=str(tmp_path))
    done = subprocess.run(["bash", str(GPU_CHECK), "--steps", "demo-hf-llama"], capture_output=True, text=True,
                          env=env, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "**0 failures.**" in summary
    import numpy

    assert f"; numpy {numpy.__version__}; Python " in summary  # Triton 3.6's interpreter fails under numpy 2.4
    row = next(line for line in summary.splitlines() if line.startswith("| demo-hf-llama |"))
    assert "| pass |" in row and "for 12/12 requests" in row
    assert (tmp_path / "demo-hf-llama.log").exists()


@pytest.mark.slow
def test_big_model_script_serves_a_small_float32_model_with_generates_tokens() -> None:
    """The batch-32 script, shrunk to a 2-layer float32 model on the CPU's GPU path, equals model.generate."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_big_model.py"), "--device", "cpu",
                           "--layers", "2", "--hidden", "128", "--batch", "4", "--budget", "64", "--dtype", "float32",
                           "--min-prompt", "8", "--max-prompt", "100", "--new-tokens", "6", "--check", "4",
                           "--kernels", "triton"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "greedy tokens equal to model.generate for the first 4 prompts: 4/4" in done.stdout
    assert "ok: every request finished" in done.stdout


GPU_SERVING = ROOT / "benchmarks" / "gpu_serving.py"


@pytest.mark.slow
def test_gpu_serving_cpu_mode_reports_every_contender_and_batch(tmp_path: Path) -> None:
    """The serving benchmark's CPU mode measures all four contenders at batch 1 and 4; graphkv's tokens equal
    generate's."""
    import json  # appended to this file: its header stays as it was

    out = tmp_path / "gpu_serving.json"
    done = subprocess.run([sys.executable, str(GPU_SERVING), "--repeats", "1", "--new-tokens", "4",
                           "--max-prompt", "16", "--out", str(out)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "torch threads 1" in done.stdout
    result = json.loads(out.read_text())
    assert [row["batch"] for row in result["rows"]] == [1, 4] and result["threads"] == 1
    contenders = ["graphkv", "generate_batch", "generate", "generate_static_compiled"]
    # transformers 5.17's continuous batching sizes its cache from the device's free memory, which it reads as 0 on a
    # CPU (the GPU machine's transformers): reported as a contender that cannot run; the others still run after it
    if "available memory 0" in result["rows"][0]["generate_batch"].get("error", ""):
        contenders.remove("generate_batch")
        assert all(row["generate_batch"]["error"].startswith("MemoryError") for row in result["rows"])
    for row in result["rows"]:
        for name in contenders:
            fields = {"tok_s", "ms_per_step", "x_limit", "ttft_ms", "setup_s", "equal_to_generate"}
            assert fields <= set(row[name]), (name, row[name])
        graphkv = row["graphkv"]
        assert graphkv["equal_to_generate"] == row["batch"]
        assert set(graphkv["vs"]) == set(contenders[1:])
        assert graphkv["decode_steps"] >= 1 and graphkv["step_x_limit"] > 0


@pytest.mark.slow
def test_gpu_serving_runs_graphkv_fused_and_its_tokens_equal_generates(tmp_path: Path) -> None:
    """``--compile fused`` (the pieces between attention calls compiled by Inductor) with ``--merge-projections``
    (q/k/v and gate/up as one matmul each) and ``--trace-layers`` (one decoder layer traced and compiled for all) at
    batch 2 on the CPU mode: graphkv serves, its tokens equal generate's for both requests, and the header names
    graphkv's options."""
    import json  # appended to this file: its header stays as it was

    out = tmp_path / "gpu_serving.json"
    done = subprocess.run([sys.executable, str(GPU_SERVING), "--repeats", "1", "--new-tokens", "3", "--max-prompt",
                           "12", "--batches", "2", "--contenders", "graphkv,generate", "--compile", "fused",
                           "--merge-projections", "--trace-layers", "--out", str(out)], capture_output=True, text=True,
                          timeout=900, cwd=ROOT,
                          env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})  # a cold cache
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["graphkv"]["equal_to_generate"] == 2 and set(row["graphkv"]["vs"]) == {"generate"}
    # the set-up's compile time split: Dynamo's own tracing and the backend's (split, Inductor), both within it (on a
    # CPU, where no graph is captured at build, the forward compiles in the first serve)
    graphkv = row["graphkv"]
    assert 0 < graphkv["trace_s"] and 0 < graphkv["backend_s"] and graphkv["trace_s"] + graphkv["backend_s"] < \
        graphkv["setup_s"]
    # on a cold cache every Inductor compile is a miss (pieces of one structure share one compile, not a cache hit)
    assert graphkv["inductor_cache_misses"] >= 1
    assert (f"(Dynamo tracing {graphkv['trace_s']:.1f} s, compiling {graphkv['backend_s']:.1f} s; Inductor cache "
            f"{graphkv['inductor_cache_hits']} hits, {graphkv['inductor_cache_misses']} compiled afresh)") in done.stdout
    assert "graphkv: --compile fused, --merge-projections, --trace-layers\n" in done.stdout


def test_gpu_serving_refuses_merged_projections_without_a_split_forward() -> None:
    """``--merge-projections`` under ``--compile auto`` (projections run eagerly), and ``--trace-layers`` under
    ``--compile model`` (no split), stop at once with exit code 2, naming both flags and the fix."""
    done = subprocess.run([sys.executable, str(GPU_SERVING), "--merge-projections"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert "--merge-projections needs --compile piecewise or fused, not --compile auto; pass --compile fused" \
        in done.stderr
    done = subprocess.run([sys.executable, str(GPU_SERVING), "--trace-layers", "--compile", "model"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--trace-layers needs --compile piecewise or fused, not --compile model; pass --compile fused" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU --gpu would run the full workload")
def test_gpu_serving_refuses_gpu_mode_without_cuda() -> None:
    """``--gpu`` without CUDA stops at once with exit code 2 and says why."""
    done = subprocess.run([sys.executable, str(GPU_SERVING), "--gpu"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "--gpu needs CUDA" in done.stderr


@pytest.mark.slow
def test_gpu_serving_runs_an_isolated_contender_in_its_own_process_and_joins_its_row() -> None:
    """run_batch with the GPU's isolation (here on the CPU mode's workload): generate_static_compiled runs in a child
    of its own, its row joins graphkv's and generate's, marked isolated, with graphkv's ratio to it."""
    sys.path.insert(0, str(GPU_SERVING.parent))
    try:
        import gpu_serving
    finally:
        sys.path.remove(str(GPU_SERVING.parent))
    argv = ["--repeats", "1", "--new-tokens", "3", "--max-prompt", "12", "--batches", "2"]
    row = gpu_serving.run_batch(argv, 2, 1e9, ("graphkv", "generate", "generate_static_compiled"), gpu=True)
    assert set(row) >= {"graphkv", "generate", "generate_static_compiled"} and "generate_batch" not in row
    assert row["generate_static_compiled"]["isolated"] is True and "isolated" not in row["generate"]
    assert set(row["graphkv"]["vs"]) == {"generate", "generate_static_compiled"}
    assert row["graphkv"]["vs"]["generate_static_compiled"]["tok_s"] == pytest.approx(
        row["graphkv"]["tok_s"] / row["generate_static_compiled"]["tok_s"])
    assert row["graphkv"]["equal_to_generate"] == 2


@pytest.mark.slow
def test_gpu_serving_puts_the_attention_back_after_a_contender_that_failed_midway(monkeypatch) -> None:
    """A contender that switches the model's attention and fails before switching back (as transformers 5.17's
    generate_batch does, to its paged attention, when it cannot size its cache) is reported, and generate after it
    runs on the model's own attention."""
    sys.path.insert(0, str(GPU_SERVING.parent))
    try:
        import gpu_serving
    finally:
        sys.path.remove(str(GPU_SERVING.parent))
    seen = {}

    def breaks(model, prompts, args):
        seen["before"] = model.config._attn_implementation
        model.set_attn_implementation("eager")  # 5.17's: "paged|sdpa" (5.24 reads that as "sdpa")
        raise MemoryError("Memory footprint 730240 is more than available memory 0")

    def generate_noting_attention(model, prompts, args):
        seen["after"] = model.config._attn_implementation
        return gpu_serving.GenerateServer(model, prompts, args)

    monkeypatch.setitem(gpu_serving.SERVERS, "breaks", breaks)
    monkeypatch.setitem(gpu_serving.SERVERS, "generate", generate_noting_attention)
    monkeypatch.setattr(gpu_serving, "CONTENDERS", (*gpu_serving.CONTENDERS, "breaks"))
    args = gpu_serving.parse_args(["--repeats", "1", "--new-tokens", "3", "--max-prompt", "8", "--batches", "1",
                                   "--contenders", "breaks,generate"])
    row = gpu_serving.measure_batch(args, 1, 1e9)
    assert row["breaks"] == {"error": "MemoryError: Memory footprint 730240 is more than available memory 0"}
    assert seen == {"before": "sdpa", "after": "sdpa"}
    assert "error" not in row["generate"] and row["generate"]["tok_s"] > 0


DECODE_PROFILE = ROOT / "scripts" / "decode_profile_gpu.py"


@pytest.mark.slow
def test_decode_profile_runs_a_mode_on_the_gpu_path_on_a_cpu() -> None:
    """The decode-step profile (--device cpu: the GPU path interpreted) prints one row per mode with its wall times, and
    refuses a mode it does not know with exit code 2."""
    done = subprocess.run([sys.executable, str(DECODE_PROFILE), "--device", "cpu", "--layers", "1", "--batch", "2",
                           "--context", "8", "--steps", "2", "--modes", "attention"], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("attention "))
    # no device kernels; a wall time with the engine's overlap and one without
    assert row.split()[1:3] == ["0.0", "0.0"] and float(row.split()[4]) > 0 and float(row.split()[5]) > 0
    assert row.split()[6] == "n/a"  # no CUDA events on a CPU
    bad = subprocess.run([sys.executable, str(DECODE_PROFILE), "--device", "cpu", "--modes", "graph"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2
    assert ("--modes: ['graph'] not among attention, model, piecewise, fused, fused-1tok, fused-unbacked, "
            "fused-merged, fused-small" in bad.stderr)


@pytest.mark.slow
def test_decode_profile_compares_fused_with_its_former_traces() -> None:
    """'fused' serves batch 1 with one trace (every step size, 1-token steps included), as do 'fused-small' (merged
    projections and the small-matmul kernel) and 'fused-unbacked' (the step's sizes unbacked); 'fused-1tok' keeps the
    shape guard and traces 1-token steps again (two traces), so the decode step of each can be measured side by side
    on a GPU."""
    done = subprocess.run([sys.executable, str(DECODE_PROFILE), "--device", "cpu", "--layers", "1", "--batch", "1",
                           "--context", "8", "--steps", "2", "--modes", "fused,fused-1tok,fused-unbacked,fused-small"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("fused")}
    assert "  1 trace(s); " in rows["fused"] and "  2 trace(s); " in rows["fused-1tok"]
    assert "  1 trace(s); " in rows["fused-unbacked"] and "  1 trace(s); " in rows["fused-small"]


def test_decode_profile_ranks_kernels_by_device_time_per_step() -> None:
    """Two steps: a matmul launched twice (20 us), attention once (15 us), a norm once (1 us); the top 2 are the matmul
    (1 launch and 10 us per step, 20/36 of the time) and the attention (0.5 launches, 7.5 us, 15/36)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from decode_profile_gpu import top_kernels
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    rows = top_kernels([("gemv", 10.0), ("norm", 1.0), ("gemv", 10.0), ("attn", 15.0)], steps=2, top=2)
    assert rows == [{"name": "gemv", "launches_per_step": 1.0, "us_per_step": 10.0, "share": 20 / 36},
                    {"name": "attn", "launches_per_step": 0.5, "us_per_step": 7.5, "share": 15 / 36}]
    assert top_kernels([], steps=3, top=8) == []


def test_decode_profile_sums_kernels_by_kind() -> None:
    """Kernel names as an H100 profile shows them fall into their kinds (cuBLAS's nvjet / sm90 gemms are matmuls,
    Inductor's triton_poi / triton_red / triton_per kernels are fused, graphkv's decode and K/V-write kernels and flex
    templates their own, a copy kernel 'other'); over 2 steps the kinds sum launches and microseconds per step, with
    microseconds per launch, largest first."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from decode_profile_gpu import kernel_kind, kernel_kinds
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert [kernel_kind(n) for n in (
        "nvjet_tst_128x64_64x8_1x2_h_bz_TNT", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64",
        "void gemv2T_kernel_val<int, int, __nv_bfloat16>", "triton_poi_fused_add_mul_0", "triton_red_fused_mean_pow_1",
        "triton_per_fused__to_copy_add_mean_2", "_paged_decode_split_kernel", "_paged_decode_combine_kernel",
        "_reshape_and_cache_kernel", "triton_tem_fused_flex_attention_0", "void at::native::elementwise_kernel<128>",
        "_small_matmul_kernel",
    )] == ["matmul", "matmul", "matmul", "inductor fused", "inductor fused", "inductor fused",
           "graphkv decode attention", "graphkv decode attention", "graphkv K/V write", "flex attention", "other",
           "graphkv small matmul"]
    rows = kernel_kinds([("nvjet_a", 30.0), ("triton_poi_fused_0", 2.0), ("triton_red_fused_1", 3.0), ("nvjet_b", 10.0),
                         ("_paged_decode_split_kernel", 5.0)], steps=2)
    assert rows == [
        {"kind": "matmul", "launches_per_step": 1.0, "us_per_step": 20.0, "us_per_launch": 20.0, "share": 40 / 50},
        {"kind": "graphkv decode attention", "launches_per_step": 0.5, "us_per_step": 2.5, "us_per_launch": 5.0,
         "share": 5 / 50},
        {"kind": "inductor fused", "launches_per_step": 1.0, "us_per_step": 2.5, "us_per_launch": 2.5,
         "share": 5 / 50}]
    assert kernel_kinds([], steps=3) == []


GPU_PRIORITY = ROOT / "scripts" / "gpu_priority.sh"


def _stand_in_steps(steps: str) -> dict[str, str]:
    """The environment that runs gpu_priority.sh's ``steps`` (its GPU_PRIORITY_STEPS lines) on a CPU, with this
    interpreter as its python."""
    return dict(os.environ, GPU_PRIORITY_ALLOW_CPU="1", GPU_PRIORITY_STEPS=steps,
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def test_gpu_priority_lists_its_steps_and_refuses_bad_flags() -> None:
    """--list prints the fifteen steps in order with their limits; a bad budget or an unknown flag is one line on
    stderr and exit code 2."""
    subprocess.run(["bash", "-n", str(GPU_PRIORITY)], check=True)
    listed = subprocess.run(["bash", str(GPU_PRIORITY), "--list"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0
    assert [line.split()[1] for line in listed.stdout.splitlines()] == [
        "capture-cuda", "decode-kernel-cuda", "serving-fused", "small-matmul", "profile-b1", "kernel-sweep",
        "demo-hf-fused", "profile-b32", "hf-tests-fused", "memory-full-depth", "bisect-fused", "float32-tokens",
        "serving-merged", "vs-static-b32", "serving-layers"]
    old_format = subprocess.run(["bash", str(GPU_PRIORITY), "--list"], capture_output=True, text=True, timeout=60,
                                env=dict(os.environ, GPU_PRIORITY_STEPS="a|10|true"))  # the former 3 fields
    assert old_format.returncode == 2 and "step 'a' is not 'name|limit seconds|minimum seconds|command'" in \
        old_format.stderr
    for argv, text in ((["--budget", "0"], "--budget '0' must be a whole number >= 1"),
                       (["--from", "x"], "--from 'x' must be a whole number >= 1"),
                       (["--fast"], "unknown argument '--fast'")):
        done = subprocess.run(["bash", str(GPU_PRIORITY), *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and text in done.stderr, done.stderr


def test_gpu_priority_stops_at_its_budget_and_writes_the_summary(tmp_path: Path) -> None:
    """Three stand-in steps under a 40 s budget from step 2: step 2 (a 100 s sleep) is cut at what is left of the
    budget less 5 s (TIMEOUT), step 3 is skipped and listed, summary.md holds both rows, the exit status is 1; a
    relative --out is taken from where the script was called, and --from past the last step is refused."""
    steps = "one|10|5|true\nsleeper|100|5|sleep 100\nlast|10|10|true"
    env = _stand_in_steps(steps)
    done = subprocess.run(["bash", str(GPU_PRIORITY), "--budget", "40", "--from", "2", "--out", "out"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    rows = [line for line in (tmp_path / "out" / "summary.md").read_text().splitlines() if line.startswith("| ")][2:]
    assert [row.split("|")[2].strip() for row in rows] == ["sleeper", "last"]
    # cut at what is left less 5 s: 35 s less the summary header's reading (two Python starts) before step 1
    assert rows[0].split("|")[3].strip() == "TIMEOUT" and 25 <= int(rows[0].split("|")[4]) <= 40
    assert rows[1].split("|")[3].strip().startswith("skipped")
    assert (tmp_path / "out" / "2-sleeper.log").exists() and "1 step(s) failed or timed out" in done.stdout
    import numpy
    import transformers
    import triton

    summary = (tmp_path / "out" / "summary.md").read_text()  # the stack the figures came from (torch 2.11 on the H100)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    assert (f"    {device}, torch {torch.__version__}\n    Triton {triton.__version__}, numpy {numpy.__version__}, "
            f"transformers {transformers.__version__}\n") in summary
    past = subprocess.run(["bash", str(GPU_PRIORITY), "--from", "4"], capture_output=True, text=True, env=env,
                          timeout=60, cwd=tmp_path)
    assert past.returncode == 2 and "--from 4 is past the last step (3)" in past.stderr


def test_gpu_priority_runs_every_command_of_a_step_and_the_shorter_steps_that_fit(tmp_path: Path) -> None:
    """A step of several commands runs them all (a failing first one no longer hides the rest) and fails; a step
    needing more than is left is skipped while a later, shorter one still runs; summary.md's header is read once."""
    steps = ("two|20|5|r=0; run() { \"$@\" || r=1; }; run false; run echo second ran; exit $r\n"
             "long|50|1000|true\nshort|20|5|echo short ran")
    env = _stand_in_steps(steps)
    done = subprocess.run(["bash", str(GPU_PRIORITY), "--budget", "60", "--out", str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    rows = [line.split("|") for line in (tmp_path / "summary.md").read_text().splitlines() if line.startswith("| ")][2:]
    assert [(row[2].strip(), row[3].strip()) for row in rows] == [
        ("two", "exit 1"), ("long", rows[1][3].strip()), ("short", "pass")]
    assert rows[1][3].strip().startswith("skipped (") and rows[1][3].strip().endswith("s of the budget left, 1000 s "
                                                                                      "needed)")
    assert "second ran" in (tmp_path / "1-two.log").read_text()


def test_gpu_priority_only_runs_the_named_steps_in_the_named_order(tmp_path: Path) -> None:
    """--only 3,1 runs step 3 then step 1 and nothing else (the summary's rows and the logs say so); a malformed or
    empty list, a step past the last or named twice, and --only with --from are refused with exit code 2."""
    steps = "one|10|1|echo one ran\ntwo|10|1|echo two ran\nthree|10|1|echo three ran"
    env = _stand_in_steps(steps)
    done = subprocess.run(["bash", str(GPU_PRIORITY), "--only", "3,1", "--out", str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|") for line in (tmp_path / "summary.md").read_text().splitlines() if line.startswith("| ")][2:]
    assert [(row[1].strip(), row[2].strip(), row[3].strip()) for row in rows] == [("3", "three", "pass"),
                                                                                  ("1", "one", "pass")]
    assert sorted(path.name for path in tmp_path.glob("*.log")) == ["1-one.log", "3-three.log"]
    for argv, text in ((["--only", "1,,2"], "--only '1,,2' must be step numbers separated by commas"),
                       (["--only", "2,4"], "--only names step 4, past the last step (3)"),
                       (["--only", ""], "--only '' must be step numbers"),  # not every step
                       (["--only"], "--only '' must be step numbers"),
                       (["--only", "1,1"], "--only names step 1 twice"),
                       (["--only", "99999999999999999999"], "must be step numbers"),
                       (["--only", "1", "--from", "2"], "--only and --from both choose the steps")):
        refused = subprocess.run(["bash", str(GPU_PRIORITY), *argv], capture_output=True, text=True,
                                 env=env, timeout=60, cwd=tmp_path)
        assert refused.returncode == 2 and text in refused.stderr, refused.stderr


def test_gpu_priority_demo_step_fails_when_tokens_differ(tmp_path: Path) -> None:
    """The real demo-hf-fused step (7) passes only when both demos print every request equal to model.generate: with
    a stand-in python printing 4/4 it passes, with 3/4 it fails (graphkv demo itself exits 0 either way)."""
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir()
    stub.write_text(f'#!/bin/bash\ncase "$*" in *"graphkv.cli demo"*) echo "$STUB_DEMO" ;; '
                    f'*) exec {sys.executable} "$@" ;; esac\n')
    stub.chmod(0o755)
    results = {}
    for matching in ("4/4", "3/4"):
        env = dict(os.environ, GPU_PRIORITY_ALLOW_CPU="1", PATH=f"{stub.parent}{os.pathsep}{os.environ['PATH']}",
                   STUB_DEMO=f"transformers    greedy tokens equal model.generate(do_sample=False) for {matching} "
                             "requests")
        out = tmp_path / matching.replace("/", "-")
        subprocess.run(["bash", str(GPU_PRIORITY), "--from", "7", "--budget", "85", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=120)
        rows = [line.split("|") for line in (out / "summary.md").read_text().splitlines() if line.startswith("| ")]
        results[matching] = next(row[3].strip() for row in rows[2:] if row[2].strip() == "demo-hf-fused")
    assert results == {"4/4": "pass", "3/4": "exit 1"}


DEVICE_STACK = ROOT / "scripts" / "device_stack_check.sh"


def test_device_stack_check_prints_the_gpu_machines_versions_and_refuses_bad_flags(tmp_path: Path) -> None:
    """``--print`` names the H100 machine's stack (torch 2.11, Triton 3.6, transformers 5.17, numpy below 2.4) and
    the four commands, pytest's arguments passed through; it creates nothing. A bad flag exits 2 naming it."""
    venv = tmp_path / "stack venv"
    done = subprocess.run(["bash", str(DEVICE_STACK), "--venv", str(venv), "--print", "--", "tests/hf", "-x"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "stack: torch==2.11.0 triton==3.6.0 transformers==5.17.0 numpy<2.4"
    quoted = str(venv).replace(" ", "\\ ")
    assert lines[1:] == [
        f"python3 -m venv {quoted}",
        f"{quoted}/bin/python -m pip install -q 'torch==2.11.0' 'triton==3.6.0' 'transformers==5.17.0' 'numpy<2.4'",
        f"{quoted}/bin/python -m pip install -q -e '.[dev]' 'torch==2.11.0' 'triton==3.6.0' 'transformers==5.17.0' "
        f"'numpy<2.4'",
        f"PATH={quoted}/bin:$PATH TORCHINDUCTOR_CACHE_DIR={quoted}/inductor python -m pytest tests/hf -x"]
    assert not venv.exists()
    relative = subprocess.run(["bash", str(DEVICE_STACK), "--venv", "rel", "--print"], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path)  # taken from where it was called, absolute on PATH
    assert relative.stdout.splitlines()[1] == f"python3 -m venv {tmp_path}/rel"
    bad = subprocess.run(["bash", str(DEVICE_STACK), "--fast"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown argument '--fast'" in bad.stderr
