"""The examples in the planning and spec docstrings run and print what they claim."""

import doctest
import importlib

import pytest

MODULES = ["graphkv.plan.compile", "graphkv.plan.plan", "graphkv.plan.ledger_entries", "graphkv.plan.kernel_blocks", "graphkv.spec.layers", "graphkv.spec.backends",
           "graphkv.plan.allocations.rounding", "graphkv.plan.allocations.blas_workspaces",
           "graphkv.spec.split_rules", "graphkv.spec.stages", "graphkv.spec.sharding", "graphkv.spec.layers.state_split",
           "graphkv.spec.model", "graphkv.distributed.simulate", "graphkv.emit.vllm"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    """Every docstring example of the module passes."""
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0
    assert result.failed == 0
