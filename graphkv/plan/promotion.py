"""Sliding-window and chunked-local layers allocated as full attention (vLLM 0.33's promotion).

vLLM 0.33 promotes local-attention layers to full-attention *allocation* in two places of its
grouping (``get_kv_cache_groups``), and graphkv follows both, in the same order:

1. **On purpose** (``--disable-hybrid-kv-cache-manager``, :attr:`Limits.disable_hybrid_kv_cache_manager`),
   before any grouping (``unify_hybrid_kv_cache_specs``): if the layers are not already of one
   type and some layer keeps every token (full attention or MLA), every sliding-window and
   chunked-local layer is promoted. If they are then still not of one type (two windows and no
   full layer, or a recurrent state: hybrid SSM models need vLLM's hybrid manager) vLLM refuses to
   start, and so does graphkv.
   vLLM 0.33 also turns the hybrid manager off by itself for a model with chunked-local
   attention (its latency regression; ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1``
   keeps it on): ``None``, the default, does the same.
2. **As a fallback** (``_try_get_full_allocation_fallback_groups``), only after the page sizes
   failed to unify: an MLA page (never padded) does not divide the largest page. If the model has
   MLA and sliding-window layers, no chunked-local layer, and after promotion every layer keeps
   every token, all layers form one group, each its own slot; otherwise the refusal stands.

A promoted layer (:class:`PromotedLocalSpec`) keeps its page size and its attention (its window
or chunk); it only holds every token's page, ``cdiv(max_model_len, block_size)`` per request.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from graphkv.errors import PlanError, Problem
from graphkv.spec.layers import (ChunkedLocalSpec, LayerKind, PageDemand, PromotedLocalSpec, SlidingWindowSpec,
                                 kind_label)
from graphkv.spec.limits import Limits
from graphkv.spec.model import LayerDecl

__all__ = ["Promotion", "fallback_refusal", "one_type", "promote_for_limits", "promote_layers", "promote_on_purpose",
           "promotion_note"]

_LOCAL_KINDS = (LayerKind.SLIDING_WINDOW, LayerKind.CHUNKED_LOCAL)


@attrs.frozen(kw_only=True)
class Promotion:
    """Which layers were promoted to full-attention allocation, and why (one sentence)."""

    layers: tuple[LayerDecl, ...]  # the promoted layers, with their own (local) specs
    reason: str


def promote_layers(layers: Sequence[LayerDecl], *, reason: str) -> tuple[tuple[LayerDecl, ...], Promotion | None]:
    """``layers`` with every sliding-window and chunked-local layer allocated as full attention
    (:class:`PromotedLocalSpec`), and the :class:`Promotion` (``None`` when there was nothing to
    promote). Pure."""
    promoted = tuple(layer for layer in layers if layer.spec.kind in _LOCAL_KINDS)
    if not promoted:
        return tuple(layers), None
    out = tuple(attrs.evolve(layer, spec=PromotedLocalSpec.of(layer.spec)) if layer.spec.kind in _LOCAL_KINDS
                else layer for layer in layers)
    return out, Promotion(layers=promoted, reason=reason)


def one_type(layers: Sequence[LayerDecl]) -> bool:
    """Whether the layers are of one type as vLLM 0.33 counts it (``is_kv_cache_spec_uniform`` or
    ``UniformTypeKVCacheSpecs.is_uniform_type``): one spec, all recurrent states, or one
    ``uniform_type_key`` (the same pages per request)."""
    if len({layer.spec for layer in layers}) <= 1 or all(layer.spec.is_ssm for layer in layers):
        return True
    keys = {layer.spec.uniform_type_key for layer in layers}
    return len(keys) == 1 and None not in keys


def promote_for_limits(layers: Sequence[LayerDecl], limits: Limits) -> tuple[tuple[LayerDecl, ...], Promotion | None]:
    """The promotion ``limits.disable_hybrid_kv_cache_manager`` asks for (``None``: vLLM 0.33's
    automatic choice, on for chunked-local attention) — :func:`promote_on_purpose` — or none."""
    wanted = limits.disable_hybrid_kv_cache_manager
    if wanted is None and any(layer.spec.kind is LayerKind.CHUNKED_LOCAL for layer in layers):
        why = ("vLLM 0.33 turns its hybrid KV cache manager off for chunked-local attention unless "
               "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1; disable_hybrid_kv_cache_manager=False keeps it")
    elif wanted:
        why = "disable_hybrid_kv_cache_manager=True, as vLLM's --disable-hybrid-kv-cache-manager"
    else:
        return tuple(layers), None
    return promote_on_purpose(layers, why=why, value=wanted)


def promote_on_purpose(layers: Sequence[LayerDecl], *, why: str,
                       value: bool | None = True) -> tuple[tuple[LayerDecl, ...], Promotion | None]:
    """vLLM 0.33 ``unify_hybrid_kv_cache_specs``: layers not of one type, one of which keeps every
    token, get their local-attention layers promoted to full attention; they must then be of one
    type. (vLLM takes replicated draft caches apart; graphkv models no decode context parallelism,
    so every layer, recurrent states included, is taken together, as vLLM takes a model's own.)
    ``why`` says what asked for it (the flag, or the automatic rule; ``value`` is the option's
    value). Raises :class:`PlanError` naming ``disable_hybrid_kv_cache_manager`` where vLLM
    refuses to start."""
    if one_type(layers):
        return tuple(layers), None
    keeps_every_token = any(layer.spec.kind is LayerKind.FULL_ATTENTION or layer.spec.kind.is_latent
                            for layer in layers)
    if keeps_every_token:
        promoted, promotion = promote_layers(layers, reason=why)
        if one_type(promoted):
            return promoted, promotion
    kinds = sorted({_kind_text(layer.spec) for layer in layers})
    states = any(layer.spec.is_ssm for layer in layers)
    raise PlanError(Problem(
        field="disable_hybrid_kv_cache_manager", value=value,
        limit=f"the layers are of {len(kinds)} kinds ({', '.join(kinds)}) and allocating local attention as full "
              "attention cannot give them one type" + (" (recurrent states need the hybrid manager)" if states else
                                                       " (no layer keeps every token)")
              + "; vLLM 0.33 refuses to start: 'Failed to promote local KV cache specs to one unified type'",
        fix=("plan with the hybrid KV cache manager: leave disable_hybrid_kv_cache_manager unset" if value else
             "keep the hybrid KV cache manager: pass disable_hybrid_kv_cache_manager=False (and set "
             "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 for vLLM)")))


def _kind_text(spec: object) -> str:
    window, chunk = getattr(spec, "window", None), getattr(spec, "chunk", None)
    label = kind_label(spec)  # type: ignore[arg-type]
    return f"{label} {window}" if window is not None else f"{label} {chunk}" if chunk is not None else label


def fallback_refusal(layers: Sequence[LayerDecl]) -> str | None:
    """Why vLLM 0.33's full-allocation fallback cannot promote these layers (``None``: it can). It
    needs MLA and sliding-window layers, no chunked-local layer, and one type after promotion (no
    recurrent state)."""
    kinds = {layer.spec.kind for layer in layers}
    if LayerKind.CHUNKED_LOCAL in kinds:
        return "the model has chunked-local layers"
    if not any(kind.is_latent for kind in kinds):
        return "the model has no MLA layer"
    if LayerKind.SLIDING_WINDOW not in kinds:
        return "the model has no sliding-window layer to promote"
    if LayerKind.MAMBA in kinds:
        return "recurrent-state layers cannot join a full-attention group"
    return None


def promotion_note(promotion: Promotion, demand: PageDemand) -> str:
    """The plan note: which layers were promoted, why, and what it costs in pages per request at
    ``demand.max_model_len`` (their own worst case against every token's page)."""
    by_spec: dict[object, list[str]] = {}
    for layer in promotion.layers:
        by_spec.setdefault(layer.spec, []).append(layer.name)
    parts = []
    for spec, names in by_spec.items():
        assert isinstance(spec, (SlidingWindowSpec, ChunkedLocalSpec))
        before, after = spec.max_pages(demand), PromotedLocalSpec.of(spec).max_pages(demand)
        shown = ", ".join(names[:3]) + (f", … ({len(names)} layers)" if len(names) > 3 else "")
        what = f"window {spec.window}" if isinstance(spec, SlidingWindowSpec) else f"chunk {spec.chunk}"
        cost = (f"now hold {after} pages per request instead of {before}" if after != before else
                f"hold {after} pages per request either way")
        parts.append(f"{spec.kind.value} layers ({what}: {shown}) {cost} at max_model_len={demand.max_model_len}")
    count = len(promotion.layers)
    return (f"{count} local-attention layer(s) allocated as full attention ({promotion.reason}); their attention "
            f"still reads only its window or chunk; " + "; ".join(parts))
