"""graphkv.hf tests: tiny random-weight transformers models (no download), CPU unless marked GPU.

A transformers older than the ``hf`` extra's floor (installed with ``--no-deps`` over a machine's
own packages) skips every test here, naming the installed version and the floor.
"""

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="graphkv.hf needs the hf extra (transformers)")

from transformers_types import below_the_hf_floor  # noqa: E402 - after the importorskip above


def pytest_configure(config):
    # Eager flex attention on a CPU warns that it materializes the score matrix (the tests use it on
    # purpose); transformers warns that its kernels fall back to torch and about generate's defaults.
    config.addinivalue_line("filterwarnings", "ignore:flex_attention called without torch.compile")
    config.addinivalue_line("filterwarnings", "ignore::UserWarning:transformers")


def pytest_collection_modifyitems(config, items):
    """Skip every test of this directory when the installed transformers is older than the hf extra's floor."""
    reason = below_the_hf_floor()
    if reason is None:
        return
    here = Path(__file__).resolve().parent
    for item in items:
        if here in item.path.resolve().parents:
            item.add_marker(pytest.mark.skip(reason=reason))
