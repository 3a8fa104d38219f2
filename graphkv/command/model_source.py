"""The model a ``graphkv plan`` command names: a bundled preset, or a config.json / checkpoint directory.

Besides the per-rank :class:`~graphkv.spec.model.ModelKV`, it knows what an engine would load
(the preset's Hugging Face repository, or the directory) and the checkpoint's weight bytes: the
preset's recorded number, or the directory's safetensors metadata.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import attrs

from graphkv.command.flag_errors import tp_split_problems
from graphkv.errors import Problem, SpecError
from graphkv.inputs import CheckpointWeights, checkpoint_weights, read_json_file
from graphkv.presets import list_presets, load_preset_config, preset_model
from graphkv.presets.weights import preset_weight_bytes
from graphkv.printable import printable
from graphkv.spec.model import ModelKV
from graphkv.spec.split_rules import MAX_TP_TRIED

__all__ = ["CONFIG_NAME", "ModelSource", "load_model_source", "tp_sizes_that_split"]

CONFIG_NAME = "config.json"


@attrs.frozen(kw_only=True)
class ModelSource:
    """The planned model and where it came from."""

    model: ModelKV  # tensor-parallel rank 0 of --tp (the reader checked that --tp splits every head)
    description: dict[str, Any]  # {"preset": name} or {"hf_config": path}, for the JSON inputs
    serve_name: str  # what `vllm serve` loads: a Hugging Face repository id or a local directory
    weights: CheckpointWeights | None  # the whole checkpoint's bytes, when known (and asked for)
    whole: ModelKV  # every head, unsharded: what ModelKV.shard splits for each rank
    config: Mapping[str, Any]  # the config.json the model was read from
    overrides: Mapping[str, Any]  # the dtype / backend overrides it was read with
    serve_note: str | None = None  # why serve_name may not load this config (an --hf-config not named config.json)

    def tp_sizes(self, up_to: int = MAX_TP_TRIED) -> tuple[int, ...]:
        """The tensor-parallel sizes in ``1 .. up_to`` that split every head count of the model."""
        return _split_sizes(self.config, self.overrides, up_to)


def _config_path(path: str) -> tuple[str, str | None]:
    """``(config file, checkpoint directory or None)`` for an --hf-config file or directory."""
    if os.path.isdir(path):
        return os.path.join(path, CONFIG_NAME), path
    directory = os.path.dirname(os.path.abspath(path))
    # Only a file named config.json sits in a checkpoint; elsewhere, neighbours are not its weights.
    return path, (directory if os.path.basename(path) == CONFIG_NAME else None)


def _read_config(path: str) -> dict[str, Any]:
    config = read_json_file(_config_path(path)[0], field="--hf-config", what="a Hugging Face config.json")
    if not isinstance(config, dict):
        raise SpecError(Problem(field="--hf-config", value=path, limit=f"holds a JSON {type(config).__name__}, not an object",
                                fix="pass a config.json whose top level is an object"))
    return config


def _from_hf_config(path: str, tp: int, overrides: dict[str, Any], read_weights: bool) -> ModelSource:
    config_file, directory = _config_path(path)
    config = _read_config(path)
    model = ModelKV.from_hf_config(config, tp=tp, **overrides)
    whole = model if tp == 1 else ModelKV.from_hf_config(config, **overrides)
    weights = checkpoint_weights(directory, field="--hf-config") if directory is not None and read_weights else None
    serve = directory if directory is not None else os.path.dirname(os.path.abspath(config_file))
    note = None
    if directory is None:  # a config file of another name: the engine reads the directory's config.json
        there = os.path.join(serve, CONFIG_NAME)
        holds = "is another file" if os.path.lexists(there) else "does not exist"
        note = (f"WARNING: the plan is for --hf-config {printable(path)}, but vllm serve of its directory reads "
                f"{printable(there)}, which {holds}: copy the config into a checkpoint directory as {CONFIG_NAME} and "
                "serve that directory")
    return ModelSource(model=model, description={"hf_config": path}, serve_name=serve, weights=weights, whole=whole,
                       config=config, overrides=overrides, serve_note=note)


def _from_preset(name: str, tp: int, overrides: dict[str, Any]) -> ModelSource:
    if name not in list_presets():
        raise SpecError(Problem(field="--preset", value=name, limit=f"is not a bundled preset; known: {', '.join(list_presets())}",
                                fix="pick one of those (`graphkv presets` lists them) or pass --hf-config PATH"))
    repo = str(load_preset_config(name).get("_source", name))
    total = preset_weight_bytes(name)
    weights = None if total is None else CheckpointWeights(total_bytes=total, source=f"preset: the {repo} checkpoint")
    model = preset_model(name, tp=tp, **overrides)
    whole = model if tp == 1 else preset_model(name, **overrides)
    return ModelSource(model=model, description={"preset": name}, serve_name=repo, weights=weights, whole=whole,
                       config=load_preset_config(name), overrides=overrides)


def load_model_source(*, preset: str | None, hf_config: str | None, default_preset: str, tp: int,
                      overrides: dict[str, Any], read_weights: bool = True) -> ModelSource:
    """The model of ``--hf-config`` (a file or a checkpoint directory) or ``--preset`` (default
    ``default_preset``), split for ``tp`` ranks, with the dtype / backend ``overrides``. With
    ``read_weights=False`` a checkpoint directory's safetensors are not read (nothing needs their bytes:
    no ``--gpu``, or ``--weights-memory`` gives them), so metadata no plan uses cannot refuse the plan."""
    if hf_config is not None:
        return _from_hf_config(hf_config, tp, overrides, read_weights)
    return _from_preset(preset or default_preset, tp, overrides)


def tp_sizes_that_split(*, preset: str | None, hf_config: str | None, default_preset: str,
                        overrides: dict[str, Any], up_to: int = MAX_TP_TRIED) -> tuple[int, ...]:
    """The tensor-parallel sizes in ``1 .. up_to`` for which the model of ``--hf-config`` / ``--preset``
    reads, i.e. every head count it splits (read once, then built per size: ~2 ms each)."""
    config = _read_config(hf_config) if hf_config is not None else load_preset_config(preset or default_preset)
    return _split_sizes(config, overrides, up_to)


def _split_sizes(config: Mapping[str, Any], overrides: Mapping[str, Any], up_to: int) -> tuple[int, ...]:
    sizes = []
    for tp in range(1, up_to + 1):
        try:
            ModelKV.from_hf_config(config, tp=tp, **overrides)
        except SpecError as error:
            if tp_split_problems(error, tp):  # other problems (a dtype or backend refused) are not the split's
                continue
        sizes.append(tp)
    return tuple(sizes)
