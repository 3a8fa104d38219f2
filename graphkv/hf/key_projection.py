"""The projection that computes an attention module's keys, read so that set-up can check the plan's KV shape.

A plan caches ``num_kv_heads x head_size`` features per token, read from ``model.config``; the module computes its
keys with its own weights. Most families project keys with a ``k_proj`` linear sized from ``num_key_value_heads`` and
``head_dim``; GPT-2, GPT-NeoX, Persimmon and GPT-BigCode with a fused q/k/v projection (``c_attn``,
``query_key_value``), CTRL with ``Wk``. The multi-head families (those, and OPT) size them from ``hidden_size /
num_attention_heads`` (GPT-BigCode: one head with ``multi_query``), so that a ``head_dim`` or ``num_key_value_heads``
in their config changes the plan and not the model (:attr:`graphkv.hf.support.FamilySupport.heads_from_hidden`).
"""

from __future__ import annotations

import attrs
import torch

__all__ = ["KeyProjection", "key_projection"]


@attrs.frozen(kw_only=True)
class KeyProjection:
    """How an attention module projects its keys: ``field`` (e.g. ``"query_key_value.out_features"``) and its
    ``value``; ``num_key_features`` of them are keys per token; ``head_size``: the head size the module views its
    keys with (its ``head_dim`` / ``head_size``; ``None`` where it names none)."""

    field: str
    value: int
    num_key_features: int
    head_size: int | None


def key_projection(attention: torch.nn.Module) -> KeyProjection | None:
    """The :class:`KeyProjection` of ``attention`` (a transformers attention module), ``None`` where it has none
    graphkv knows (a KV-shared layer, a projection of another kind)."""
    head = next((v for v in (getattr(attention, "head_dim", None), getattr(attention, "head_size", None))
                 if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
    for name in ("k_proj", "Wk"):  # CTRL: Wk
        linear = getattr(attention, name, None)
        if isinstance(linear, torch.nn.Linear):
            return KeyProjection(field=f"{name}.out_features", value=linear.out_features,
                                 num_key_features=linear.out_features, head_size=head)
    fused = getattr(attention, "query_key_value", None)  # GPT-NeoX, Persimmon: q, k and v of one width
    if isinstance(fused, torch.nn.Linear) and fused.out_features % 3 == 0:
        return KeyProjection(field="query_key_value.out_features", value=fused.out_features,
                             num_key_features=fused.out_features // 3, head_size=head)
    fused, queries = getattr(attention, "c_attn", None), getattr(attention, "embed_dim", None)
    # GPT-2 (a Conv1D of nf outputs), GPT-BigCode (a Linear): queries of embed_dim, then keys and values of one width
    name = "out_features" if isinstance(fused, torch.nn.Linear) else "nf"
    width = getattr(fused, name, None)
    if isinstance(width, int) and isinstance(queries, int) and width > queries and (width - queries) % 2 == 0:
        return KeyProjection(field=f"c_attn.{name}", value=width, num_key_features=(width - queries) // 2,
                             head_size=head)
    return None

