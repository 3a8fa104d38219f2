"""`graphkv demo --hf MODEL_TYPE`: a tiny transformers model served end to end, checked against generate."""

import pytest

from graphkv.cli import main


def test_demo_serves_a_tiny_transformers_model(capsys: pytest.CaptureFixture[str]) -> None:
    """The plan report, then the run: requests finished, tokens/s, pages reused, every request equal to generate."""
    assert main(["demo", "--hf", "nemotron_h", "--requests", "4", "--new-tokens", "3", "--max-num-seqs", "2",
                 "--max-num-batched-tokens", "32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("graphkv plan: nemotron_h")
    assert "requests        4 finished in" in out and "tokens/s" in out and "pages reused" in out
    assert out.rstrip().endswith("greedy tokens equal model.generate(do_sample=False) for 4/4 requests")


def test_demo_refuses_a_family_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --hf bloom` is one line naming the flag and the families (exit 2)."""
    assert main(["demo", "--hf", "bloom"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphkv: error: --hf='bloom': must be one of llama, qwen3, mistral")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_demo_serves_with_fused_pieces_and_captures_mixed_steps(capsys: pytest.CaptureFixture[str]) -> None:
    """`--compile fused` on the GPU path (here interpreted): the plan asks for FULL_AND_PIECEWISE, its decode and mixed
    keys are rehearsed, and every request equals generate."""
    assert main(["demo", "--hf", "qwen3", "--compile", "fused", "--kernels", "triton", "--requests", "3",
                 "--new-tokens", "3", "--max-num-seqs", "2", "--max-num-batched-tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "FULL_AND_PIECEWISE" in out
    assert "rehearsed 5 graph keys" in out  # decode 1, 2 and mixed 1, 2, 4 (vLLM's 2 x max_num_seqs)
    assert out.rstrip().endswith("greedy tokens equal model.generate(do_sample=False) for 3/3 requests")


def test_demo_compile_needs_hf(capsys: pytest.CaptureFixture[str]) -> None:
    """`--compile` without `--hf` is one line naming the flag and the fix (exit 2); so is an unknown mode."""
    assert main(["demo", "--compile", "fused"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("graphkv: error: --compile='fused': applies to graphkv.hf models (--hf) only; add --hf "
                           "MODEL_TYPE, or drop --compile (the tiny hybrid demo compiles its own attention)")
    with pytest.raises(SystemExit) as refused:
        main(["demo", "--hf", "qwen3", "--compile", "inductor"])
    assert refused.value.code == 2 and "--compile" in capsys.readouterr().err


def test_demo_trace_layers_needs_hf_and_a_split_forward(capsys: pytest.CaptureFixture[str]) -> None:
    """`--trace-layers` without `--hf`, or under `--compile auto` on a CPU (nothing split), is one line naming the
    flag, what it needs and the fix (exit 2)."""
    assert main(["demo", "--trace-layers"]) == 2
    assert capsys.readouterr().err.strip() == (
        "graphkv: error: --trace-layers=True: applies to graphkv.hf models (--hf) only; add --hf MODEL_TYPE, or drop "
        "--trace-layers (the tiny hybrid demo compiles its own attention)")
    assert main(["demo", "--hf", "qwen3", "--trace-layers", "--device", "cpu"]) == 2
    assert capsys.readouterr().err.strip() == (
        "graphkv: error: --trace-layers=True: needs --compile piecewise or fused, not --compile auto; add --compile "
        "fused (or drop --trace-layers)")


def test_demo_serves_with_one_traced_layer(capsys: pytest.CaptureFixture[str]) -> None:
    """`--compile piecewise --trace-layers`: the decoder layer traced once for all, every request equal to generate."""
    assert main(["demo", "--hf", "qwen3", "--compile", "piecewise", "--trace-layers", "--requests", "3",
                 "--new-tokens", "3", "--max-num-seqs", "2", "--max-num-batched-tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("greedy tokens equal model.generate(do_sample=False) for 3/3 requests")
