"""A preset's real shapes, served by ``graphkv.hf`` at reduced depth, for measuring graph memory.

Graph memory per capture key depends on what the captured forward allocates: the logits it keeps
(``vocab_size``), its MLP and expert widths, its attention and state mixers. ``graphkv bench
memory`` measures it on a random-weight transformers model built at a preset's shapes with fewer
layers (nothing downloaded), captured through :class:`graphkv.hf.PagedModel`, at two depths
(:func:`depths`); :func:`graphkv.memory.depth_fit.extrapolate` carries the two measurements to the
preset's own depth, linear in the number of layers.

A preset's ``config.json`` fields (``graphkv/presets``) are those the planner reads; the fields a
forward also needs and the planner does not (vocabulary, MLP and expert sizes) are in
:data:`COMPUTE_FIELDS`, each from the public ``config.json`` of the preset's ``_source``
repository. They are kept apart so that adding them cannot change a plan (``intermediate_size``
would, for state layers that read it as their inner width). Presets of families ``graphkv.hf`` does
not run (DeepSeek-V3's MLA, Jamba) have no forward: :func:`served_presets` lists those that do.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Mapping

import attrs

from graphkv.errors import Problem, SpecError

__all__ = ["COMPUTE_FIELDS", "GRAPH_MAX_MODEL_LEN", "PresetForward", "depths", "gathered_expert_bytes", "graph_limits",
           "measured_presets", "preset_forward", "reduced_config", "served_presets"]

COMPUTE_FIELDS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType({
    "llama-3.1-8b": types.MappingProxyType(dict(vocab_size=128256, intermediate_size=14336)),
    "gpt-oss-20b": types.MappingProxyType(dict(vocab_size=201088, intermediate_size=2880, num_local_experts=32,
                                               num_experts_per_tok=4)),
    "gpt-oss-120b": types.MappingProxyType(dict(vocab_size=201088, intermediate_size=2880, num_local_experts=128,
                                                num_experts_per_tok=4)),
    "qwen3-next-80b-a3b": types.MappingProxyType(dict(vocab_size=151936, intermediate_size=5120,
                                                      moe_intermediate_size=512, shared_expert_intermediate_size=512,
                                                      num_experts=512, num_experts_per_tok=10)),
    "nemotron-h-8b": types.MappingProxyType(dict(vocab_size=131072, intermediate_size=21504)),
})
"""Per served preset, the compute fields of its source ``config.json`` the planner does not read."""

_NOT_CONFIG = ("_source", "architectures", "torch_dtype")
GRAPH_MAX_MODEL_LEN = 4096
"""The measured models' ``max_model_len`` at most: graph memory does not depend on it (only the tables'
widths do, and they are static buffers), and 4096 keeps the tables small."""


def graph_limits(limits: Any) -> Any:
    """``limits`` (a preset plan's: its capture keys) with ``max_model_len`` at most
    :data:`GRAPH_MAX_MODEL_LEN` (``'auto'`` becomes it)."""
    asked = limits.max_model_len  # an int, or 'auto' (the preset plan's default)
    return attrs.evolve(limits, max_model_len=min(asked, GRAPH_MAX_MODEL_LEN) if isinstance(asked, int)
                        else GRAPH_MAX_MODEL_LEN)


def served_presets() -> tuple[str, ...]:
    """The presets whose family ``graphkv.hf`` runs (so their graph memory can be measured)."""
    return tuple(sorted(COMPUTE_FIELDS))


def _experts(name: str) -> tuple[int, int] | None:
    """(experts per token, expert MLP width) of a MoE preset; ``None`` for a dense one."""
    fields = COMPUTE_FIELDS[name]
    if "num_local_experts" in fields:  # gpt-oss: experts as wide as intermediate_size
        return int(fields["num_experts_per_tok"]), int(fields["intermediate_size"])
    if "num_experts" in fields:  # qwen3-next
        return int(fields["num_experts_per_tok"]), int(fields["moe_intermediate_size"])
    return None


def gathered_expert_bytes(name: str, num_tokens: int) -> int:
    """The bf16 expert weights transformers' ``batched_mm`` MoE path (graphkv.hf's on a GPU) gathers for
    one MoE layer of a ``num_tokens``-token step: per token and chosen expert, its gate, up and down
    projections (``3 x hidden x width`` weights); 0 for a dense preset.

    >>> round(gathered_expert_bytes("gpt-oss-20b", 8192) / 2**40, 2)  # 4 experts x 3 x 2880 x 2880 x 2 B per token
    1.48
    """
    from graphkv.presets import load_preset_config

    experts = _experts(name)
    if experts is None:
        return 0
    top_k, width = experts
    return num_tokens * top_k * 3 * int(load_preset_config(name)["hidden_size"]) * width * 2


def measured_presets() -> tuple[str, ...]:
    """The served presets whose graph memory ``graphkv bench memory`` measures: the dense ones. A MoE
    preset's steps through graphkv.hf gather every token's expert weights (:func:`gathered_expert_bytes`:
    1.5 TiB for gpt-oss's 8192-token key), more than a GPU holds."""
    return tuple(n for n in served_presets() if _experts(n) is None)


def _pattern_prefix(pattern: str, periods: int) -> str:
    """The Nemotron-H ``hybrid_override_pattern`` through its ``periods``-th attention block (``*``)
    and the MLP block (``-``) after it."""
    end = -1
    for _ in range(periods):
        end = pattern.index("*", end + 1)
    if end + 1 < len(pattern) and pattern[end + 1] == "-":
        end += 1
    return pattern[: end + 1]


def depths(name: str) -> tuple[int, int]:
    """The two reduced depths a preset is measured at: one and two periods of its layer pattern
    (every layer kind present in each), e.g. 1 and 2 layers for Llama, 2 and 4 for gpt-oss (sliding,
    full), 4 and 8 for Qwen3-Next (three gated-delta, one full), 9 and 20 for Nemotron-H-8B (its
    pattern through the first and the second attention block)."""
    from graphkv.presets import load_preset_config

    cfg = load_preset_config(name)
    model_type = cfg.get("model_type")
    if model_type == "gpt_oss":
        return 2, 4
    if model_type == "qwen3_next":
        period = int(cfg.get("full_attention_interval", 4))
        return period, 2 * period
    if model_type == "nemotron_h":
        pattern = str(cfg["hybrid_override_pattern"])
        return len(_pattern_prefix(pattern, 1)), len(_pattern_prefix(pattern, 2))
    return 1, 2


def reduced_config(name: str, num_layers: int, **overrides: Any) -> Any:
    """The transformers config of preset ``name`` with its compute fields, cut to its first
    ``num_layers`` layers (the layer pattern kept), with ``overrides`` (tests shrink the widths).
    Raises :class:`SpecError` for a preset ``graphkv.hf`` does not run or a depth out of range."""
    from transformers import AutoConfig

    from graphkv.presets import load_preset_config

    if name not in COMPUTE_FIELDS:
        raise SpecError(Problem(field="--model", value=name,
                                limit=f"has no graphkv.hf forward (graph memory is measured for {list(served_presets())})",
                                fix="measure one of those presets, or 'demo'"))
    cfg = load_preset_config(name)
    total = int(cfg["num_hidden_layers"])
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= total:
        raise SpecError(Problem(field="num_layers", value=num_layers, limit=f"must be an int in 1..{total} ({name})",
                                fix=f"pick a depth of at most {total}"))
    fields = {k: v for k, v in cfg.items() if k not in _NOT_CONFIG}
    fields.update(COMPUTE_FIELDS[name])
    fields["num_hidden_layers"] = num_layers
    if isinstance(fields.get("layer_types"), list):
        fields["layer_types"] = fields["layer_types"][:num_layers]
    if "hybrid_override_pattern" in fields:
        fields["hybrid_override_pattern"] = fields["hybrid_override_pattern"][:num_layers]
    if fields.get("model_type") == "qwen3_next":
        period = int(fields.get("full_attention_interval", 4))
        fields["layer_types"] = ["full_attention" if (i + 1) % period == 0 else "linear_attention"
                                 for i in range(num_layers)]
    fields.update(eos_token_id=None, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    fields.update(overrides)
    model_type = fields.pop("model_type")
    return AutoConfig.for_model(model_type, **fields)


@attrs.frozen(kw_only=True)
class PresetForward:
    """A reduced-depth random-weight model of a preset, planned for graphkv.hf: the ``plan`` to
    allocate and capture, ``forward_for(pool, step)`` (the :class:`~graphkv.hf.PagedModel` forward
    over that pool), its ``num_layers`` and the model's ``hidden_size``."""

    name: str
    num_layers: int
    plan: Any
    forward_for: Callable[[Any, Any], Any]
    hidden_size: int


def preset_forward(name: str, num_layers: int, device: Any, *, limits: Any, kv_bytes: int,
                   dtype: str = "bfloat16", seed: int = 0, compile: bool | str | None = None,  # noqa: A002
                   graph_pool: Any = None, **overrides: Any) -> PresetForward:
    """Build preset ``name`` at ``num_layers`` layers with random weights on ``device`` in ``dtype``
    (drawn from ``seed``), read its cache layers (:func:`graphkv.hf.declare.model_kv`) and plan it
    for ``limits`` with a pool of ``kv_bytes``. The weights are made on the device directly (a CPU
    copy of a multi-GB model would cost minutes). ``compile``: the :class:`~graphkv.hf.PagedModel`
    compile mode (``"piecewise"`` to capture mixed keys; ``None``: its default). ``graph_pool``: the
    :class:`~graphkv.plan.graph_pool.GraphPoolModel` the plan's ledger estimates graph memory with
    (default: the planner's)."""
    import torch
    from transformers import AutoModelForCausalLM

    from graphkv.hf.declare import flex_q_tile_for, model_kv
    from graphkv.hf.model import PagedModel
    from graphkv.plan.compile import compile_plan
    from graphkv.runtime.ops.choice import resolve_kernels
    from graphkv.spec.budget import Budget

    config = reduced_config(name, num_layers, **overrides)
    torch.manual_seed(seed)
    attn = {"attn_implementation": "eager"} if config.model_type == "gpt_oss" else {}
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), **attn).eval()
    kernels = resolve_kernels("auto", device)
    declared = model_kv(model, flex_q_tile_tokens=flex_q_tile_for(device, kernels))
    plan = compile_plan(attrs.evolve(declared, name=f"{name} ({num_layers} layer{'' if num_layers == 1 else 's'})"),
                        limits, Budget.kv_bytes(kv_bytes), graph_pool=graph_pool)

    def forward_for(pool: Any, step: Any) -> Any:
        return PagedModel(model, pool, logits="last", kernels=kernels, compile=compile).forward

    return PresetForward(name=name, num_layers=num_layers, plan=plan, forward_for=forward_for,
                         hidden_size=int(config.hidden_size))
