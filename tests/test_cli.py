"""The ``graphkv`` command: default report, JSON output, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import graphkv
from graphkv.cli import DEFAULT_KV_MEMORY, DEFAULT_PRESET, main
from graphkv.presets import list_presets, preset_model

LLAMA_2_LAYERS = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_hidden_layers": 2, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
}

REQUIRED_TYPES = {
    "block_size": int, "kernel_block_sizes": list, "num_blocks": int, "max_model_len": int, "group_size": int,
    "groups": list, "pool_bytes_per_block": int, "mamba_page_padding_bytes": int, "cudagraph": dict, "ledger": dict,
}


@pytest.fixture
def llama_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_2_LAYERS))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error(code: int, err: str, *needles: str) -> None:
    assert code == 2
    assert err.startswith("graphkv: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err


def test_default_plan_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    """`graphkv plan` with no flags plans the embedded hybrid default and prints the report."""
    code, out, err = run(capsys, "plan")
    assert code == 0, err
    assert "block size" in out and "max_model_len" in out
    assert DEFAULT_PRESET in out
    assert len(out.splitlines()) <= 60


def test_json_has_every_required_key_with_its_type(capsys: pytest.CaptureFixture[str]) -> None:
    """`--json` prints one JSON object holding every required key with the right type."""
    code, out, _ = run(capsys, "plan", "--json")
    assert code == 0
    data = json.loads(out)
    for key, kind in REQUIRED_TYPES.items():
        assert isinstance(data[key], kind), key
    for group in data["groups"]:
        assert isinstance(group["kind"], str) and isinstance(group["layers"], list)
        assert isinstance(group["page_size_bytes"], int) and isinstance(group["pages_per_request"], int)
    cudagraph = data["cudagraph"]
    assert isinstance(cudagraph["support"], str) and isinstance(cudagraph["mode"], str)
    assert all(isinstance(s, int) for s in cudagraph["capture_sizes"]["decode"] + cudagraph["capture_sizes"]["mixed"])
    assert isinstance(data["ledger"]["entries"], list)
    assert data["inputs"]["preset"] == DEFAULT_PRESET


def test_json_equals_compile_on_the_same_inputs(capsys: pytest.CaptureFixture[str]) -> None:
    """The `--json` numbers are exactly those of graphkv.compile on the same model, limits and budget."""
    code, out, _ = run(capsys, "plan", "--preset", DEFAULT_PRESET, "--kv-memory", "28GiB", "--max-num-seqs", "128",
                       "--mamba-cache-mode", "align", "--num-speculative-tokens", "2", "--json")
    assert code == 0
    data = json.loads(out)
    data.pop("inputs")
    data.pop("budget")
    limits = graphkv.Limits(max_num_seqs=128, mamba_cache_mode="align", num_speculative_tokens=2,
                            tensor_parallel_size=1)
    expected = graphkv.compile(preset_model(DEFAULT_PRESET), limits, graphkv.Budget.kv_bytes("28GiB"))
    assert data == json.loads(json.dumps(expected.to_dict()))


def test_default_budget_is_documented(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a budget flag the plan uses the documented default --kv-memory."""
    code, out, _ = run(capsys, "plan", "--json")
    assert code == 0
    assert json.loads(out)["ledger"]["budget_bytes"] == graphkv.Budget.kv_bytes(DEFAULT_KV_MEMORY).kv_cache_bytes


def test_override_too_small_for_max_model_len_exits_2(capsys: pytest.CaptureFixture[str], llama_config: Path) -> None:
    """A 32-page override that cannot hold one 16384-token request is a one-line `max seq len` error."""
    code, out, err = run(capsys, "plan", "--hf-config", str(llama_config), "--num-blocks-override", "32",
                         "--max-model-len", "16384")
    assert_one_error(code, err, "max seq len", "--num-blocks-override=32", "lower --max-model-len to <= 496")
    assert out == ""
    assert len(err.strip().splitlines()) == 1


def test_a_huge_capture_ceiling_is_one_line_naming_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """--max-cudagraph-capture-size 2**31-1 with as large a token budget ran for minutes listing 134 million sizes;
    now it is refused at once in the flags' terms."""
    code, out, err = run(capsys, "plan", "--preset", "llama-3.1-8b", "--max-num-batched-tokens", "2147483647",
                         "--max-cudagraph-capture-size", "2147483647")
    assert_one_error(code, err, "--max-cudagraph-capture-size=2147483647: must be <= 1048576 tokens "
                                "(--max-num-batched-tokens=2147483647)",
                     "lower --max-cudagraph-capture-size to <= 1048576")
    assert out == ""


def test_emit_warns_when_vllm_would_read_another_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--emit vllm for a config file not named config.json serves its directory, whose config.json vLLM would read
    instead: the command's first comment says so (absent, then another file); a checkpoint's config.json gets none."""
    planned = tmp_path / "llama-2-layers.json"
    planned.write_text(json.dumps(LLAMA_2_LAYERS))
    code, out, err = run(capsys, "plan", "--hf-config", str(planned), "--emit", "vllm")
    assert code == 0, err
    warning = (f"# WARNING: the plan is for --hf-config {planned}, but vllm serve of its directory reads "
               f"{tmp_path / 'config.json'}, which does not exist: copy the config into a checkpoint directory as "
               "config.json and serve that directory")
    assert out.splitlines()[1] == warning and f"vllm serve {tmp_path}" in out
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_2_LAYERS))
    code, out, err = run(capsys, "plan", "--hf-config", str(planned), "--emit", "vllm")
    assert code == 0 and out.splitlines()[1] == warning.replace("does not exist", "is another file")
    code, out, err = run(capsys, "plan", "--hf-config", str(tmp_path / "config.json"), "--emit", "vllm")
    assert code == 0 and "WARNING" not in out


def test_unknown_preset_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown --preset is an error naming the flag and the known presets."""
    code, _, err = run(capsys, "plan", "--preset", "llama-9000")
    assert_one_error(code, err, "--preset", "llama-9000", DEFAULT_PRESET)


def test_bad_kv_memory_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unparsable --kv-memory is an error naming the flag and the accepted form."""
    code, _, err = run(capsys, "plan", "--kv-memory", "lots")
    assert_one_error(code, err, "--kv-memory", "GiB")


def test_missing_hf_config_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A --hf-config path that does not exist is an error naming the flag and the path."""
    missing = tmp_path / "nope.json"
    code, _, err = run(capsys, "plan", "--hf-config", str(missing))
    assert_one_error(code, err, "--hf-config", "no such file", str(missing))


def test_malformed_hf_config_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A --hf-config file that is not JSON is an error naming the flag and the position."""
    bad = tmp_path / "config.json"
    bad.write_text('{"num_hidden_layers": 2,')
    code, _, err = run(capsys, "plan", "--hf-config", str(bad))
    assert_one_error(code, err, "--hf-config", "not valid JSON", "line 1")


def test_incomplete_hf_config_lists_every_problem(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A config missing several fields is one error listing each missing config field."""
    partial = tmp_path / "config.json"
    partial.write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    code, _, err = run(capsys, "plan", "--hf-config", str(partial))
    assert_one_error(code, err, "problems:", "config.num_hidden_layers")


def test_budget_flags_need_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    """--weights-memory without --gpu is an error naming the flag, not silently ignored."""
    code, _, err = run(capsys, "plan", "--weights-memory", "16GiB")
    assert_one_error(code, err, "--weights-memory", "--gpu")


def test_argparse_errors_keep_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed --max-model-len is argparse's usage error (exit 2)."""
    with pytest.raises(SystemExit) as excinfo:
        main(["plan", "--max-model-len", "long"])
    assert excinfo.value.code == 2
    assert "--max-model-len" in capsys.readouterr().err


def test_presets_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    """`graphkv presets` prints one row per preset with its architecture."""
    code, out, _ = run(capsys, "presets")
    assert code == 0
    for name in list_presets():
        assert name in out
    assert "Qwen3NextForCausalLM" in out


def test_module_entry_point_prints_json() -> None:
    """`python -m graphkv.cli plan --json` runs in a fresh interpreter and prints the plan JSON."""
    proc = subprocess.run([sys.executable, "-m", "graphkv.cli", "plan", "--json"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["block_size"] > 0


def test_demo_serves_requests_and_says_what_capture_did(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`graphkv demo` prints the plan report, then a run where every request finishes and what capture did
    (on a CPU machine: why CUDA graphs are unavailable; on a GPU: the decode graphs it captured)."""
    import torch

    from graphkv.models.demo import DemoOptions, demo_plan
    from graphkv.plan.graph_keys import capture_keys

    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("checks a CPU machine's run (its 'torch.cuda.is_available() is False' line); with a GPU, the "
                    "[cuda] case of this test checks the demo's captured graphs")
    assert main(["demo", "--requests", "3", "--new-tokens", "2", "--max-num-seqs", "2", "--device", device]) == 0
    out = capsys.readouterr().out
    assert out.startswith("graphkv plan: tiny-hybrid")
    assert "requests        3 finished in" in out
    assert "tokens/s" in out
    if device == "cpu":
        assert "\ndevice          cpu\n" in out
        assert "\ncuda graphs     CUDA graphs unavailable: torch.cuda.is_available() is False" in out
    else:
        plan = demo_plan(DemoOptions(requests=3, new_tokens=2, max_num_seqs=2))
        keys = capture_keys(plan.cudagraph, plan.limits)  # decode steps of 1 and 2 requests
        assert f"\ndevice          {torch.cuda.get_device_name()}\n" in out
        assert f"\ncuda graphs     captured {len(keys)} CUDA graphs in " in out


def test_demo_errors_name_only_flags_the_demo_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """A demo pool too small for its fixed max_model_len (512) is refused naming max_model_len as a field, not
    `--max-model-len` (graphkv demo has no such flag), and --kv-memory, which it has, as a flag."""
    pytest.importorskip("torch")
    code, out, err = run(capsys, "demo", "--requests", "2", "--new-tokens", "2", "--kv-memory", "64KiB")
    assert_one_error(code, err, "graphkv: error: max_model_len=512: max seq len 512 needs 33 pages",
                     "lower max_model_len to <= 96, or raise --kv-memory to >= 272.00 KiB")
    assert "--max-model-len" not in err and out == ""


def test_demo_rejects_a_non_positive_request_count(capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --requests 0` is a one-line usage error naming the flag and the range (exit 2)."""
    with pytest.raises(SystemExit) as excinfo:
        main(["demo", "--requests", "0"])
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("graphkv: error: --requests: '0' must be between 1 and 100000")
    assert len(err.strip().splitlines()) == 1


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`graphkv --version` prints `graphkv <version>` and exits 0."""
    with pytest.raises(SystemExit) as excinfo:
        main(["--version"])
    assert excinfo.value.code == 0
    assert capsys.readouterr().out.strip() == f"graphkv {graphkv.__version__}"


@pytest.mark.parametrize("argv", [["plan"], ["plan", "--json"], ["plan", "--emit", "vllm"]])
def test_closed_pipe_ends_quietly_with_status_0(argv: list[str]) -> None:
    """A reader that closes the pipe before the output is written (`| head -1`) ends the command with 0, silently."""
    proc = subprocess.Popen([sys.executable, "-m", "graphkv.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the interpreter has even started: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert err == ""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux) to fill stdout's device")
@pytest.mark.parametrize("argv", [["plan"], ["models"]])
def test_a_full_device_under_stdout_is_one_error_line(argv: list[str]) -> None:
    """`graphkv plan > /dev/full` ended in an OSError traceback (No space left on device); it is one line naming the
    cause and the fix, exit 2."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "graphkv.cli", *argv], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["graphkv: error: writing the output failed: No space left on device; free "
                                        "space or write elsewhere"]


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_narrow_stdout_encoding_prints_the_report_with_replacements(encoding: str) -> None:
    """With PYTHONIOENCODING=ascii or latin-1, the report's dashes (U+2014) raised UnicodeEncodeError; they print as
    '?' and the command succeeds."""
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    proc = subprocess.run([sys.executable, "-m", "graphkv.cli", "plan"], capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    out = proc.stdout.decode(encoding)
    assert "num_blocks" in out and "\u2014" not in out and " ? " in out


def test_concurrency_report_line(capsys: pytest.CaptureFixture[str]) -> None:
    """`--concurrency 64` plans 11,968 tokens and the report splits the 25 pages by kind and notes max_num_seqs."""
    code, out, _ = run(capsys, "plan", "--concurrency", "64")
    assert code == 0
    assert ("  max_model_len   11968 — auto: the largest length at which concurrency=64 requests of 25 pages each "
            "fit 1605 usable pages") in out
    assert ("  concurrency     64 request(s) of max_model_len at once (25 pages each: 3 mamba + 22 full_attention; "
            "concurrency=64 asked)") in out
    assert "max_num_seqs=256 exceeds the 64 request(s) of max_model_len=11968" in out


def test_gpu_budget_subtracts_the_preset_weights(capsys: pytest.CaptureFixture[str]) -> None:
    """--gpu subtracts the preset checkpoint's weights / tp and the auto graph reserve; --json has the breakdown."""
    code, out, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "32768", "--json")
    assert code == 0
    budget = json.loads(out)["budget"]
    usable = int(81559 * (1 << 20) * 0.9)
    assert budget["source"] == "gpu" and budget["gpu"] == "H100" and budget["utilization"] == 0.9
    assert budget["total_bytes"] == 81559 * (1 << 20)
    assert budget["weights_bytes"] == 16060522496 and budget["activation_bytes"] == 0
    assert budget["graph_reserve_bytes"] > 0
    assert budget["kv_bytes"] == usable - 16060522496 - budget["graph_reserve_bytes"]
    # 13 while mixed steps were captured up to 8192 tokens (1.18 GiB of graphs); up to vLLM's 512, 164.59 MiB reserved
    assert json.loads(out)["max_concurrency"] == 14
    code, out, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--gpu", "H100", "--tp", "2",
                       "--activation-memory", "2GiB", "--graph-reserve", "1GiB")
    assert code == 0
    assert "- weights 7.48 GiB (preset: the meta-llama/Llama-3.1-8B checkpoint, 16060522496 B / tp 2)" in out
    assert "- activations 2.00 GiB (--activation-memory)" in out
    assert "- graph reserve 1.00 GiB (--graph-reserve)" in out
    code, out, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--gpu", "H100")
    lines = out.splitlines()  # the breakdown is lines of its own, not one line with escaped newlines
    at = next(i for i, line in enumerate(lines) if line.startswith("  budget          H100 79.65 GiB"))
    assert lines[at + 1].strip().startswith("- weights 14.96 GiB") and "\\n" not in lines[at]
    assert ("- graph reserve 164.59 MiB (auto: the plan's static buffers + allocator rounding + cuBLAS workspaces + "
            "estimated graph pool; graph pool from the shipped calibration of llama-3.1-8b on NVIDIA H100 80GB HBM3 "
            "(sm_90; graphkv 0.1.0, torch 2.11.0+cu130, CUDA 13.0);") in out


def test_weights_from_a_checkpoint_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--hf-config DIR reads config.json and model.safetensors.index.json's total_size, divided per rank."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_2_LAYERS))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 10 << 30},
                                                                      "weight_map": {}}))
    code, out, err = run(capsys, "plan", "--hf-config", str(tmp_path), "--gpu", "H100", "--tp", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["budget"]["weights_bytes"] == 5 << 30
    assert data["budget"]["sources"]["weights"] == (
        f"model.safetensors.index.json metadata.total_size, {10 << 30} B / tp 2")
    assert data["inputs"]["hf_config"] == str(tmp_path)


def test_unknown_weights_are_said_to_be_unknown(capsys: pytest.CaptureFixture[str], llama_config: Path) -> None:
    """A bare config.json with --gpu plans with 0 B of weights and says they are unknown."""
    code, out, _ = run(capsys, "plan", "--hf-config", str(llama_config), "--gpu", "H100")
    assert code == 0
    assert "- weights 0 B (unknown — 0 B assumed: no safetensors metadata for this model; give --weights-memory SIZE)" in out


def test_kv_memory_budget_json(capsys: pytest.CaptureFixture[str]) -> None:
    """With --kv-memory the budget object says so and carries only the KV bytes."""
    code, out, _ = run(capsys, "plan", "--kv-memory", "24GiB", "--json")
    assert code == 0
    assert json.loads(out)["budget"] == {"source": "kv_memory", "gpu": None, "total_bytes": None, "utilization": None,
                                         "weights_bytes": None, "activation_bytes": None, "graph_reserve_bytes": None,
                                         "kv_bytes": 24 << 30, "sources": None}


def test_json_lists_every_layer_and_spec_objects(capsys: pytest.CaptureFixture[str]) -> None:
    """--json has a layers list (index, name, kind, group, kv_source) and each group's spec as an object."""
    code, out, _ = run(capsys, "plan", "--preset", "nemotron-h-8b", "--max-num-seqs", "128", "--max-model-len",
                       "8192", "--json")
    assert code == 0
    data = json.loads(out)
    assert [(x["index"], x["kind"], x["group"] is None) for x in data["layers"][:3]] == [
        (0, "mamba", False), (1, "none", True), (2, "mamba", False)]
    assert set(data["layers"][0]) == {"index", "name", "kind", "group", "kv_source"}
    state = data["groups"][0]
    assert state["spec"]["state_shapes"] == [[3, 10240], [128, 64, 128]]
    assert state["spec"]["state_dtypes"] == ["bfloat16", "float32"]
    assert state["spec_text"] == "mamba2 state (3, 10240):bfloat16 + (128, 64, 128):float32"


def test_max_concurrent_batches_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """--max-concurrent-batches 1 plans gpt-oss-20b's sliding layers at 137 pages instead of 265 (2048 tokens/step)."""
    pages = []
    for batches in ("2", "1"):
        code, out, _ = run(capsys, "plan", "--preset", "gpt-oss-20b", "--max-num-batched-tokens", "2048",
                           "--max-model-len", "32768", "--max-concurrent-batches", batches, "--json")
        assert code == 0
        data = json.loads(out)
        pages.append(data["groups"][0]["pages_per_request"])
        assert data["inputs"]["limits"]["max_concurrent_batches"] == int(batches)
    assert pages == [265, 137]


def test_models_lists_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    """`graphkv models` prints one row per family: its model_type, layer kinds and reference checkpoint."""
    from graphkv.spec.hf.families import FAMILIES

    code, out, _ = run(capsys, "models")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["family", "layer", "kinds", "reference", "checkpoint"]
    assert len(lines) == 1 + len(FAMILIES) >= 71
    assert any(line.split()[:3] == ["nemotron_h", "full_attention,", "mamba2,"] for line in lines)


def test_readme_family_table_is_generated_from_graphkv_models(capsys: pytest.CaptureFixture[str]) -> None:
    """README's family table is exactly `graphkv models --markdown`."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    code, out, _ = run(capsys, "models", "--markdown")
    assert code == 0
    assert out.strip() in readme


@pytest.mark.parametrize("extra", [(), ("--tp", "2"), ("--emit", "vllm")])
def test_plan_output_shows_what_the_config_wrote_escaped(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """A name with an escape sequence and a lone surrogate (valid JSON) and an architecture with a bidi override are
    printed escaped by the report, the ranks report and the emitted command: nothing reaches the terminal raw, and
    the surrogate no longer makes print() fail."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_2_LAYERS, "_name_or_path": "evil\x1b]0;title\x07\ud800",
                                "architectures": ["Llama\u202eForCausalLM"]}))
    proc = subprocess.run([sys.executable, "-m", "graphkv.cli", "plan", "--hf-config", str(path), *extra],
                          capture_output=True, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    out = proc.stdout.decode("utf-8")
    assert "evil\\x1b]0;title\\x07\\ud800" in out
    assert not any(ch in out for ch in "\x1b\x07\u202e")
    if not extra:
        assert "Llama\\u202eForCausalLM" in out


def test_without_state_layers_the_mamba_cache_mode_does_not_apply(capsys: pytest.CaptureFixture[str]) -> None:
    """--mamba-cache-mode all on llama reported "mamba_cache_mode=none keeps one state per request", as if the flag
    had been dropped; the line says the mode does not apply to a model without state layers."""
    code, out, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--mamba-cache-mode", "all")
    assert code == 0
    assert "  mamba block     none (no state layers: mamba_cache_mode=all does not apply)\n" in out
    code, out, _ = run(capsys, "plan")  # the hybrid default keeps its line
    assert "  mamba block     none (mamba_cache_mode=none keeps one state per request)\n" in out


def test_a_fixed_page_count_explains_the_unused_graph_reserve(capsys: pytest.CaptureFixture[str]) -> None:
    """--gpu with --num-blocks-override 100 left 56 GiB of the auto reserve unused and blamed allocator segments;
    the note names the override."""
    code, out, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--gpu", "H100", "--num-blocks-override", "100")
    assert code == 0
    assert "left unused: --num-blocks-override fixes the pool at 100 pages" in out
    assert "allocator segments would not fit" not in out


def test_mamba_cache_mode_takes_any_case_as_cudagraph_mode_does(capsys: pytest.CaptureFixture[str]) -> None:
    """--cudagraph-mode none worked but --mamba-cache-mode ALL was refused; both take any case."""
    assert run(capsys, "plan", "--mamba-cache-mode", "ALL")[1] == run(capsys, "plan", "--mamba-cache-mode", "all")[1]
