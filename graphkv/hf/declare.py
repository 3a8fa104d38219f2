"""Declare a loaded transformers model's cache layers with the reader ``graphkv plan`` uses."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from graphkv.errors import Problem, SpecError
from graphkv.hf.support import FamilySupport, family_of
from graphkv.spec.backends import BUILTIN_BACKENDS
from graphkv.spec.model import ModelKV

__all__ = ["CPU_FLEX_Q_TILE", "flex_q_tile_for", "model_dtype", "model_kv"]

CPU_FLEX_Q_TILE = 4
"""The flex query tile graphkv.hf plans on a CPU (the ``flex`` backend's is 128, a GPU kernel's
tile). Compiled CPU flex scores every key block its query tile lists, and a decode step packs one
token per request, so a 128-token tile of 32 decoding requests lists all 32 requests' pages for
each of them; a 4-token tile lists at most 4. Measured on the tiny Qwen3 at batch 32 (2-core CPU,
one thread): 2.6k generated tokens/s with 128, 3.2k with 16, 4.8k with 4, 3.9k with 1."""


def flex_q_tile_for(device: "str | torch.device", kernels: str) -> int | None:
    """The flex query tile graphkv.hf plans with on ``device`` with resolved ``kernels``:
    :data:`CPU_FLEX_Q_TILE` on a CPU's own path, ``None`` (the backend's GPU default) on the GPU path."""
    from graphkv.runtime.ops.choice import gpu_path

    return None if gpu_path(kernels, device) else CPU_FLEX_Q_TILE


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The floating dtype of ``model``'s parameters (the dtype its activations, and so its cache, have).
    Raises :class:`SpecError` for a model without floating parameters or with several dtypes."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(dtypes) != 1:
        raise SpecError(Problem(field="model", value=sorted(str(d) for d in dtypes),
                                limit="graphkv.hf needs one floating dtype for the weights (the cache takes it)",
                                fix="cast the model, e.g. model.to(torch.bfloat16)"))
    dtype = dtypes.pop()
    if dtype not in _CACHE_DTYPES:  # float64: no kernel or cache layout of graphkv's (nor vLLM's) holds it
        raise SpecError(Problem(field="model", value=str(dtype),
                                limit="graphkv.hf runs float32, bfloat16 or float16 weights (the cache takes their "
                                      "dtype)",
                                fix="cast the model, e.g. model.to(torch.float32)"))
    return dtype


_CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


_SLIDING, _FULL = "sliding_attention", "full_attention"


def _slides(model: Any, family: FamilySupport) -> bool:
    """Whether some attention module of ``model`` slides over a window (its family's reading of the module)."""
    return any(family.sliding_window(module) is not None for module in model.modules()
               if type(module).__name__ == family.attention)


def model_kv(model: Any, *, mamba_ssm_dtype: str | None = None, flex_q_tile_tokens: int | None = None) -> ModelKV:
    """What ``model`` caches, read from ``model.config`` by :meth:`ModelKV.from_hf_config` (the reader
    behind ``graphkv plan --hf-config``) with the flex backend for attention. The attention cache and
    conv states take the weights' dtype; recurrent states the config's or the family's (Nemotron-H:
    float32), or ``mamba_ssm_dtype``. ``flex_q_tile_tokens`` replaces the flex backend's query tile
    (:data:`CPU_FLEX_Q_TILE` on a CPU). Raises :class:`SpecError` for a model graphkv.hf does not
    run (:func:`graphkv.hf.support.family_of`). A config that names a ``sliding_window`` none of the model's
    attention modules slides over (:meth:`~graphkv.hf.support.FamilySupport.sliding_window`: OLMo, GPT-2, LFM2,
    Llama, ... keep the field and attend to the whole context) is read without it, and its ``layer_types`` with
    full for sliding attention, so that full attention is planned, as the model computes (``graphkv plan
    --hf-config`` reads such a config as every layer sliding, as vLLM does). Pure: reads the config and the
    modules' attributes, touches no tensor."""
    family = family_of(model)
    config = model.config.to_dict()
    config.pop("torch_dtype", None)
    if not _slides(model, family):
        config.pop("sliding_window", None)
        if isinstance(config.get("layer_types"), list):  # a sliding layer type the modules do not act on
            config["layer_types"] = [_FULL if t == _SLIDING else t for t in config["layer_types"]]
    config["dtype"] = str(model_dtype(model)).removeprefix("torch.")
    declared = ModelKV.from_hf_config(config, attention_backend="flex", mamba_ssm_dtype=mamba_ssm_dtype)
    if flex_q_tile_tokens is None:
        return declared
    flex = attrs.evolve(BUILTIN_BACKENDS["flex"], q_tile_tokens=flex_q_tile_tokens)
    return attrs.evolve(declared, layers=tuple(attrs.evolve(layer, backend=flex) if layer.backend.name == "flex"
                                               else layer for layer in declared.layers))
