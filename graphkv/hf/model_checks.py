"""The set-up checks of a :class:`~graphkv.hf.model.PagedModel`: what it refuses, or warns of, before a first step.

Each names the field (a module's attribute, a constructor option), the value, what graphkv computes or needs, and
the fix; run once per model (or per attention module) at set-up, never per step.
"""

from __future__ import annotations

from typing import Any

import torch

from graphkv.errors import PlanError, Problem, SpecError
from graphkv.hf.key_projection import key_projection
from graphkv.hf.support import FamilySupport
from graphkv.runtime.ops.choice import gpu_path

__all__ = ["DECODE_ATTENTION", "check_attention", "check_split_option", "decode_attention_choice",
           "step_dependent_rope"]

DECODE_ATTENTION = ("kernel", "flex")


def check_attention(decl: Any, module: torch.nn.Module, family: FamilySupport) -> None:
    """Refuse an attention module graphkv's causal block masks would get wrong."""
    if not getattr(module, "is_causal", True):
        raise SpecError(Problem(field=f"{type(module).__name__} ({decl.name}).is_causal", value=False,
                                limit="graphkv.hf runs causal (decoder) attention; this layer attends both ways "
                                      "(e.g. config.use_bidirectional_attention=True)",
                                fix="use the model as a decoder, or run it with transformers directly"))
    planned = getattr(decl.spec, "window", None)
    own = family.sliding_window(module)
    if planned != own:
        raise PlanError(Problem(field=f"plan layer {decl.name}.window", value=planned,
                                limit=f"the model's {type(module).__name__} slides over {own} tokens",
                                fix="plan from graphkv.hf.model_kv(model) of this same model"))
    projection, spec = key_projection(module), decl.spec
    heads, head_size = getattr(spec, "num_kv_heads", None), getattr(spec, "head_size", None)
    if projection is None or not heads or not head_size:
        return
    # the first step would fail on the key's shape, far from the cause
    field, planned = f"{type(module).__name__} ({decl.name}).{projection.field}", heads * head_size
    own_head = projection.head_size if family.heads_from_hidden else None  # the head size the family ignores
    if projection.num_key_features != planned or (own_head is not None and own_head != head_size):
        caches = (f"the plan caches {heads} KV heads x head size {head_size} = {planned} per token (read from "
                  "model.config)")
        if own_head is None or projection.num_key_features % own_head:
            raise PlanError(Problem(field=field, value=projection.value,
                                    limit=f"{caches}, the weights project keys to {projection.num_key_features}",
                                    fix="model.config disagrees with the weights (num_key_value_heads, head_dim): "
                                        "load the model with the config it was saved with"))
        own_heads = projection.num_key_features // own_head
        config = ", ".join(f"{key}={getattr(module.config, key, None)}"
                           for key in ("head_dim", "num_key_value_heads"))
        raise PlanError(Problem(
            field=field, value=projection.value,
            limit=f"{caches}, the weights project keys of {own_heads} heads x head size {own_head}: "
                  f"{family.model_type} sizes them from hidden_size / num_attention_heads and ignores the "
                  f"config's {config}",
            fix=f"set model.config.head_dim={own_head} and model.config.num_key_value_heads={own_heads} (what the "
                "weights compute), then plan from graphkv.hf.model_kv(model)"))


def step_dependent_rope(model: torch.nn.Module) -> str | None:
    """The rope type of ``model``'s rotary embedding where transformers chooses its frequencies per forward call
    from the longest position in it (``dynamic`` NTK scaling, ``longrope``), else ``None``."""
    for module in model.modules():
        rope_type = getattr(module, "rope_type", None)
        if isinstance(rope_type, str) and ("dynamic" in rope_type or rope_type == "longrope"):
            return rope_type
    return None


def check_split_option(field: str, value: object, compile: object, *, does: str, why: str) -> None:  # noqa: A002
    """Refuse an option of the split forward (``merge_projections``, ``small_matmul``) that is not a bool, or is on
    under a compile mode that does not trace and split the forward; ``does`` says what True does, ``why`` why it
    needs the split."""
    if not isinstance(value, bool):
        raise SpecError(Problem(field=field, value=repr(value), limit="must be a bool", fix=f"{does}, else False"))
    if value and compile not in ("piecewise", "fused"):
        raise SpecError(Problem(field=field, value=True,
                                limit=f"needs the forward traced and split (compile='piecewise' or 'fused'), not "
                                      f"compile={compile!r}{why}",
                                fix=f"pass compile='fused' (or 'piecewise'), or {field}=False"))


def decode_attention_choice(choice: str | None, kernels: str, device: torch.device) -> str:
    """The decode attention to use: ``choice``, or by default graphkv's paged decode kernel on the
    GPU path (CUDA, or ``kernels="triton"`` in Triton's interpreter) and flex elsewhere."""
    if choice is None:
        return "kernel" if gpu_path(kernels, device) else "flex"
    if choice not in DECODE_ATTENTION:
        raise SpecError(Problem(field="decode_attention", value=choice,
                                limit=f"must be one of {', '.join(DECODE_ATTENTION)} or None",
                                fix="'kernel' for graphkv's split-KV paged decode kernel, 'flex' for flex "
                                    "attention, None to pick the kernel on the GPU path"))
    return choice
