"""Derive a :class:`~graphkv.spec.model.ModelKV` from a Hugging Face ``config.json``.

The reader follows what the config says, not its class name (:mod:`graphkv.spec.hf`):

1. the decoder's fields (a multimodal config's ``text_config``) and its family
   (:mod:`~graphkv.spec.hf.source`, :mod:`~graphkv.spec.hf.families`);
2. what every layer is — ``layer_types``, each family's older fields, or the kind of fields the
   config has (:mod:`~graphkv.spec.hf.layout`), and which layers share KV (:mod:`~graphkv.spec.hf.sharing`);
3. each kind's shapes: attention heads and head sizes, per layer when they differ
   (:mod:`~graphkv.spec.hf.attention`), MLA latents and indexer keys (:mod:`~graphkv.spec.hf.mla`),
   recurrent states (:mod:`~graphkv.spec.hf.states`), legacy names (``n_layer``, ``n_head``,
   ``n_embd``, ``multi_query``, ``num_kv_heads``, ``kv_channels``) included.

An unknown ``architectures[0]`` whose fields describe its layers plans like any other, and the
model's notes (copied into the plan) say which reader was used. A config whose layers cannot be
understood is refused with one line naming the field.

Dtypes: the attention / MLA cache uses ``kv_cache_dtype``, else the config's ``torch_dtype`` (or
``dtype``), default bfloat16. Conv states use the config dtype; ssm / recurrent states use
``mamba_ssm_dtype``, else the config's ``mamba_ssm_cache_dtype`` (or Qwen3.5's
``mamba_ssm_dtype``), else the family's default (Nemotron-H: float32, as vLLM), else the
variant's (KDA: float32), else the config dtype (``"auto"`` means "not set" everywhere, as in vLLM).

Backends: those vLLM 0.33 picks on the GPU named by ``gpu`` (an H100's, sm_90, when none is named): attention
``flash_attn`` where FlashAttention runs the layer, else ``flashinfer``, ``triton_paged`` or ``flex``
(:mod:`graphkv.spec.hf.gpu_attention`), MLA ``flash_attn_mla`` on sm_90 (``flashmla`` for fp8 caches and indexed MLA,
``triton_mla`` for float32) and ``triton_mla`` on sm_80 / sm_89 (:mod:`graphkv.spec.hf.gpu_backends`), indexer keys
``indexer``, Mamba1/Mamba2 ``mamba``, gated-delta ``gdn``, KDA ``kda``, lightning ``lightning``, short conv
``short_conv``.
``attention_backend`` replaces the backend of every non-MLA attention layer (or, when it names
an MLA backend such as ``triton_mla``, of every MLA layer).

Example::

    with open("config.json") as f:
        model = model_from_hf_config(json.load(f), kv_cache_dtype="fp8")  # every head
    rank = model.shard(2, 1)  # what tensor-parallel rank 1 of 2 caches
    rank.layers[0].spec.page_size_bytes(16)  # bytes of one 16-token page of layer 0 on that rank
"""

from __future__ import annotations

from typing import Any, Mapping

from graphkv.errors import SpecError
from graphkv.spec.backends import BUILTIN_BACKENDS, get_backend
from graphkv.spec.budget import GPU
from graphkv.spec._checks import as_int
from graphkv.spec.dtypes import DType, parse_cache_dtype, parse_dtype
from graphkv.spec.hf._reader import ConfigReader, Options
from graphkv.spec.hf.build import build_layers, probe_layers
from graphkv.spec.hf.families import FAMILIES, Family
from graphkv.spec.hf.gpu_backends import exports_gdn_checkpoints, resolve_gpu_arch
from graphkv.spec.hf.layout import Role, read_layout
from graphkv.spec.hf.sharing import kv_sources
from graphkv.spec.hf.positions import read_position_cap
from graphkv.spec.hf.source import ConfigSource, resolve_source
from graphkv.spec.model import LayerDecl, ModelKV

__all__ = ["SUPPORTED_FAMILIES", "model_from_hf_config"]

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(f.model_type for f in FAMILIES)
"""The ``model_type`` of every family graphkv lists (``graphkv models``); others plan by their fields."""

_DEFAULT_DTYPE = DType.BFLOAT16
_ATTENTION_BACKEND = "auto"  # vLLM's pick on the planned GPU (graphkv.spec.hf.gpu_attention.attention_backend)
_MLA_BACKEND = "auto"
"""MLA layers' backend unless named: vLLM 0.33's pick on the planned GPU for the cache's dtype
(:func:`graphkv.spec.hf.gpu_backends.default_mla_backend`)."""
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")


def model_from_hf_config(config: Mapping[str, Any], *, tp: int = 1, kv_cache_dtype: str | None = None,
                         mamba_ssm_dtype: str | None = None, attention_backend: str | None = None,
                         name: str | None = None, gpu: "GPU | str | None" = None) -> ModelKV:
    """What tensor-parallel rank 0 of ``tp`` caches for the model ``config`` describes.

    ``config`` is the parsed ``config.json`` (a ``PretrainedConfig`` is accepted through its
    ``to_dict()``); ``tp`` the tensor-parallel size. The reader builds the whole model (every
    head; state specs carry their :class:`~graphkv.spec.layers.StateSplit`), checks that ``tp``
    splits every head count, and returns ``model.shard(tp, 0)`` — with ``tp=1``, the whole model,
    which :meth:`ModelKV.shard` splits for any rank. ``gpu`` (a :class:`~graphkv.spec.budget.GPU`, a known GPU's
    name such as ``"A100-80GB"``, or an architecture such as ``"sm_89"``) picks the backends vLLM 0.33 runs there
    (:mod:`graphkv.spec.hf.gpu_backends`); unset, an H100's (sm_90). The result records ``tensor_parallel_size=tp``,
    ``max_position_embeddings``, ``hidden_size`` and a note saying how the config was read and for which GPU's
    backends, and is named ``name``, else the config's ``_name_or_path``, else its ``model_type``. Cache entries are
    ``layers``; MLP and KV-shared layers are declared in ``cacheless``.

    Raises :class:`SpecError` listing every problem found (missing or mistyped field, a count
    beyond its plausibility cap, heads ``tp`` cannot split, a bad override); a config whose layers
    cannot be understood gives one problem naming the field. Pure and torch-free.
    """
    source = resolve_source(config)
    cfg = ConfigReader(source.fields)
    family = source.family
    cfg.label = family.model_type if family else (source.model_type or source.architecture or "this")
    opts = _resolve_options(cfg, family, tp=tp, kv_cache_dtype=kv_cache_dtype, mamba_ssm_dtype=mamba_ssm_dtype,
                            attention_backend=attention_backend, gpu=gpu)
    model_name = _model_name(cfg, source, name)
    hidden_size = cfg.optional_int(_HIDDEN_KEYS[0], also=_HIDDEN_KEYS[1:], cap="width")
    positions = read_position_cap(cfg, family.model_type if family else str(source.model_type or ""))
    layout = read_layout(cfg, family)
    if layout is None:  # no layer count: collect the problems the default layers would have, then raise
        probe_layers(cfg, opts)
        cfg.raise_if_any()
    assert layout is not None
    shared = kv_sources(cfg, layout.roles)
    layers, cacheless = build_layers(cfg, opts, layout, family, shared)
    if (not layers and not cfg.check.problems and layout.field is not None
            and all(role in (Role.MLP, Role.MOE) for role in layout.roles)):
        # named here, in the config's terms (only a per-layer list or pattern declares MLP layers): ModelKV would
        # say "layers=()"
        key = layout.field
        kinds = sorted({role.name.lower() for role in layout.roles})
        cfg.problem(key, f"{len(layout.roles)} layers: {', '.join(kinds)}",
                    "declares no attention or state layer, so the model holds no KV cache to plan (read from "
                    f"{layout.source})",
                    f"check {key}: a decoder has at least one attention or state layer (copy it from the model's "
                    "config.json)")
    if attention_backend is not None:
        _check_backend_used(cfg, attention_backend, layers)
    cfg.raise_if_any()
    note = (f"config reader: {source.describe()}; layer kinds from {layout.source}; backends as vLLM 0.33 picks them "
            f"on {opts.gpu_arch}" + ("" if opts.gpu is not None else " (assumed: no GPU named)"))
    if shared:
        note += f"; the last {len(shared)} layers read earlier layers' KV (num_kv_shared_layers)"
    if positions.note is not None:
        note += f"; {positions.note}"
    model = ModelKV(name=model_name, layers=layers, cacheless=cacheless, max_position_embeddings=positions.value,
                    hidden_size=hidden_size, notes=(note,), gpu_arch=opts.gpu_arch if opts.gpu is not None else None)
    return model.shard(opts.tp, 0)  # every split was checked above, naming config fields


def _dtype(cfg: ConfigReader, value: Any, field: str, fallback: DType | None, *, cache: bool = False) -> DType | None:
    """``value`` parsed (``None`` / ``"auto"``: ``fallback``); a bad name (with ``cache``, an integer
    type too: :func:`parse_cache_dtype`) records a problem."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return fallback
    try:
        return parse_cache_dtype(value, field=field) if cache else parse_dtype(value, field=field)
    except SpecError as err:
        cfg.check.problems.extend(err.problems)
        return fallback


def _resolve_options(cfg: ConfigReader, family: Family | None, *, tp: Any, kv_cache_dtype: Any,
                     mamba_ssm_dtype: Any, attention_backend: Any, gpu: Any) -> Options:
    """The overrides resolved; a bad one records a problem and falls back to its default, so the
    config's own problems are still collected and reported with it."""
    tp = as_int(tp)  # a numpy int as a Python int
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        cfg.argument_problem("tp", tp, "must be an integer >= 1", "pass the tensor-parallel size, e.g. tp=2")
        tp = 1
    # transformers reads ``dtype`` first (``torch_dtype`` is its older name), as vLLM does through it; an
    # integer type is no dtype to keep keys and values in (the cache follows the model's dtype)
    dtype_key = cfg.first_present("dtype", "torch_dtype")
    model_dtype = _dtype(cfg, cfg.get(dtype_key), f"config.{dtype_key}", _DEFAULT_DTYPE, cache=True)
    assert model_dtype is not None
    attention_dtype = _dtype(cfg, kv_cache_dtype, "kv_cache_dtype", model_dtype, cache=True)
    assert attention_dtype is not None
    ssm_key = cfg.first_present("mamba_ssm_cache_dtype", "mamba_ssm_dtype")
    family_ssm = parse_dtype(family.state_dtype) if family is not None and family.state_dtype else None
    config_ssm = _dtype(cfg, cfg.get(ssm_key), f"config.{ssm_key}", family_ssm)
    ssm_dtype = _dtype(cfg, mamba_ssm_dtype, "mamba_ssm_dtype", config_ssm, cache=True)
    backends = {"attention_backend": _ATTENTION_BACKEND, "mla_backend": _MLA_BACKEND}
    if attention_backend is not None:
        attention_names = sorted(n for n, b in BUILTIN_BACKENDS.items() if not b.is_ssm)
        try:
            backend = get_backend(attention_backend)
        except SpecError:
            backend = None
        if backend is None or backend.is_ssm or backend.name == "indexer":
            cfg.argument_problem("attention_backend", attention_backend,
                                 f"must name an attention backend, one of {attention_names}",
                                 "pick one of those, or leave attention_backend unset for the defaults")
        else:
            backends["mla_backend" if backend.is_mla else "attention_backend"] = backend.name
    arch = resolve_gpu_arch(cfg, gpu)
    checkpoints = family.state_checkpoint_tokens if family is not None and exports_gdn_checkpoints(arch) else None
    return Options(tp=tp, model_dtype=model_dtype, attention_dtype=attention_dtype, ssm_dtype=ssm_dtype, **backends,
                   state_checkpoint_tokens=checkpoints, gpu_arch=arch, gpu=gpu)


def _check_backend_used(cfg: ConfigReader, attention_backend: Any, layers: list[LayerDecl]) -> None:
    backend = get_backend(attention_backend)
    if any(layer.backend.name == backend.name for layer in layers):
        return
    kinds = sorted({layer.spec.kind.value for layer in layers})
    wanted = sorted(n for n, b in BUILTIN_BACKENDS.items() if not b.is_ssm and b.is_mla != backend.is_mla)
    cfg.argument_problem("attention_backend", attention_backend,
                         f"is {'an MLA' if backend.is_mla else 'a non-MLA'} backend but this model's layers are "
                         f"{kinds}, so it would apply to none of them",
                         f"use one of {wanted}, or leave attention_backend unset")


def _model_name(cfg: ConfigReader, source: ConfigSource, name: Any) -> str:
    if name is not None:
        if isinstance(name, str) and name:
            return name
        cfg.argument_problem("name", name, "must be a non-empty string", "pass a model name or leave it unset")
    path = cfg.get("_name_or_path")
    if isinstance(path, str) and path:
        return path
    return source.model_type or source.architecture or "model"
