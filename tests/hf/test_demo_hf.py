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
