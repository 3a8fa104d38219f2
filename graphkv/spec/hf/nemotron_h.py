"""Nemotron-H: a ``hybrid_override_pattern`` string, one letter per layer of the stack.

``M`` Mamba2, ``*`` attention, ``-`` MLP and ``E`` MoE (neither caches anything, so they are
skipped; the kept layers keep their position in the stack as ``index`` and ``layers.{i}``).
Per rank, a Mamba2 layer keeps:

- conv state ``(conv_kernel - 1, conv_dim / tp)`` with ``conv_dim = mamba_num_heads *
  mamba_head_dim + 2 * n_groups * ssm_state_size`` (x, B and C channels);
- ssm state ``(mamba_num_heads / tp, mamba_head_dim, ssm_state_size)``.

``n_groups`` must divide by ``tp``, except a single group, which every rank replicates (as
vLLM does), giving ``conv_dim / tp = mamba_num_heads * mamba_head_dim / tp + 2 * ssm_state_size``.
Attention head size: ``head_dim``, else ``attention_head_dim``, else ``hidden_size / heads``.
"""

from __future__ import annotations

from graphkv.spec.hf._common import attention_shape, attention_spec, decl
from graphkv.spec.hf._reader import ConfigReader, Options
from graphkv.spec.layers import MambaSpec
from graphkv.spec.model import LayerDecl

__all__ = ["PATTERN_LETTERS", "build"]

PATTERN_LETTERS = {"M": "Mamba2", "*": "attention", "-": "MLP", "E": "MoE"}
_DEFAULT_CHUNK_TOKENS = 256


def _pattern(cfg: ConfigReader, num_layers: int | None) -> str | None:
    key = "hybrid_override_pattern"
    pattern = cfg.get(key, None)
    if not isinstance(pattern, str) or not pattern:
        limit = "is required" if pattern is None else "must be a non-empty string"
        cfg.problem(key, pattern, f"{limit}: one letter per layer from {PATTERN_LETTERS}",
                    f"copy {key} from the model's config.json")
        return None
    unknown = [f"{letter!r} at {i}" for i, letter in enumerate(pattern) if letter not in PATTERN_LETTERS]
    if unknown:
        cfg.problem(key, pattern,
                    f"has {len(unknown)} unknown letters ({', '.join(unknown[:8])}); allowed: {PATTERN_LETTERS}",
                    f"use only {''.join(PATTERN_LETTERS)} in {key}")
        return None
    if num_layers is not None and len(pattern) != num_layers:
        cfg.problem(key, pattern, f"has {len(pattern)} letters but num_hidden_layers={num_layers}",
                    f"make {key} one letter per layer")
        return None
    return pattern


def mamba2_state(cfg: ConfigReader, opts: Options) -> MambaSpec | None:
    """The per-rank Mamba2 conv and ssm states (``None`` after recording a problem)."""
    heads = cfg.shard("mamba_num_heads", cfg.int_field("mamba_num_heads"), opts.tp)
    head_dim = cfg.int_field("mamba_head_dim")
    state_size = cfg.int_field("ssm_state_size")
    groups_key = cfg.first_present("n_groups", "mamba_n_groups")
    groups = cfg.int_field(groups_key)
    groups = 1 if groups == 1 else cfg.shard(groups_key, groups, opts.tp)  # one group: replicated
    kernel = cfg.int_field(cfg.first_present("conv_kernel", "mamba_d_conv"), minimum=2)
    chunk = cfg.int_field(cfg.first_present("chunk_size", "mamba_chunk_size"), default=_DEFAULT_CHUNK_TOKENS)
    if None in (heads, head_dim, state_size, groups, kernel, chunk):
        return None
    assert heads is not None and head_dim is not None and state_size is not None
    assert groups is not None and kernel is not None and chunk is not None
    conv_dim = heads * head_dim + 2 * groups * state_size  # per rank
    return MambaSpec(shapes=((kernel - 1, conv_dim), (heads, head_dim, state_size)),
                     dtypes=(opts.model_dtype, opts.ssm_dtype), variant="mamba2", chunk_size=chunk)


def build(cfg: ConfigReader, opts: Options, num_layers: int | None) -> list[LayerDecl]:
    """Mamba2 layers on ``mamba`` and attention layers where the pattern says; others skipped."""
    pattern = _pattern(cfg, num_layers)
    kv_heads = head_size = state = None
    if pattern is None or "*" in pattern:
        kv_heads, head_size = attention_shape(cfg, opts, ("head_dim", "attention_head_dim"))
    if pattern is None or "M" in pattern:
        state = mamba2_state(cfg, opts)
    cfg.raise_if_any()
    assert pattern is not None
    layers = []
    for i, letter in enumerate(pattern):
        if letter == "*":
            assert kv_heads is not None and head_size is not None
            layers.append(decl(i, attention_spec(opts, kv_heads, head_size), opts.attention_backend))
        elif letter == "M":
            assert state is not None
            layers.append(decl(i, state, "mamba"))
    return layers
