"""Architecture fields of public Hugging Face configs, by short name, for planning without a download.

Each ``<name>.json`` holds the fields :func:`graphkv.spec.hf_config.model_from_hf_config` reads,
with their values from the public ``config.json`` of the repository its ``_source`` key names.

Example::

    >>> list_presets()[:2]
    ('deepseek-v3', 'gpt-oss-120b')
    >>> preset_model("qwen3-next-80b-a3b", tp=2).is_hybrid
    True
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from graphkv.errors import Problem, SpecError
from graphkv.spec.hf_config import model_from_hf_config
from graphkv.spec.model import ModelKV

__all__ = ["list_presets", "load_preset_config", "preset_model"]

_SUFFIX = ".json"


def list_presets() -> tuple[str, ...]:
    """The preset names, sorted."""
    files = resources.files(__name__).iterdir()
    return tuple(sorted(f.name[: -len(_SUFFIX)] for f in files if f.name.endswith(_SUFFIX)))


def load_preset_config(name: str) -> dict[str, Any]:
    """A fresh dict of the preset's config fields; an unknown ``name`` raises SpecError listing the known ones."""
    known = list_presets()
    if not isinstance(name, str) or name not in known:
        raise SpecError(Problem(field="preset", value=name, limit=f"must be one of {list(known)}",
                                fix="pick a listed preset, or pass a config.json dict to ModelKV.from_hf_config"))
    text = resources.files(__name__).joinpath(name + _SUFFIX).read_text(encoding="utf-8")
    config: dict[str, Any] = json.loads(text)
    return config


def preset_model(name: str, /, *, tp: int = 1, **overrides: Any) -> ModelKV:
    """The per-rank :class:`ModelKV` of preset ``name`` (named after the preset unless ``name=`` is
    overridden); ``overrides`` are those of :func:`~graphkv.spec.hf_config.model_from_hf_config`."""
    overrides.setdefault("name", name)
    return model_from_hf_config(load_preset_config(name), tp=tp, **overrides)
