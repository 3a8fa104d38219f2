"""The wheel ships every package: pyproject's explicit package list names each folder with an __init__.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is in the standard library from Python 3.11")
def test_every_package_folder_is_listed_in_pyproject() -> None:
    """A subpackage missing from [tool.setuptools].packages would install editable but break `pip install .`."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "graphkv").rglob("__init__.py")}
    found |= {"graphkv.kernels"} if (ROOT / "kernels" / "__init__.py").exists() else set()
    assert setuptools["package-dir"] == {"graphkv.kernels": "kernels"}
    assert found - listed == set(), "add these to [tool.setuptools].packages"
    assert listed - found == set(), "these listed packages have no folder"
