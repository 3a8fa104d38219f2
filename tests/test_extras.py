"""A part that needs an optional dependency says which extra installs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from graphkv.errors import GraphkvError, MissingExtraError
from graphkv.extras import require


def test_missing_module_names_the_extra() -> None:
    """require() raises MissingExtraError — a GraphkvError and an ImportError — naming module and extra."""
    with pytest.raises(MissingExtraError) as info:
        require("runtime", "graphkv_no_such_module", needed_by="graphkv.runtime")
    assert isinstance(info.value, GraphkvError) and isinstance(info.value, ImportError)
    assert str(info.value).startswith("graphkv.runtime='graphkv_no_such_module': needs the Python package")
    assert "pip install 'graphkv[runtime]'" in str(info.value)


def test_present_module_passes() -> None:
    """require() returns quietly when the module is installed (attrs always is)."""
    require("runtime", "attrs", needed_by="graphkv.runtime")


def test_runtime_import_without_torch_names_the_extra() -> None:
    """With torch hidden, `import graphkv.runtime` fails with the extra to install, not a bare ModuleNotFoundError."""
    code = "import sys; sys.modules['torch'] = None\nimport graphkv.runtime"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "graphkv.errors.MissingExtraError: graphkv.runtime='torch': needs the Python package 'torch', which is not "
        "installed (it comes with the 'runtime' extra: torch, triton, numpy, nvidia-ml-py); pip install "
        "'graphkv[runtime]' (planning alone — graphkv plan, graphkv.compile — needs no extra)")
