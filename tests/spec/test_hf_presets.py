"""graphkv.presets: bundled public configs load, and give the expected layers per kind."""

from __future__ import annotations

from collections import Counter

import pytest

from graphkv.errors import SpecError
from graphkv.presets import list_presets, load_preset_config, preset_model
from graphkv.spec import LayerKind

_EXPECTED_KINDS = {
    "llama-3.1-8b": {LayerKind.FULL_ATTENTION: 32},
    "qwen3-next-80b-a3b": {LayerKind.FULL_ATTENTION: 12, LayerKind.MAMBA: 36},  # 48 layers, every 4th full
    "nemotron-h-8b": {LayerKind.FULL_ATTENTION: 4, LayerKind.MAMBA: 24},  # 52 letters, 24 '-' MLPs skipped
    "jamba-mini-1.5": {LayerKind.FULL_ATTENTION: 4, LayerKind.MAMBA: 28},  # 32 layers, period 8
    "gpt-oss-20b": {LayerKind.SLIDING_WINDOW: 12, LayerKind.FULL_ATTENTION: 12},
    "gpt-oss-120b": {LayerKind.SLIDING_WINDOW: 18, LayerKind.FULL_ATTENTION: 18},
    "deepseek-v3": {LayerKind.MLA: 61},
}


def test_list_presets_is_sorted_and_complete():
    """list_presets() returns every bundled preset name, sorted."""
    assert list_presets() == tuple(sorted(_EXPECTED_KINDS))


@pytest.mark.parametrize("name", sorted(_EXPECTED_KINDS))
def test_preset_loads_with_expected_layers_per_kind(name):
    """Each preset builds a model named after it with the expected count of each layer kind."""
    model = preset_model(name)
    assert Counter(layer.spec.kind for layer in model.layers) == _EXPECTED_KINDS[name]
    assert model.name == name


@pytest.mark.parametrize("name", sorted(_EXPECTED_KINDS))
def test_preset_names_its_hugging_face_source(name):
    """Each preset config records the Hugging Face repository it was taken from."""
    assert "/" in load_preset_config(name)["_source"]


def test_load_preset_config_returns_a_fresh_dict():
    """Mutating a loaded config does not change the next load."""
    load_preset_config("llama-3.1-8b")["num_hidden_layers"] = 1
    assert load_preset_config("llama-3.1-8b")["num_hidden_layers"] == 32


def test_preset_model_passes_tp_and_overrides():
    """preset_model forwards tp and the model_from_hf_config overrides."""
    model = preset_model("llama-3.1-8b", tp=4, kv_cache_dtype="fp8", name="llama-tp4")
    assert (model.tensor_parallel_size, model.name, model.layers[0].spec.num_kv_heads) == (4, "llama-tp4", 2)
    assert model.layers[0].spec.dtype.value == "float8_e4m3fn"


def test_unknown_preset_lists_the_known_names():
    """An unknown preset name raises SpecError listing the known presets."""
    with pytest.raises(SpecError, match=r"preset='llama-9'.*'deepseek-v3'.*'qwen3-next-80b-a3b'"):
        load_preset_config("llama-9")
