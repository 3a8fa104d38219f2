"""compile_consensus on an nccl world of 2 GPUs (the reports travel on a gloo group created beside it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="compile_consensus runs over torch.distributed (the runtime extra)")

from gloo_workers import launch, nccl_ranks  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2 or not torch.distributed.is_nccl_available(),
                                reason="needs 2 CUDA GPUs and torch.distributed's nccl backend (CPU runs check the "
                                       "same path on a cpu:gloo group)")


def test_two_gpus_agree_over_nccl(tmp_path):
    """Two nccl ranks of Llama-3.1-8B tp 2 with 8 and 6 GiB both return the plan of 6144 pages."""
    seen = launch(nccl_ranks, 2, tmp_path)
    assert seen[0]["agree"]["plan"] == seen[1]["agree"]["plan"]
    assert seen[0]["agree"]["plan"]["num_blocks"] == 6144
