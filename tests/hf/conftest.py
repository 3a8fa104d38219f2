"""graphkv.hf tests: tiny random-weight transformers models (no download), CPU unless marked GPU."""

import pytest

pytest.importorskip("transformers", reason="graphkv.hf needs the hf extra (transformers)")


def pytest_configure(config):
    # Eager flex attention on a CPU warns that it materializes the score matrix (the tests use it on
    # purpose); transformers warns that its kernels fall back to torch and about generate's defaults.
    config.addinivalue_line("filterwarnings", "ignore:flex_attention called without torch.compile")
    config.addinivalue_line("filterwarnings", "ignore::UserWarning:transformers")
