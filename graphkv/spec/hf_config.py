"""Derive a :class:`~graphkv.spec.model.ModelKV` from a Hugging Face ``config.json``.

Supported architectures (``architectures[0]``, else ``model_type``), each read by one module of
:mod:`graphkv.spec.hf`:

- Llama-style full / sliding-window attention: Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3,
  Qwen3-MoE (:mod:`~graphkv.spec.hf.llama`);
- Qwen3-Next: gated-delta + full attention (:mod:`~graphkv.spec.hf.qwen3_next`);
- Nemotron-H: Mamba2 + attention by ``hybrid_override_pattern`` (:mod:`~graphkv.spec.hf.nemotron_h`);
- Jamba: Mamba1 + attention (:mod:`~graphkv.spec.hf.jamba`);
- gpt-oss: sliding-window + full attention (:mod:`~graphkv.spec.hf.gpt_oss`);
- DeepSeek-V2 / V3: MLA (:mod:`~graphkv.spec.hf.deepseek`).

Dtypes: the attention / MLA cache uses ``kv_cache_dtype``, else the config's ``torch_dtype`` (or
``dtype``), default bfloat16. Mamba conv states use the config dtype; ssm / recurrent states use
``mamba_ssm_dtype``, else the config's ``mamba_ssm_cache_dtype``, else the config dtype (``"auto"``
means "the config dtype" everywhere, as in vLLM).

Backends: attention layers ``flash_attn``, MLA layers ``flashmla``, Mamba1/Mamba2 ``mamba``,
gated-delta ``gdn``. ``attention_backend`` replaces the backend of every non-MLA attention layer
(or, when it names an MLA backend such as ``triton_mla``, of every MLA layer).

Example::

    with open("config.json") as f:
        model = model_from_hf_config(json.load(f), tp=2, kv_cache_dtype="fp8")
    model.layers[0].spec.page_size_bytes(16)  # bytes of one 16-token page of layer 0 on one rank
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from graphkv.errors import Problem, SpecError
from graphkv.spec.backends import BUILTIN_BACKENDS, get_backend
from graphkv.spec.dtypes import DType, parse_dtype
from graphkv.spec.hf import deepseek, gpt_oss, jamba, llama, nemotron_h, qwen3_next
from graphkv.spec.hf._reader import MISSING, ConfigReader, Options
from graphkv.spec.model import LayerDecl, ModelKV

__all__ = ["SUPPORTED_ARCHITECTURES", "model_from_hf_config"]

Build = Callable[[ConfigReader, Options, "int | None"], "list[LayerDecl]"]

_BY_ARCHITECTURE: Mapping[str, Build] = {
    "LlamaForCausalLM": llama.build,
    "MistralForCausalLM": llama.build,
    "MixtralForCausalLM": llama.build,
    "Qwen2ForCausalLM": llama.build,
    "Qwen2MoeForCausalLM": llama.build,
    "Qwen3ForCausalLM": llama.build,
    "Qwen3MoeForCausalLM": llama.build,
    "Qwen3NextForCausalLM": qwen3_next.build,
    "NemotronHForCausalLM": nemotron_h.build,
    "JambaForCausalLM": jamba.build,
    "GptOssForCausalLM": gpt_oss.build,
    "DeepseekV2ForCausalLM": deepseek.build,
    "DeepseekV3ForCausalLM": deepseek.build,
}
_BY_MODEL_TYPE: Mapping[str, Build] = {
    "llama": llama.build, "mistral": llama.build, "mixtral": llama.build, "qwen2": llama.build,
    "qwen2_moe": llama.build, "qwen3": llama.build, "qwen3_moe": llama.build, "qwen3_next": qwen3_next.build,
    "nemotron_h": nemotron_h.build, "jamba": jamba.build, "gpt_oss": gpt_oss.build,
    "deepseek_v2": deepseek.build, "deepseek_v3": deepseek.build,
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(sorted(_BY_ARCHITECTURE))

_DEFAULT_DTYPE = DType.BFLOAT16
_ATTENTION_BACKEND = "flash_attn"
_MLA_BACKEND = "flashmla"


def model_from_hf_config(config: Mapping[str, Any], *, tp: int = 1, kv_cache_dtype: str | None = None,
                         mamba_ssm_dtype: str | None = None, attention_backend: str | None = None,
                         name: str | None = None) -> ModelKV:
    """What one tensor-parallel rank caches for the model ``config`` describes.

    ``config`` is the parsed ``config.json`` (a ``PretrainedConfig`` is accepted through its
    ``to_dict()``); ``tp`` the tensor-parallel size the per-rank shapes are split for. The
    result records ``tensor_parallel_size=tp``, ``max_position_embeddings`` and ``hidden_size``,
    and is named ``name``, else the config's ``_name_or_path``, else its ``model_type``. Only
    cache-holding layers are declared; each keeps its position in the stack (``layers.{i}``).

    Raises :class:`SpecError` listing every problem found (missing or mistyped field, unknown
    architecture, a head count ``tp`` cannot split, a bad override). Pure and torch-free.
    """
    cfg = ConfigReader(_as_mapping(config))
    build = _pick_architecture(cfg)
    opts = _resolve_options(cfg, tp=tp, kv_cache_dtype=kv_cache_dtype, mamba_ssm_dtype=mamba_ssm_dtype,
                            attention_backend=attention_backend)
    num_layers = cfg.int_field("num_hidden_layers")
    hidden_size = cfg.optional_int("hidden_size")
    max_position_embeddings = cfg.optional_int("max_position_embeddings")
    model_name = _model_name(cfg, name)
    if build is None:
        cfg.raise_if_any()
    assert build is not None
    layers = build(cfg, opts, num_layers)  # raises every problem recorded before building specs
    if attention_backend is not None:
        _check_backend_used(cfg, attention_backend, layers)
    cfg.raise_if_any()
    return ModelKV(name=model_name, layers=layers, max_position_embeddings=max_position_embeddings,
                   tensor_parallel_size=opts.tp, hidden_size=hidden_size)


def _as_mapping(config: Any) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        as_dict = to_dict()
        if isinstance(as_dict, Mapping):
            return as_dict
    raise SpecError(Problem(field="config", value=type(config).__name__,
                            limit="must be a mapping: the parsed config.json (or a PretrainedConfig)",
                            fix="pass json.load(open('config.json')) or AutoConfig.from_pretrained(...)"))


def _pick_architecture(cfg: ConfigReader) -> Build | None:
    architectures = cfg.get("architectures")
    model_type = cfg.get("model_type")
    architecture = None
    if architectures is not None:
        if (not isinstance(architectures, (list, tuple)) or not architectures
                or not all(isinstance(a, str) for a in architectures)):
            cfg.problem("architectures", architectures, "must be a non-empty list of class names",
                        "set architectures like ['LlamaForCausalLM'] as in the model's config.json")
        else:
            architecture = architectures[0]
    if model_type is not None and not isinstance(model_type, str):
        cfg.problem("model_type", model_type, "must be a string", "set model_type like 'llama'")
        model_type = None
    if architecture in _BY_ARCHITECTURE:
        cfg.label = architecture
        return _BY_ARCHITECTURE[architecture]
    if model_type in _BY_MODEL_TYPE:
        cfg.label = model_type
        return _BY_MODEL_TYPE[model_type]
    if architecture is not None or model_type is not None:
        cfg.problem("architectures", architectures if architectures is not None else MISSING,
                    f"names no supported architecture (model_type={model_type!r}); supported: "
                    f"{list(SUPPORTED_ARCHITECTURES)}",
                    "use a config of a supported model, or declare the layers with ModelKV.from_specs")
    elif architectures is None:
        cfg.problem("architectures", MISSING, "is required (or model_type) to pick the architecture",
                    "pass the whole config.json, which names architectures and model_type")
    return None


def _dtype(cfg: ConfigReader, value: Any, field: str, fallback: DType) -> DType:
    """``value`` parsed (``None`` / ``"auto"``: ``fallback``); a bad name records a problem."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return fallback
    try:
        return parse_dtype(value, field=field)
    except SpecError as err:
        cfg.check.problems.extend(err.problems)
        return fallback


def _resolve_options(cfg: ConfigReader, *, tp: Any, kv_cache_dtype: Any, mamba_ssm_dtype: Any,
                     attention_backend: Any) -> Options:
    """The overrides resolved; a bad one records a problem and falls back to its default, so the
    config's own problems are still collected and reported with it."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        cfg.argument_problem("tp", tp, "must be an integer >= 1", "pass the tensor-parallel size, e.g. tp=2")
        tp = 1
    dtype_key = cfg.first_present("torch_dtype", "dtype")
    model_dtype = _dtype(cfg, cfg.get(dtype_key), f"config.{dtype_key}", _DEFAULT_DTYPE)
    attention_dtype = _dtype(cfg, kv_cache_dtype, "kv_cache_dtype", model_dtype)
    config_ssm = _dtype(cfg, cfg.get("mamba_ssm_cache_dtype"), "config.mamba_ssm_cache_dtype", model_dtype)
    ssm_dtype = _dtype(cfg, mamba_ssm_dtype, "mamba_ssm_dtype", config_ssm)
    backends = {"attention_backend": _ATTENTION_BACKEND, "mla_backend": _MLA_BACKEND}
    if attention_backend is not None:
        attention_names = sorted(n for n, b in BUILTIN_BACKENDS.items() if not b.is_ssm)
        try:
            backend = get_backend(attention_backend)
        except SpecError:
            backend = None
        if backend is None or backend.is_ssm:
            cfg.argument_problem("attention_backend", attention_backend,
                                 f"must name an attention backend, one of {attention_names}",
                                 "pick one of those, or leave attention_backend unset for the defaults")
        else:
            backends["mla_backend" if backend.is_mla else "attention_backend"] = backend.name
    return Options(tp=tp, model_dtype=model_dtype, attention_dtype=attention_dtype, ssm_dtype=ssm_dtype,
                   **backends)


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


def _model_name(cfg: ConfigReader, name: Any) -> str:
    if name is not None:
        if isinstance(name, str) and name:
            return name
        cfg.argument_problem("name", name, "must be a non-empty string", "pass a model name or leave it unset")
    for key in ("_name_or_path", "model_type"):
        value = cfg.get(key)
        if isinstance(value, str) and value:
            return value
    architectures = cfg.get("architectures")
    if isinstance(architectures, (list, tuple)) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    return "model"
