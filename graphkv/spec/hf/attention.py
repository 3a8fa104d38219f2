"""Attention layers from a config: KV heads, head sizes (per layer when they differ), windows, chunks.

- query heads: ``num_attention_heads`` (older names ``n_head``, ``n_heads``, ``attention_heads``,
  ``num_heads``);
- KV heads: ``num_key_value_heads``; Falcon's ``new_decoder_architecture`` + ``num_kv_heads`` or
  ``multi_query`` (one head; a Falcon config with neither keeps one KV head per query head);
  ``num_kv_heads``; DBRX's ``attn_config.kv_n_heads``; ChatGLM's ``multi_query_group_num``; else
  one per query head (MHA). ``multi_query`` alone (GPT-BigCode) means one head;
- head size: ``head_dim``, ``attention_head_dim`` (Zamba2), ``kv_channels`` (JetMoE, ChatGLM),
  else ``hidden_size / num_attention_heads`` (``n_embd`` / ``d_model``); V may differ
  (``v_head_dim``, MiMo-V2);
- per layer: ``per_layer_config`` (transformers 5: ``{layer: {head_dim, num_key_value_heads}}``),
  Gemma-4's older ``global_head_dim`` / ``num_global_key_value_heads`` for full-attention layers,
  MiMo-V2's ``swa_head_dim`` / ``swa_v_head_dim`` / ``swa_num_key_value_heads`` for sliding ones;
- window: ``sliding_window`` (``sliding_window_size``, ``attention_window_size``, ``window_size``);
  chunk: ``attention_chunk_size``.

Specs hold the model's KV heads; the reader checks that ``tp`` can split them (divided, or one
replicated head per rank when ``tp`` exceeds them) and :meth:`ModelKV.shard
<graphkv.spec.model.ModelKV.shard>` divides them. Query heads must divide by ``tp``, KV heads may
not exceed query heads and must divide them.
"""

from __future__ import annotations

from typing import Any, Mapping

from graphkv.spec.hf._reader import CAPS, MISSING, ConfigReader, Options
from graphkv.spec.hf.layout import Role
from graphkv.spec.layers import ChunkedLocalSpec, FullAttentionSpec, SlidingWindowSpec
from graphkv.spec.split_rules import SplitRule

__all__ = ["AttentionReader", "HEAD_KEYS", "HIDDEN_KEYS", "query_heads"]

HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "attention_heads", "num_heads")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
_WINDOW_KEYS = ("sliding_window", "sliding_window_size", "attention_window_size", "window_size")
_HEAD_DIM_KEYS = ("head_dim", "attention_head_dim", "kv_channels")

AttentionSpec = FullAttentionSpec | SlidingWindowSpec | ChunkedLocalSpec


def query_heads(cfg: ConfigReader, opts: Options, *, check_tp: bool = True) -> int | None:
    """Query heads, checked to divide by ``opts.tp`` (every rank computes heads / tp of them)."""
    heads = cfg.int_field(HEAD_KEYS[0], also=HEAD_KEYS[1:], cap="heads")
    if check_tp:
        check_query_heads_split(cfg, opts, heads)
    return heads


def check_query_heads_split(cfg: ConfigReader, opts: Options, heads: int | None) -> None:
    """Record a problem unless ``heads`` query heads divide by ``opts.tp``."""
    if heads is not None and heads % opts.tp:
        key = cfg.first_present(*HEAD_KEYS)
        cfg.problem(key, heads, f"must be divisible by tp={opts.tp} (each rank runs {key} / tp query heads)",
                    f"use a tensor-parallel size that divides {heads}")


def _kv_heads(cfg: ConfigReader, heads: int | None) -> tuple[str, int | None]:
    """The config's total KV heads and the field they came from."""
    if cfg.has("num_key_value_heads"):
        return "num_key_value_heads", cfg.int_field("num_key_value_heads", cap="heads")
    if cfg.flag("new_decoder_architecture"):
        return "num_kv_heads", cfg.int_field("num_kv_heads", cap="heads")
    if cfg.flag("multi_query"):
        return "multi_query", 1
    if cfg.present("new_decoder_architecture"):  # Falcon without MQA: one KV head per query head
        return HEAD_KEYS[0], heads
    if cfg.has("num_kv_heads"):
        return "num_kv_heads", cfg.int_field("num_kv_heads", cap="heads")
    section = cfg.get("attn_config")
    if section is not None and not isinstance(section, Mapping):  # DBRX: read as MHA, it would plan 8x the KV
        cfg.problem("attn_config", section, "must be an object of attention fields (DBRX: {\"kv_n_heads\": 8, ...})",
                    "copy attn_config from the model's config.json, or set num_key_value_heads")
        return "attn_config", None
    if isinstance(section, Mapping) and section.get("kv_n_heads") is not None:
        value = section["kv_n_heads"]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= CAPS["heads"]:
            cfg.problem("attn_config.kv_n_heads", value, f"must be an integer in [1, {CAPS['heads']}]",
                        "copy attn_config.kv_n_heads from the model's config.json")
            return "attn_config.kv_n_heads", None
        return "attn_config.kv_n_heads", value
    if cfg.flag("multi_query_attention") and cfg.has("multi_query_group_num"):
        return "multi_query_group_num", cfg.int_field("multi_query_group_num", cap="heads")
    return "num_key_value_heads", heads


def _head_size(cfg: ConfigReader, heads: int | None) -> int | None:
    for key in _HEAD_DIM_KEYS:
        if cfg.has(key):
            return cfg.int_field(key, cap="dim")
    hidden = cfg.int_field(HIDDEN_KEYS[0], also=HIDDEN_KEYS[1:], cap="width",
                           why="to derive the head size when head_dim is absent")
    if hidden is None or heads is None:
        return None
    if hidden % heads:
        cfg.problem("head_dim", MISSING, f"is absent and hidden_size={hidden} is not divisible by "
                                         f"num_attention_heads={heads}", "add head_dim to the config")
        return None
    return hidden // heads


class AttentionReader:
    """Builds each attention layer's spec; equal layers share one spec object (linear in layers)."""

    def __init__(self, cfg: ConfigReader, opts: Options, roles: set[Role], *, num_layers: int | None = None) -> None:
        self.cfg, self.opts, self.num_layers = cfg, opts, num_layers
        self.heads = query_heads(cfg, opts, check_tp=False)
        self.kv_key, self.kv_heads = _kv_heads(cfg, self.heads)
        cfg.split(self.kv_key, self.kv_heads, opts.tp, SplitRule.KV_HEADS)  # records a split problem before any layer
        check_query_heads_split(cfg, opts, self.heads)
        self.head_size = _head_size(cfg, self.heads)
        self.head_size_v = cfg.optional_int("v_head_dim", cap="dim")
        self.window = None
        if Role.SLIDING in roles:
            self.window = cfg.int_field(_WINDOW_KEYS[0], also=_WINDOW_KEYS[1:], cap="width",
                                        why="because some layers use sliding-window attention")
        self.chunk = None
        if Role.CHUNKED in roles:
            self.chunk = cfg.int_field("attention_chunk_size", cap="width",
                                       why="because some layers use chunked local attention")
        self.overrides = self._per_layer()
        self._specs: dict[tuple[Any, ...], AttentionSpec] = {}
        self._check_heads(self.kv_key, self.kv_heads)

    def _per_layer(self) -> dict[int, dict[str, Any]]:
        value = self.cfg.get("per_layer_config")
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.cfg.problem("per_layer_config", value, "must map layer indices to field overrides",
                             "copy per_layer_config from the model's config.json")
            return {}
        overrides: dict[int, dict[str, Any]] = {}
        for key, fields in value.items():
            # ASCII digits only ("²".isdigit() is true, but int() refuses it), and short enough to convert
            digits = isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9
            index = int(key) if digits else key
            if not isinstance(index, int) or isinstance(index, bool) or not isinstance(fields, Mapping):
                self.cfg.problem("per_layer_config", {key: fields}, "must map layer indices to field overrides",
                                 "copy per_layer_config from the model's config.json")
                return {}
            if self.num_layers is not None and index >= self.num_layers:
                self.cfg.problem("per_layer_config", key, f"names layer {index}, but the model has {self.num_layers} "
                                 f"layers (0..{self.num_layers - 1}): its overrides would apply to no layer",
                                 f"delete per_layer_config[{key!r}], or copy per_layer_config from the model's "
                                 "config.json")
                return {}
            overrides[index] = dict(fields)
        return overrides

    def _check_heads(self, key: str, kv_heads: int | None) -> None:
        heads = self.heads
        if kv_heads is None or heads is None:
            return
        if kv_heads > heads:
            self.cfg.problem(key, kv_heads, f"must be <= num_attention_heads={heads} (a KV head serves one or more "
                                            "query heads)", f"set {key} to a divisor of {heads}")
        elif heads % kv_heads:
            self.cfg.problem(key, kv_heads, f"must divide num_attention_heads={heads} (each KV head serves "
                                            "equally many query heads)", f"set {key} to a divisor of {heads}")

    def _layer_fields(self, index: int, role: Role) -> tuple[int | None, int | None, int | None]:
        """``(kv heads, head size, v head size)`` of layer ``index`` before sharding."""
        cfg, kv, head, v = self.cfg, self.kv_heads, self.head_size, self.head_size_v
        if role is Role.SLIDING and cfg.has("swa_head_dim"):  # MiMo-V2 original fields
            head = cfg.int_field("swa_head_dim", cap="dim")
            v = cfg.optional_int("swa_v_head_dim", cap="dim")
            if cfg.has("swa_num_key_value_heads"):
                kv = cfg.int_field("swa_num_key_value_heads", cap="heads")
                self._check_heads("swa_num_key_value_heads", kv)
        if role is Role.FULL and cfg.has("global_head_dim") and not self.overrides:  # Gemma-4 original fields
            head = cfg.int_field("global_head_dim", cap="dim")
            if cfg.has("num_global_key_value_heads") and cfg.flag("attention_k_eq_v", True):
                kv = cfg.int_field("num_global_key_value_heads", cap="heads")
                self._check_heads("num_global_key_value_heads", kv)
        override = self.overrides.get(index)
        if override:
            sub = ConfigReader(override)
            if sub.has("head_dim"):
                head = sub.int_field("head_dim", cap="dim")
            if sub.has("num_key_value_heads"):
                kv = sub.int_field("num_key_value_heads", cap="heads")
                self._check_heads(f"per_layer_config[{index}].num_key_value_heads", kv)
            if sub.has("v_head_dim"):
                v = sub.int_field("v_head_dim", cap="dim")
            for p in sub.check.problems:
                self.cfg.problem(f"per_layer_config[{index}].{p.field.split('.', 1)[1]}", p.value, p.limit, p.fix)
        return kv, head, v

    def spec(self, index: int, role: Role) -> AttentionSpec | None:
        """The spec of layer ``index`` (full, sliding or chunked by ``role``); ``None`` after recording a problem."""
        kv, head, v = self._layer_fields(index, role)
        kv = self.cfg.split(self.kv_key, kv, self.opts.tp, SplitRule.KV_HEADS)  # the model's heads, if tp splits them
        window = self.window if role is Role.SLIDING else None
        chunk = self.chunk if role is Role.CHUNKED else None
        if kv is None or head is None or (role is Role.SLIDING and window is None) or (
                role is Role.CHUNKED and chunk is None):
            return None
        key = (role, kv, head, v, window, chunk)
        if key not in self._specs:
            self._specs[key] = _build(self.opts, kv, head, v, window, chunk)
        return self._specs[key]


def _build(opts: Options, kv: int, head: int, v: int | None, window: int | None, chunk: int | None) -> AttentionSpec:
    common = dict(num_kv_heads=kv, head_size=head, head_size_v=v if v != head else None, dtype=opts.attention_dtype)
    if window is not None:
        return SlidingWindowSpec(window=window, **common)  # type: ignore[arg-type]
    if chunk is not None:
        return ChunkedLocalSpec(chunk=chunk, **common)  # type: ignore[arg-type]
    return FullAttentionSpec(**common)  # type: ignore[arg-type]
