"""Declare a loaded transformers model's cache layers with the reader ``graphkv plan`` uses."""

from __future__ import annotations

from typing import Any

import torch

from graphkv.errors import Problem, SpecError
from graphkv.hf.support import family_of
from graphkv.spec.model import ModelKV

__all__ = ["model_dtype", "model_kv"]


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The floating dtype of ``model``'s parameters (the dtype its activations, and so its cache, have).
    Raises :class:`SpecError` for a model without floating parameters or with several dtypes."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(dtypes) != 1:
        raise SpecError(Problem(field="model", value=sorted(str(d) for d in dtypes),
                                limit="graphkv.hf needs one floating dtype for the weights (the cache takes it)",
                                fix="cast the model, e.g. model.to(torch.bfloat16)"))
    return dtypes.pop()


def model_kv(model: Any, *, mamba_ssm_dtype: str | None = None) -> ModelKV:
    """What ``model`` caches, read from ``model.config`` by :meth:`ModelKV.from_hf_config` (the reader
    behind ``graphkv plan --hf-config``) with the flex backend for attention. The attention cache and
    conv states take the weights' dtype; recurrent states the config's or the family's (Nemotron-H:
    float32), or ``mamba_ssm_dtype``. Raises :class:`SpecError` for a model graphkv.hf does not run
    (:func:`graphkv.hf.support.family_of`). Pure: reads the config, touches no tensor."""
    family_of(model)
    config = model.config.to_dict()
    config.pop("torch_dtype", None)
    config["dtype"] = str(model_dtype(model)).removeprefix("torch.")
    return ModelKV.from_hf_config(config, attention_backend="flex", mamba_ssm_dtype=mamba_ssm_dtype)
