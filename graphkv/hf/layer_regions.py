"""The paged view's decoder layers as nested compile regions, so Dynamo traces one layer of each structure.

Under ``compile="piecewise"`` / ``"fused"`` graphkv's backend receives the whole forward's trace; with the layers
marked (:func:`graphkv.runtime.capture.regions.layer_region`), Dynamo traces the first layer and stamps the trace
out for every later layer whose inputs and guards match, and the backend inlines the bodies again before it splits
(:func:`graphkv.runtime.capture.regions.inline_regions`). Only the view's copies are marked: the user's model is
untouched, and an eager forward of the view runs each layer as before.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from graphkv.hf.layer_compile import decoder_layers
from graphkv.runtime.capture.regions import layer_region, regions_reuse_traces

__all__ = ["region_layers", "unmark_layers"]


def _decoder_layer(layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return type(layer).forward(layer, *args, **kwargs)


_LAYER = layer_region(_decoder_layer)  # one function object for every layer: Dynamo keeps its traces by it


def _region_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return _LAYER(self, *args, **kwargs)


def region_layers(view: torch.nn.Module) -> int:
    """Mark every decoder layer of ``view`` (a paged view: each element of a ``ModuleList`` that holds a planned
    layer, i.e. a module with the :data:`~graphkv.hf.layer_ops.LAYER_BUFFER` buffer) as a nested compile region,
    where this torch reuses a region's trace (:func:`~graphkv.runtime.capture.regions.regions_reuse_traces`);
    returns how many were marked (0 on older torch). Host only (at set-up)."""
    if not regions_reuse_traces():
        return 0
    count = 0
    for layer in list(decoder_layers(view)):
        layer.forward = types.MethodType(_region_forward, layer)
        count += 1
    return count


def unmark_layers(view: torch.nn.Module) -> int:
    """Undo :func:`region_layers` on ``view``: every layer runs its class's forward again (Dynamo then traces each
    layer of a later compile one by one); returns how many were unmarked. Host only."""
    count = 0
    for module in view.modules():
        if module.__dict__.get("forward") is not None and getattr(module.forward, "__func__", None) is _region_forward:
            del module.__dict__["forward"]
            count += 1
    return count
