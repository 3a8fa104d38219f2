"""A preset's config.json with changes, and the helpers the model_from_hf_config tests share."""

from __future__ import annotations

from typing import Any

from graphkv.presets import load_preset_config
from graphkv.spec import MambaSpec, ModelKV

JUNK = [None, "x", -1, 0, 1.5, True, [], {}, [1], 3]
"""Values of every wrong type and range a config field may hold."""


def preset_config(preset: str, **changes: Any) -> dict[str, Any]:
    """A preset's config with ``changes`` applied (``None`` deletes the key)."""
    config = load_preset_config(preset)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


def state_of(model: ModelKV) -> MambaSpec:
    """The first recurrent-state spec of ``model``."""
    spec = next(layer.spec for layer in model.layers if layer.spec.is_ssm)
    assert isinstance(spec, MambaSpec)
    return spec
