"""Runtime test setup: the ``slow`` marker (``torch.compile`` tests; deselect with ``-m "not slow"``)
and the ``kernels`` fixture that runs a kernel-vs-reference test for both implementations."""

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: compiles with torch.compile (5-20 s each on 2 CPU cores)")
    # Eager flex attention on CPU warns once that it materializes the score matrix; these tests
    # use the eager path on purpose (it is the reference-checked fallback).
    config.addinivalue_line("filterwarnings", "ignore:flex_attention called without torch.compile")


@pytest.fixture(params=["triton", "torch"])
def kernels(request) -> str:
    """The runtime kernel implementation under test: Triton (compiled on CUDA, interpreted on CPU) and torch."""
    return request.param
