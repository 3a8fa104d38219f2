"""`graphkv demo` and `graphkv demo --hf` on the GPU path: Triton kernels, staged tables, rehearsed capture."""

from __future__ import annotations

import io

import pytest

from graphkv.models.demo import DemoOptions, run_demo


def test_demo_on_the_gpu_path_rehearses_its_keys_and_serves_every_request() -> None:
    """kernels='triton' on a CPU: the capture is rehearsed (every decode key) and every request finishes."""
    options = DemoOptions(requests=4, new_tokens=3, kernels="triton", device="cpu")
    result = run_demo(options, out=io.StringIO(), progress=False)
    assert result.graphs.startswith("rehearsed 4 graph keys")
    assert result.requests == 4 and result.generated == 12


@pytest.mark.slow
def test_hf_demo_on_the_gpu_path_equals_generate() -> None:
    """`demo --hf qwen3_next --kernels triton`: the GPU's query tile, interpreted kernels, generate's tokens."""
    pytest.importorskip("transformers", reason="graphkv demo --hf needs the hf extra")
    from graphkv.hf.demo import run_hf_demo

    options = DemoOptions(requests=4, new_tokens=3, kernels="triton", device="cpu")
    result = run_hf_demo("qwen3_next", options, out=io.StringIO(), progress=False)
    assert result.run.graphs.startswith("rehearsed") and result.matching == result.checked == 4
    assert result.run.device == "cpu"
