"""`graphkv plan --arch` / `--gpu`: the backends of the plan are the ones vLLM 0.33 runs on that GPU."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import assert_one_error, run


def _plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = run(capsys, "plan", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_arch_sets_the_backends_with_a_kv_memory_budget(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--preset", "deepseek-v3", "--arch", "sm_89", "--kv-memory", "20GiB")
    assert code == 0
    assert "triton_mla (first attention backend) prefers 16" in out
    assert "backends as vLLM 0.33 picks them on sm_89" in out and "assumed" not in out.split("sm_89", 1)[1][:20]
    hopper = _plan_json(capsys, "--preset", "deepseek-v3", "--kv-memory", "20GiB", "--kv-cache-dtype", "fp8")
    ada = _plan_json(capsys, "--preset", "deepseek-v3", "--kv-memory", "20GiB", "--kv-cache-dtype", "fp8",
                     "--arch", "sm_89")
    assert (hopper["block_size"], hopper["num_blocks"]) == (64, 9549)  # FlashMLA
    assert (ada["block_size"], ada["num_blocks"]) == (16, 38199)  # Triton MLA


def test_gpu_names_the_architecture(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--gpu", "A100-80GB")
    assert code == 0
    assert "support         UNIFORM_BATCH (limited by group 0 (flash_attn))" in out  # FlashAttention 2
    code, out, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--gpu", "H100")
    assert code == 0 and "support         ALWAYS" in out


def test_arch_contradicting_gpu_is_one_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "--preset", "llama-3.1-8b", "--gpu", "A100-80GB", "--arch", "sm_90")
    assert_one_error(code, err, "--arch='sm_90'", "contradicts --gpu A100-80GB, an sm_80 GPU", "drop --arch")
    code, _, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--gpu", "A100-80GB", "--arch", "sm_80")
    assert code == 0


def test_bad_arch_and_unknown_gpu_are_one_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        run(capsys, "plan", "--arch", "sm_100")
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("graphkv: error: --arch: invalid choice: 'sm_100' (choose from 'sm_80', "
                                       "'sm_89', 'sm_90'); e.g. --arch sm_80; see `graphkv plan --help`\n")
    code, _, err = run(capsys, "plan", "--gpu", "B200")
    assert_one_error(code, err, "--gpu='B200'", "is not a known GPU", "--arch")


def test_fp8_mla_on_an_a100_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "--preset", "deepseek-v3", "--arch", "sm_80", "--kv-cache-dtype", "fp8")
    assert_one_error(code, err, "--kv-cache-dtype=", "Triton MLA", "--kv-cache-dtype='bfloat16'")


def test_a_refusal_for_the_architecture_names_the_flag_typed(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    config = tmp_path / "config.json"
    from tests.preset_configs import preset_config

    config.write_text(json.dumps(preset_config("deepseek-v3", num_hidden_layers=4, index_head_dim=128,
                                               layer_types=["indexed_attention"] * 4)))
    code, _, err = run(capsys, "plan", "--hf-config", str(config), "--arch", "sm_89")
    assert_one_error(code, err, "--arch='sm_89'", "and the plan is for sm_89")
    code, _, err = run(capsys, "plan", "--hf-config", str(config), "--gpu", "L40S")
    assert_one_error(code, err, "--gpu='L40S'", "and the plan is for L40S (sm_89)")


def test_a_bad_tp_beside_an_architecture_refusal_still_lists_the_sizes_that_split(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "--preset", "deepseek-v3", "--tp", "3", "--arch", "sm_80",
                       "--kv-cache-dtype", "fp8")
    assert_one_error(code, err, "--tp=3", "use --tp 1, 2, 4, 8, 16, 32 or 64")


def test_the_json_inputs_record_the_architecture(capsys: pytest.CaptureFixture[str]) -> None:
    assert _plan_json(capsys, "--preset", "llama-3.1-8b", "--arch", "sm_80")["inputs"]["arch"] == "sm_80"
    assert _plan_json(capsys, "--preset", "llama-3.1-8b")["inputs"]["arch"] is None
