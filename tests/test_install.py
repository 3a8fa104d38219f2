"""Installing only what the job needs: `pip install .` (no extras) plans without torch, Triton or numpy."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output as text."""
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)


@pytest.mark.slow
def test_fresh_venv_without_extras_plans_without_torch(tmp_path: Path) -> None:
    """A fresh virtual environment with `pip install .` has no torch, plans, and names the extra for the runtime."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("graphkv", "kernels"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    python = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)], env=env,
                  timeout=540)
    assert install.returncode == 0, install.stderr[-3000:]
    installed = run([python, "-m", "pip", "list", "--format=freeze"], env=env, timeout=60).stdout.lower()
    for heavy in ("torch==", "triton==", "numpy==", "nvidia-ml-py==", "transformers=="):
        assert heavy not in installed, installed
    plan = run([str(env_dir / "bin" / "graphkv"), "plan", "--concurrency", "64"], env=env, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "max_model_len   11968" in plan.stdout
    runtime = run([python, "-c", "import graphkv.runtime"], env=env, timeout=60)
    assert runtime.returncode == 1
    assert "MissingExtraError: graphkv.runtime='torch': needs the Python package 'torch'" in runtime.stderr
    assert "pip install 'graphkv[runtime]'" in runtime.stderr
    demo = run([str(env_dir / "bin" / "graphkv"), "demo"], env=env, timeout=60)
    assert demo.returncode == 2 and demo.stderr.startswith("graphkv: error: graphkv demo='torch'")
