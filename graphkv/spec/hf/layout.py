"""What each layer of the stack is, read from whichever field the config uses to say it.

In order of precedence (the first field the config writes decides):

1. a per-layer list: ``layer_types`` (transformers 5), ``layers_block_type`` (Nemotron-H's and
   Zamba2's list; it also gives the layer count when ``num_hidden_layers`` is gone), or
   ``attention_layers`` (GPT-Neo's ``global`` / ``local``);
2. an older per-family encoding: ``hybrid_override_pattern`` (Nemotron-H letters ``M * - E``),
   ``hybrid_layer_pattern`` (MiMo-V2: 1 = sliding), ``attn_type_list`` (MiniMax-Text-01: 1 =
   softmax, 0 = lightning), ``linear_attn_config`` (Kimi-Linear: 1-indexed ``full_attn_layers``
   / ``kda_layers``), ``attention_chunk_size`` with ``no_rope_layers`` (Llama-4: RoPE layers are
   chunked, NoPE layers global), ``full_attention_interval`` (Qwen3-Next), ``attn_layer_period``
   / ``attn_layer_offset`` (Jamba), ``attn_layer_indices`` (Bamba), ``full_attn_idxs`` (LFM2),
   ``hybrid_layer_ids`` (Zamba2);
3. the kind of model its fields describe: recurrent-state fields without attention heads make
   every layer a state (Mamba, Mamba2); a family whose layers all run attention and a state in
   parallel (Falcon-H1) makes every layer hold both; attention and state fields with no layout
   field are refused (nothing says which layer is which);
4. sliding windows: ``sliding_window_pattern`` (an int N: every N-th layer is full; or a
   string such as ``"LLLG"``), ``global_attn_every_n_layers``, the family's default pattern,
   ``use_sliding_window`` with ``max_window_layers`` (Qwen2: layers from that index slide; the
   switch not written is off, as transformers reads it, in the families whose config has it and
   beside ``max_window_layers``), or a ``sliding_window`` that applies to every layer (Mistral);
5. otherwise every layer is full attention.
"""

from __future__ import annotations

import enum
from typing import Callable, Sequence

import attrs

from graphkv.spec.hf._reader import CAPS, MISSING, ConfigReader
from graphkv.spec.hf.families import Family

__all__ = ["LAYER_COUNT_KEYS", "Layout", "Role", "describe_counts", "has_attention_heads", "has_state_fields",
           "read_layout"]


class Role(enum.Enum):
    """What one model layer holds."""

    FULL = "full_attention"
    SLIDING = "sliding_attention"
    CHUNKED = "chunked_attention"
    INDEXED = "indexed_attention"  # MLA plus the indexer's key cache
    STATE = "linear_attention"  # a recurrent state; which one is read from the fields
    CONV = "conv"  # LFM2's short convolution
    HYBRID = "hybrid"  # attention and a recurrent state in one layer
    MLP = "mlp"
    MOE = "moe"

    @property
    def holds_cache(self) -> bool:
        """Whether the layer keeps anything between steps."""
        return self not in (Role.MLP, Role.MOE)


_WORDS: dict[str, Role] = {
    "full_attention": Role.FULL, "attention": Role.FULL, "global": Role.FULL, "global_attention": Role.FULL,
    "sliding_attention": Role.SLIDING, "local": Role.SLIDING, "local_attention": Role.SLIDING,
    "chunked_attention": Role.CHUNKED,
    "indexed_attention": Role.INDEXED, "deepseek_sparse_attention": Role.INDEXED,
    "linear_attention": Role.STATE, "mamba": Role.STATE, "mamba2": Role.STATE,
    "conv": Role.CONV, "hybrid": Role.HYBRID, "mlp": Role.MLP, "moe": Role.MOE,
}
_LIST_KEYS = ("layer_types", "layers_block_type", "attention_layers")
_PATTERN_LETTERS = {"M": Role.STATE, "*": Role.FULL, "-": Role.MLP, "E": Role.MOE}
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_ATTENTION_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "attention_heads")
_STATE_KEYS = ("linear_key_head_dim", "linear_num_value_heads", "linear_head_dim", "linear_num_heads",
               "linear_attn_config", "mamba_num_heads", "mamba_n_heads", "n_mamba_heads", "mamba_d_state",
               "ssm_state_size", "state_size", "mamba_d_ssm")


@attrs.frozen(kw_only=True)
class Layout:
    """Each layer's role and the field that said it (``source``, in words; ``field``, the config key of a
    per-layer list or pattern, where there is one)."""

    roles: tuple[Role, ...]
    source: str
    field: str | None = None


def has_attention_heads(cfg: ConfigReader) -> bool:
    """Whether the config declares attention heads under any of their names."""
    return any(cfg.has(k) for k in _ATTENTION_HEAD_KEYS)


def has_state_fields(cfg: ConfigReader) -> bool:
    """Whether the config declares a recurrent state (Mamba, gated-delta, KDA fields)."""
    return any(cfg.has(k) for k in _STATE_KEYS)


def _layer_count(cfg: ConfigReader, family: Family | None = None) -> int | None:
    if family is not None and family.attentions_per_layer > 1 and cfg.has("num_layers"):
        # LongCat-Flash: num_layers decoder layers of two attentions each; transformers <= 5.17 also
        # writes num_hidden_layers = 2 x num_layers (it counts the attentions), which is not the layer count.
        return cfg.int_field("num_layers", cap="layers")
    return cfg.int_field("num_hidden_layers", also=LAYER_COUNT_KEYS[1:], cap="layers")


def _from_list(cfg: ConfigReader, key: str) -> Layout:
    value = cfg.get(key)
    if not isinstance(value, (list, tuple)) or not value:
        cfg.fail(key, value, "must be a non-empty list of layer type names, one per layer",
                 f"set {key} to one of {sorted(_WORDS)} per layer")
    bad = next((i for i, v in enumerate(value) if not isinstance(v, str)), None)
    if bad is not None:
        cfg.fail(key, value if len(value) <= 8 else f"<{len(value)} entries>",
                 f"must list layer type names, but entry {bad} is {value[bad]!r} ({type(value[bad]).__name__})",
                 f"set each entry of {key} to one of {sorted(_WORDS)}")
    unknown = sorted({v for v in value if v not in _WORDS})
    if unknown:
        cfg.fail(key, f"<{len(value)} entries>" if len(value) > 8 else list(value),
                 f"has layer types graphkv cannot plan: {unknown}; it reads {sorted(_WORDS)}",
                 "plan the supported layers with ModelKV.from_specs, or file the layer type with its cache shape")
    has_count = any(cfg.has(k) for k in LAYER_COUNT_KEYS)
    count = _layer_count(cfg) if has_count else None
    if count is not None and len(value) != count:
        cfg.fail(key, f"<{len(value)} entries>", f"must have one entry per layer (num_hidden_layers={count})",
                 f"make {key} and num_hidden_layers agree")
    if len(value) > CAPS["layers"]:
        cfg.fail(key, f"<{len(value)} entries>", f"must be <= {CAPS['layers']} layers (plausibility cap)",
                 f"check {key} against the model's config.json")
    return Layout(roles=tuple(_WORDS[v] for v in value), source=f"{key} ({len(value)} layers)", field=key)


def _from_letters(cfg: ConfigReader, key: str) -> Layout:
    pattern = cfg.get(key)
    if not isinstance(pattern, str) or not pattern:
        cfg.fail(key, pattern, f"must be a non-empty string: one letter per layer from {sorted(_PATTERN_LETTERS)}",
                 f"copy {key} from the model's config.json")
    unknown = [f"{letter!r} at {i}" for i, letter in enumerate(pattern) if letter not in _PATTERN_LETTERS]
    if unknown:
        cfg.fail(key, pattern, f"has {len(unknown)} unknown letters ({', '.join(unknown[:8])}); allowed: "
                               "M (Mamba2), * (attention), - (MLP), E (MoE)",
                 f"use only M*-E in {key}")
    count = _layer_count(cfg) if any(cfg.has(k) for k in LAYER_COUNT_KEYS) else None
    if count is not None and len(pattern) != count:
        cfg.fail(key, pattern, f"has {len(pattern)} letters but num_hidden_layers={count}",
                 f"make {key} one letter per layer")
    return Layout(roles=tuple(_PATTERN_LETTERS[c] for c in pattern), source=f"{key} ({len(pattern)} layers)",
                  field=key)


def _flags(cfg: ConfigReader, key: str, count: int, if_one: Role, if_zero: Role) -> Layout:
    value = cfg.get(key)
    if (not isinstance(value, (list, tuple)) or len(value) != count
            or not all(v in (0, 1) and not isinstance(v, float) for v in value)):
        cfg.fail(key, value if not isinstance(value, (list, tuple)) or len(value) <= 8 else f"<{len(value)} entries>",
                 f"must list 0 or 1 for each of the {count} layers", f"copy {key} from the model's config.json")
    return Layout(roles=tuple(if_one if v else if_zero for v in value), source=key)


def _indices(cfg: ConfigReader, key: str, count: int, *, base: int = 0, value: object = MISSING) -> set[int]:
    """The layer indices ``key`` lists (``value`` when given: a field nested in another), shifted by ``base``."""
    value = cfg.get(key, []) if value is MISSING else value
    if (not isinstance(value, (list, tuple))
            or not all(isinstance(v, int) and not isinstance(v, bool) and base <= v < count + base for v in value)):
        cfg.fail(key, value if not isinstance(value, (list, tuple)) or len(value) <= 8 else f"<{len(value)} entries>",
                 f"must list layer indices in [{base}, {count + base - 1}]", f"copy {key} from the model's config.json")
    return {v - base for v in value}


def _marked(count: int, marked: set[int], yes: Role, no: Role) -> tuple[Role, ...]:
    return tuple(yes if i in marked else no for i in range(count))


def _kimi(cfg: ConfigReader, count: int) -> Layout | None:
    section = cfg.get("linear_attn_config")
    if not isinstance(section, dict) or "full_attn_layers" not in section or "kda_layers" not in section:
        return None
    full = _indices(cfg, "linear_attn_config.full_attn_layers", count, base=1, value=section["full_attn_layers"])
    state = _indices(cfg, "linear_attn_config.kda_layers", count, base=1, value=section["kda_layers"])
    if full & state or len(full | state) != count:
        cfg.fail("linear_attn_config", {k: section[k] for k in ("full_attn_layers", "kda_layers")},
                 f"full_attn_layers and kda_layers must split the {count} layers between them (1-indexed)",
                 "copy linear_attn_config from the model's config.json")
    return Layout(roles=_marked(count, full, Role.FULL, Role.STATE), source="linear_attn_config (1-indexed layers)")


def _chunked(cfg: ConfigReader, count: int) -> Layout:
    if cfg.has("no_rope_layers"):
        layout = _flags(cfg, "no_rope_layers", count, Role.CHUNKED, Role.FULL)
        return attrs.evolve(layout, source="attention_chunk_size with no_rope_layers (RoPE layers are chunked)")
    interval = cfg.int_field("no_rope_layer_interval", default=4, cap="layers")
    if interval is None:
        cfg.raise_if_any()
    assert interval is not None
    roles = tuple(Role.FULL if (i + 1) % interval == 0 else Role.CHUNKED for i in range(count))
    return Layout(roles=roles, source=f"attention_chunk_size, 1 global (NoPE) layer in every {interval}")


def _every(count: int, is_special: Callable[[int], bool], special: Role, other: Role) -> tuple[Role, ...]:
    return tuple(special if is_special(i) else other for i in range(count))


def _sliding_pattern(cfg: ConfigReader, count: int, family: Family | None) -> Layout | None:
    for key in ("sliding_window_pattern", "_sliding_window_pattern", "global_attn_every_n_layers"):
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, str) and value and set(value) <= {"L", "G"}:
            roles = tuple(Role.FULL if value[i % len(value)] == "G" else Role.SLIDING for i in range(count))
            return Layout(roles=roles, source=f"{key}={value!r} (L sliding, G global)")
        if isinstance(value, str):
            cfg.fail(key, value, "must be an integer N (every N-th layer is full attention) or a non-empty string of "
                                 "L (sliding) and G (global) letters, repeated over the layers",
                     f"copy {key} from the model's config.json, such as 6 or \"LLLLLG\"")
        period = cfg.int_field(key, cap="layers")
        if period is None:
            cfg.raise_if_any()
        assert period is not None
        return Layout(roles=_every(count, lambda i: (i + 1) % period == 0, Role.FULL, Role.SLIDING),
                      source=f"{key}={period} (1 full layer in every {period})")
    if family is not None and family.sliding_pattern is not None and cfg.has("sliding_window"):
        period = family.sliding_pattern
        return Layout(roles=_every(count, lambda i: (i + 1) % period == 0, Role.FULL, Role.SLIDING),
                      source=f"the {family.model_type} default: 1 full layer in every {period}, the others slide")
    return None


def _qwen_style(cfg: ConfigReader, count: int, family: Family | None) -> Layout | None:
    """``sliding_window`` with Qwen2's switch: ``use_sliding_window`` (false when not written in a family whose
    config has it, or beside ``max_window_layers``, which only such configs write; true elsewhere: Mistral's
    configs write ``sliding_window`` alone) and ``max_window_layers`` (layers from it slide)."""
    flagged = cfg.has("max_window_layers") or (family is not None and family.sliding_window_flag)
    if not cfg.has("sliding_window") or not cfg.flag("use_sliding_window", not flagged):
        return None
    if not cfg.has("max_window_layers"):
        return Layout(roles=(Role.SLIDING,) * count, source="sliding_window (every layer)")
    first = cfg.int_field("max_window_layers", minimum=0, cap="layers")
    if first is None:
        cfg.raise_if_any()
    assert first is not None
    return Layout(roles=tuple(Role.SLIDING if i >= first else Role.FULL for i in range(count)),
                  source=f"use_sliding_window with max_window_layers={first} (layers from {first} slide)")


def read_layout(cfg: ConfigReader, family: Family | None) -> Layout | None:
    """Each layer's role, from the first field that says it (see the module docstring); ``None``
    when the layer count is missing or bad (the problem is recorded, so the caller can collect the
    config's other problems before raising).

    Raises SpecError with one problem naming the field when the layers cannot be understood."""
    for key in _LIST_KEYS:
        if cfg.has(key):
            return _from_list(cfg, key)
    if cfg.has("hybrid_override_pattern"):
        return _from_letters(cfg, "hybrid_override_pattern")
    count = _layer_count(cfg, family)
    if count is None:
        return None
    readers: Sequence[tuple[str, Callable[[], Layout | None]]] = (
        ("hybrid_layer_pattern", lambda: _flags(cfg, "hybrid_layer_pattern", count, Role.SLIDING, Role.FULL)),
        ("attn_type_list", lambda: _flags(cfg, "attn_type_list", count, Role.FULL, Role.STATE)),
        ("linear_attn_config", lambda: _kimi(cfg, count)),
        ("attention_chunk_size", lambda: _chunked(cfg, count)),
    )
    for key, read in readers:
        if cfg.has(key):
            layout = read()
            if layout is not None:
                return layout
    return _interleaved(cfg, count, family)


def _interleaved(cfg: ConfigReader, count: int, family: Family | None) -> Layout:
    if cfg.has("full_attention_interval"):
        n = cfg.int_field("full_attention_interval", cap="layers")
        if n is None:
            cfg.raise_if_any()
        assert n is not None
        return Layout(roles=_every(count, lambda i: (i + 1) % n == 0, Role.FULL, Role.STATE),
                      source=f"full_attention_interval={n}")
    if cfg.has("attn_layer_period"):
        period = cfg.int_field("attn_layer_period", cap="layers")
        offset = cfg.int_field("attn_layer_offset", minimum=0, cap="layers")
        if period is not None and offset is not None and offset >= period:
            cfg.problem("attn_layer_offset", offset, f"must be < attn_layer_period={period}",
                        "set attn_layer_offset to the position of the attention layer inside each period")
        if period is None or offset is None or offset >= period:
            cfg.raise_if_any()
        assert period is not None and offset is not None
        return Layout(roles=_every(count, lambda i: i % period == offset, Role.FULL, Role.STATE),
                      source=f"attn_layer_period={period}, attn_layer_offset={offset}")
    marked_keys = (("attn_layer_indices", Role.FULL, Role.STATE), ("full_attn_idxs", Role.FULL, Role.CONV),
                   ("hybrid_layer_ids", Role.HYBRID, Role.STATE))
    for key, yes, no in marked_keys:
        if cfg.present(key):
            return Layout(roles=_marked(count, _indices(cfg, key, count), yes, no), source=key)
    if has_state_fields(cfg):
        if not has_attention_heads(cfg):
            return Layout(roles=(Role.STATE,) * count, source="recurrent-state fields, no attention heads")
        if family is not None and family.parallel_hybrid:
            return Layout(roles=(Role.HYBRID,) * count,
                          source=f"the {family.model_type} default: every layer runs attention and its state in parallel")
        cfg.fail("layer_types", MISSING, "is needed: the config has attention and recurrent-state fields but no field "
                 "says which layers are which",
                 "add layer_types (full_attention / linear_attention / hybrid per layer) or the family's own layout "
                 "field (hybrid_override_pattern, full_attention_interval, attn_layer_period, attn_layer_indices, …)")
    if cfg.has("conv_L_cache"):
        cfg.fail("layer_types", MISSING, "is needed: the config has short-convolution fields (conv_L_cache) but no "
                 "field says which layers are convolutions", "add layer_types (full_attention / conv per layer) or "
                 "full_attn_idxs from the model's config.json")
    return (_sliding_pattern(cfg, count, family) or _qwen_style(cfg, count, family)
            or Layout(roles=(Role.FULL,) * count, source="no layout field: every layer full attention"))


def describe_counts(roles: Sequence[Role]) -> str:
    """``36 linear_attention, 12 full_attention`` in order of first appearance."""
    counts: dict[Role, int] = {}
    for role in roles:
        counts[role] = counts.get(role, 0) + 1
    return ", ".join(f"{n} {role.value}" for role, n in counts.items())
