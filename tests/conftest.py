"""Test-session setup: the ``device`` fixture that runs a test on every device present.

The Triton kernels need no environment variable: each launch runs compiled on CUDA tensors and in
Triton's interpreter on CPU tensors (:mod:`graphkv.kernels.launch`).
"""

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# CUDA params exist only where there is a GPU: no skipped "cuda" copies on a CPU machine.
DEVICES = ("cpu", "cuda") if _has_cuda() else ("cpu",)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """A device present here: "cpu" always (Triton in its interpreter), "cuda" when there is a GPU."""
    return request.param
