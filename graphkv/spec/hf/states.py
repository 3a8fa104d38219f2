"""Recurrent state layers from a config: which recurrence its fields describe, and its shapes.

The fields decide the family of the state (``layer_types`` only says ``linear_attention``), in
this order:

- gated-delta (Qwen3-Next, Qwen3.5, OLMo-Hybrid): ``linear_num_key_heads``,
  ``linear_num_value_heads`` (a multiple of the key heads: each key head serves equally many),
  ``linear_key_head_dim``, ``linear_value_head_dim``, ``linear_conv_kernel_dim`` — conv
  ``(k - 1, (2 * kh * kd + vh * vd) / tp)``, recurrent ``(vh / tp, vd, kd)`` (vLLM 0.33
  ``gated_delta_net_state_shape``);
- KDA (Kimi-Linear, Ling): ``linear_num_heads``, ``linear_head_dim``, ``linear_conv_kernel_dim``
  (or Kimi's ``linear_attn_config``) — conv ``(k - 1, 3 * h * d / tp)``, recurrent
  ``(h / tp, d, d)`` in float32 unless asked otherwise (``kda_state_shape`` / ``kda_state_dtype``);
- Mamba2 (Mamba2, Nemotron-H, Bamba, Granite-4.0-H, Zamba2, Falcon-H1): heads
  (``mamba_num_heads`` / ``mamba_n_heads`` / ``n_mamba_heads`` / ``num_heads``), head size
  (``mamba_head_dim`` / ``mamba_d_head`` / ``mamba_headdim`` / ``head_dim``), state
  (``ssm_state_size`` / ``mamba_d_state`` / ``state_size``), groups (``n_groups`` /
  ``mamba_n_groups`` / ``mamba_ngroups``; the heads a multiple of them), conv kernel
  (``conv_kernel`` / ``mamba_d_conv``); inner size ``mamba_d_ssm`` or heads x head size; conv
  ``(k - 1, (inner + 2 * G * state) / tp)`` where a group count that ``tp`` does not divide must
  be 1 and is replicated (``G = tp``), ssm ``(heads / tp, head size, state)``
  (``mamba2_state_shape``);
- Mamba1 (Mamba, Falcon-Mamba, Jamba): state ``mamba_d_state`` / ``state_size``, inner size
  ``mamba_expand * hidden_size`` (else ``intermediate_size``, else ``expand * hidden_size``) —
  conv ``(k - 1, inner / tp)``, ssm ``(inner / tp, state)`` (``mamba1_state_shape``);
- lightning attention (MiniMax-Text-01, marked by ``linear_attn_alpha_factor`` or
  ``attn_type_list``): ``(heads / tp, head_dim, head_dim)`` in the model dtype
  (``linear_attention_state_shape``);
- short convolution (LFM2 ``conv`` layers): ``(conv_L_cache - 1, conv_dim / tp)`` with
  ``conv_dim`` defaulting to ``hidden_size`` (``short_conv_state_shape``).

Shapes are those of the whole model (every head) with a :class:`~graphkv.spec.layers.StateSplit`
naming the config fields; the reader checks that ``tp`` splits them (recording a problem naming
the field) and :meth:`ModelKV.shard <graphkv.spec.model.ModelKV.shard>` computes the per-rank
shapes above.

Conv states use the checkpoint dtype; ssm / recurrent states use the dtype asked for (the
``mamba_ssm_dtype`` argument, else the config's ``mamba_ssm_cache_dtype`` / ``mamba_ssm_dtype``,
else the family's default), else the variant's default.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from graphkv.spec.dtypes import DType
from graphkv.spec.hf._reader import ConfigReader, Options
from graphkv.spec.hf.attention import HEAD_KEYS, HIDDEN_KEYS
from graphkv.spec.layers import MambaSpec, StateSplit
from graphkv.spec.split_rules import SplitRule

__all__ = ["STATE_BACKENDS", "read_conv_state", "read_state", "state_variant"]

STATE_BACKENDS: Mapping[str, str] = {"mamba1": "mamba", "mamba2": "mamba", "gated_delta": "gdn", "kda": "kda",
                                     "lightning": "lightning", "short_conv": "short_conv"}
"""The state backend each variant runs on."""

GATED_DELTA_CHUNK_TOKENS = 64  # chunk length of the chunked gated-delta / KDA prefill kernels
_MAMBA2_HEADS = ("mamba_num_heads", "mamba_n_heads", "n_mamba_heads")


def state_variant(cfg: ConfigReader) -> str | None:
    """Which recurrence the config's fields describe, or ``None`` when none does."""
    if any(cfg.has(k) for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                "linear_value_head_dim")):
        return "gated_delta"
    if cfg.has("linear_num_heads") or cfg.has("linear_head_dim") or isinstance(cfg.get("linear_attn_config"), Mapping):
        return "kda"
    if any(cfg.has(k) for k in _MAMBA2_HEADS) or (cfg.has("num_heads") and cfg.has("state_size")
                                                    and not cfg.has("num_attention_heads")):
        return "mamba2"
    if any(cfg.has(k) for k in ("mamba_d_state", "state_size", "ssm_state_size", "mamba_expand", "mamba_d_conv")):
        return "mamba1"
    if cfg.has("linear_attn_alpha_factor") or cfg.has("attn_type_list"):
        return "lightning"
    return None


def _first(cfg: ConfigReader, keys: tuple[str, ...], *, cap: str, minimum: int = 1,
           default: Any = None, why: str = "") -> int | None:
    if default is not None and not any(cfg.has(k) for k in keys):
        return default
    return cfg.int_field(keys[0], also=keys[1:], cap=cap, minimum=minimum, why=why)


def _not_a_multiple(cfg: ConfigReader, key: str, value: int, of_key: str, of: int, why: str) -> None:
    """Record that ``key`` (``value``) must be a multiple of ``of_key`` (``of``), with the nearest multiple above."""
    cfg.problem(key, value, f"must be a multiple of {of_key}={of} ({why})",
                f"set {key} to a multiple of {of} such as {-(-value // of) * of}, as in the model's config.json")


def _mamba1(cfg: ConfigReader, opts: Options) -> MambaSpec | None:
    kernel = _first(cfg, ("mamba_d_conv", "conv_kernel"), cap="kernel", minimum=2)
    state = _first(cfg, ("mamba_d_state", "state_size"), cap="dim")
    if cfg.has("mamba_expand") or not cfg.has("intermediate_size"):
        expand = _first(cfg, ("mamba_expand", "expand"), cap="dim")
        hidden = cfg.int_field(HIDDEN_KEYS[0], also=HIDDEN_KEYS[1:], cap="width")
        inner = None if expand is None or hidden is None else expand * hidden
        name = "mamba_expand * hidden_size" if cfg.has("mamba_expand") else "expand * hidden_size"
    else:
        inner, name = cfg.int_field("intermediate_size", cap="width"), "intermediate_size"
    inner = cfg.split(name, inner, opts.tp)
    if None in (kernel, state, inner):
        return None
    assert kernel is not None and state is not None and inner is not None
    split = StateSplit.mamba1(inner=inner, state=state, conv_kernel=kernel, names={"inner": f"config.{name}"})
    return MambaSpec(shapes=split.shapes_per_rank(1), dtypes=(opts.model_dtype, opts.state_dtype()),
                     variant="mamba1", tp_split=split)


def _mamba2(cfg: ConfigReader, opts: Options) -> MambaSpec | None:
    head_key = cfg.first_present(*_MAMBA2_HEADS, "num_heads")
    heads = cfg.int_field(head_key, cap="heads")
    head_dim = _first(cfg, ("mamba_head_dim", "mamba_d_head", "mamba_headdim", "head_dim"), cap="dim")
    state = _first(cfg, ("ssm_state_size", "mamba_d_state", "state_size"), cap="dim")
    groups_key = cfg.first_present("n_groups", "mamba_n_groups", "mamba_ngroups")
    groups = cfg.int_field(groups_key, cap="heads")
    kernel = _first(cfg, ("conv_kernel", "mamba_d_conv"), cap="kernel", minimum=2)
    chunk = _first(cfg, ("chunk_size", "mamba_chunk_size"), cap="width", default=256)
    inner = cfg.optional_int("mamba_d_ssm", cap="width")
    uneven = heads is not None and groups is not None and heads % groups != 0
    if uneven:
        assert heads is not None and groups is not None
        _not_a_multiple(cfg, head_key, heads, groups_key, groups, "the heads of a group share its B and C")
    if inner is None and heads is not None and head_dim is not None:
        inner = heads * head_dim
    heads = cfg.split(head_key, heads, opts.tp)
    groups = cfg.split(groups_key, groups, opts.tp, SplitRule.GROUPS)  # a single group is replicated on every rank
    inner_key = "mamba inner size (heads x head_dim)"
    inner = cfg.split(inner_key, inner, opts.tp)
    if uneven or None in (heads, head_dim, state, groups, kernel, chunk, inner):
        return None
    assert heads is not None and head_dim is not None and state is not None and groups is not None
    assert kernel is not None and chunk is not None and inner is not None
    split = StateSplit.mamba2(heads=heads, head_dim=head_dim, state=state, groups=groups, conv_kernel=kernel,
                              inner=inner, names={"heads": f"config.{head_key}", "groups": f"config.{groups_key}",
                                                  "inner": f"config.{inner_key}"})
    return MambaSpec(shapes=split.shapes_per_rank(1),
                     dtypes=(opts.model_dtype, opts.state_dtype()), variant="mamba2", chunk_size=chunk, tp_split=split)


def _gated_delta(cfg: ConfigReader, opts: Options) -> MambaSpec | None:
    kernel = cfg.int_field("linear_conv_kernel_dim", minimum=2, cap="kernel")
    key_heads = cfg.int_field("linear_num_key_heads", cap="heads")
    value_heads = cfg.int_field("linear_num_value_heads", cap="heads")
    uneven = key_heads is not None and value_heads is not None and value_heads % key_heads != 0
    if uneven:
        assert key_heads is not None and value_heads is not None
        _not_a_multiple(cfg, "linear_num_value_heads", value_heads, "linear_num_key_heads", key_heads,
                        "each key head serves an equal number of value heads")
    key_heads = cfg.split("linear_num_key_heads", key_heads, opts.tp)
    value_heads = cfg.split("linear_num_value_heads", value_heads, opts.tp)
    key_dim = cfg.int_field("linear_key_head_dim", cap="dim")
    value_dim = cfg.int_field("linear_value_head_dim", cap="dim")
    if uneven or None in (kernel, key_heads, value_heads, key_dim, value_dim):
        return None
    assert kernel is not None and key_heads is not None and value_heads is not None
    assert key_dim is not None and value_dim is not None
    split = StateSplit.gated_delta(key_heads=key_heads, value_heads=value_heads, key_dim=key_dim, value_dim=value_dim,
                                   conv_kernel=kernel, names={"key_heads": "config.linear_num_key_heads",
                                                              "value_heads": "config.linear_num_value_heads"})
    checkpoints = opts.state_checkpoint_tokens  # each exported checkpoint keeps a page of its own in align mode
    return MambaSpec(shapes=split.shapes_per_rank(1),
                     dtypes=(opts.model_dtype, opts.state_dtype()), variant="gated_delta",
                     chunk_size=GATED_DELTA_CHUNK_TOKENS, tp_split=split,
                     prefill_checkpoint_pages=0 if checkpoints is None else 1, prefill_checkpoint_alignment=checkpoints)


def _kda(cfg: ConfigReader, opts: Options) -> MambaSpec | None:
    section = cfg.get("linear_attn_config")
    sub = ConfigReader(section) if isinstance(section, Mapping) and not cfg.has("linear_num_heads") else cfg
    prefix = "linear_attn_config." if sub is not cfg else ""
    names = ("num_heads", "head_dim", "short_conv_kernel_size") if sub is not cfg else (
        "linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim")
    heads = sub.int_field(names[0], cap="heads")
    head_dim = sub.int_field(names[1], cap="dim")
    kernel = sub.int_field(names[2], minimum=2, cap="kernel")
    if sub is not cfg:
        for p in sub.check.problems:
            cfg.problem(prefix + p.field.split(".", 1)[1], p.value, p.limit, p.fix)
    heads = cfg.split(prefix + names[0], heads, opts.tp)
    if None in (heads, head_dim, kernel):
        return None
    assert heads is not None and head_dim is not None and kernel is not None
    split = StateSplit.kda(heads=heads, head_dim=head_dim, conv_kernel=kernel, names={"heads": f"config.{prefix}{names[0]}"})
    # vLLM 0.33 kda_state_dtype: the recurrent state is float32 unless a dtype is asked for
    return MambaSpec(shapes=split.shapes_per_rank(1),
                     dtypes=(opts.model_dtype, opts.state_dtype(DType.FLOAT32)), variant="kda",
                     chunk_size=GATED_DELTA_CHUNK_TOKENS, tp_split=split)


def _lightning(cfg: ConfigReader, opts: Options) -> MambaSpec | None:
    heads = cfg.int_field(HEAD_KEYS[0], also=HEAD_KEYS[1:], cap="heads")
    if cfg.has("head_dim"):
        head_dim = cfg.int_field("head_dim", cap="dim")
    else:
        hidden = cfg.int_field(HIDDEN_KEYS[0], also=HIDDEN_KEYS[1:], cap="width")
        head_dim = None if hidden is None or heads is None or hidden % heads else hidden // heads
        if hidden is not None and heads is not None and hidden % heads:
            cfg.problem("head_dim", None, f"is absent and hidden_size={hidden} is not divisible by "
                                          f"num_attention_heads={heads}", "add head_dim to the config")
    head_key = cfg.first_present(*HEAD_KEYS)
    heads = cfg.split(head_key, heads, opts.tp)
    if heads is None or head_dim is None:
        return None
    chunk = _first(cfg, ("block_size",), cap="width", default=256)
    split = StateSplit.lightning(heads=heads, head_dim=head_dim, names={"heads": f"config.{head_key}"})
    return MambaSpec(shapes=split.shapes_per_rank(1), dtypes=(opts.model_dtype,), variant="lightning",
                     chunk_size=chunk or 256, tp_split=split)


_READERS: Mapping[str, Callable[[ConfigReader, Options], MambaSpec | None]] = {
    "mamba1": _mamba1, "mamba2": _mamba2, "gated_delta": _gated_delta, "kda": _kda, "lightning": _lightning}


def read_state(cfg: ConfigReader, opts: Options, layer_types_key: str) -> MambaSpec | None:
    """The recurrent state of ``linear_attention`` / Mamba layers; one line naming the field when
    the config describes none (``layer_types_key`` is the field that asked for a state)."""
    variant = state_variant(cfg)
    if variant is None:
        cfg.fail(layer_types_key, "linear_attention",
                 "names recurrent layers but the config has no state fields graphkv reads (Mamba: "
                 "mamba_d_state / ssm_state_size; Mamba2: mamba_num_heads; gated-delta: linear_num_value_heads; "
                 "KDA: linear_num_heads; lightning: linear_attn_alpha_factor)",
                 "pass the model's whole config.json, or declare the layers with ModelKV.from_specs")
    return _READERS[variant](cfg, opts)


def read_conv_state(cfg: ConfigReader, opts: Options) -> MambaSpec | None:
    """The short-convolution state of LFM2 ``conv`` layers."""
    kernel = cfg.int_field("conv_L_cache", minimum=2, cap="kernel", why="because some layers are short convolutions")
    if cfg.has("conv_dim"):
        dim, name = cfg.int_field("conv_dim", cap="width"), "conv_dim"
    else:
        dim, name = cfg.int_field(HIDDEN_KEYS[0], also=HIDDEN_KEYS[1:], cap="width"), "hidden_size"
    dim = cfg.split(name, dim, opts.tp)
    if kernel is None or dim is None:
        return None
    split = StateSplit.short_conv(channels=dim, conv_kernel=kernel, names={"channels": f"config.{name}"})
    return MambaSpec(shapes=split.shapes_per_rank(1), dtypes=(opts.model_dtype,), variant="short_conv",
                     chunk_size=256, tp_split=split)
