"""Llama-style decoders (Llama, Mistral, Mixtral, Qwen2/2-MoE, Qwen3/3-MoE): every layer attends.

Which layers slide, in order of precedence:

1. ``layer_types`` (written by recent ``transformers``): ``sliding_attention`` /
   ``full_attention`` per layer;
2. else, when ``sliding_window`` is set and ``use_sliding_window`` is true or absent (Mistral
   has no such flag; Qwen2/Qwen3 ship ``use_sliding_window: false``): layers ``i >=
   max_window_layers`` (default 0, so all layers for Mistral) use a window of ``sliding_window``
   tokens — the rule ``transformers`` applies to Qwen2;
3. else every layer is full attention.
"""

from __future__ import annotations

from graphkv.spec.hf._common import FULL, SLIDING, attention_layers
from graphkv.spec.hf._reader import ConfigReader, Options
from graphkv.spec.model import LayerDecl

__all__ = ["build"]


def _window_enabled(cfg: ConfigReader) -> bool:
    if not cfg.has("sliding_window"):
        return False
    flag = cfg.get("use_sliding_window", True)
    if not isinstance(flag, bool):
        cfg.problem("use_sliding_window", flag, "must be true or false", "set use_sliding_window to a boolean")
        return False
    return flag


def _layer_kinds(cfg: ConfigReader, num_layers: int | None) -> list[str] | None:
    if cfg.has("layer_types"):
        return cfg.str_list("layer_types", (FULL, SLIDING), num_layers)
    if not _window_enabled(cfg):
        return None if num_layers is None else [FULL] * num_layers
    first_sliding = cfg.int_field("max_window_layers", default=0, minimum=0)
    if num_layers is None or first_sliding is None:
        return None
    return [SLIDING if i >= first_sliding else FULL for i in range(num_layers)]


def build(cfg: ConfigReader, opts: Options, num_layers: int | None) -> list[LayerDecl]:
    """Every layer full or sliding-window attention, ``flash_attn`` unless overridden."""
    return attention_layers(cfg, opts, _layer_kinds(cfg, num_layers))
