"""A paged *view* of a transformers model: its own modules and weights, graphkv's attention and mixers.

The view is a second module tree over the same parameters: every module is a shallow copy (its own
child list and attributes, the same ``Parameter`` and buffer tensors — no weight is copied), its
config a copy whose ``_attn_implementation`` names graphkv's paged attention, and chosen modules
(the recurrent mixers) replaced. The user's model is left exactly as it was, so
``model.generate`` keeps working beside the view and a test can compare the two.
"""

from __future__ import annotations

import copy
from typing import Callable, Mapping

import torch

__all__ = ["paged_view"]


def paged_view(model: torch.nn.Module, *, attn_implementation: str,
               replace: Mapping[torch.nn.Module, Callable[[torch.nn.Module], torch.nn.Module]],
               experts_implementation: str | None = None) -> torch.nn.Module:
    """A view of ``model`` whose config says ``attn_implementation`` (and, when given,
    ``experts_implementation`` for MoE layers) and in which each module ``m`` in ``replace``
    (matched by identity) becomes ``replace[m](twin)``, ``twin`` being the view's copy of ``m``.
    Parameters and buffers are the model's own tensors (``data_ptr()`` equal); ``model`` itself
    is not changed. The view is in eval mode (dropout off), whatever mode ``model`` is in."""
    old_config = model.config
    config = copy.deepcopy(old_config)
    config._attn_implementation = attn_implementation
    if experts_implementation is not None:
        config._experts_implementation = experts_implementation
    by_id = {id(m): r for m, r in replace.items()}

    def twin(module: torch.nn.Module) -> torch.nn.Module:
        out = copy.copy(module)  # a new __dict__ holding the same attribute values
        out._parameters = dict(module._parameters)
        out._buffers = dict(module._buffers)
        out._non_persistent_buffers_set = set(module._non_persistent_buffers_set)  # a buffer the view adds stays its
        out._modules = {name: None if child is None else twin(child) for name, child in module._modules.items()}
        if module.__dict__.get("config") is old_config:
            out.__dict__["config"] = config
        return by_id[id(module)](out) if id(module) in by_id else out

    view = twin(model)
    view.train(False)
    return view
