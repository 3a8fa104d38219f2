"""The model types the installed transformers knows: a test of a type it lacks skips and says so.

Decided per model type when the test runs (``AutoConfig.for_model`` knows a type exactly when
``CONFIG_MAPPING`` holds it), never by comparing version numbers: transformers adds families in
every release, and a GPU machine may run an older one than the machine the rows were written on.
Serving a model (``graphkv.hf``) needs more than its config class: :func:`below_the_hf_floor` says
when the installed transformers is older than the ``hf`` extra's floor in pyproject.toml.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def known_model_type(model_type: str) -> bool:
    """Whether the installed transformers has a config class for ``model_type``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def skip_unless_known(model_type: str) -> None:
    """Skip the calling test when the installed transformers does not know ``model_type``; the reason
    names the type and the installed version."""
    if not known_model_type(model_type):
        import transformers

        pytest.skip(f"transformers {transformers.__version__} has no config class for model_type {model_type!r} "
                    "(AutoConfig.for_model raises): this test reads that family's reference config")


def reference_config(model_type: str, **overrides: Any) -> Any:
    """``transformers.AutoConfig.for_model(model_type, **overrides)``: the family's reference config
    (no download), or a skip when the installed transformers does not know ``model_type``."""
    skip_unless_known(model_type)
    import transformers

    return transformers.AutoConfig.for_model(model_type, **overrides)


def below_the_hf_floor() -> str | None:
    """Why graphkv.hf cannot be tested here — the installed transformers (e.g. a GPU machine's own, under a
    ``--no-deps`` install) is older than the ``hf`` extra's ``transformers>=`` in pyproject.toml — or None."""
    import transformers
    from packaging.version import Version

    found = re.search(r'"transformers>=([^",;\s]+)"', PYPROJECT.read_text(encoding="utf-8"))
    if found is None or Version(transformers.__version__) >= Version(found.group(1)):
        return None
    return (f"transformers {transformers.__version__} is older than the hf extra's transformers>={found.group(1)} "
            "(pyproject.toml says why); graphkv.hf needs a newer one")
