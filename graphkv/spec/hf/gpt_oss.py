"""gpt-oss: alternating sliding-window (``sliding_window`` tokens) and full attention layers.

``layer_types`` lists each layer's kind; without it layers alternate starting with sliding
(layer 0 slides, layer 1 is full, …), as the released checkpoints do.
"""

from __future__ import annotations

from graphkv.spec.hf._common import FULL, SLIDING, attention_layers
from graphkv.spec.hf._reader import ConfigReader, Options
from graphkv.spec.model import LayerDecl

__all__ = ["build"]


def build(cfg: ConfigReader, opts: Options, num_layers: int | None) -> list[LayerDecl]:
    """Sliding and full attention layers as ``layer_types`` (or the alternation) says."""
    if cfg.has("layer_types"):
        kinds = cfg.str_list("layer_types", (FULL, SLIDING), num_layers)
    else:
        kinds = None if num_layers is None else [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    return attention_layers(cfg, opts, kinds)
