"""Assemble a :class:`~graphkv.spec.model.ModelKV` from what each reader found.

Per layer role (:mod:`.layout`) the entries are:

- full / sliding / chunked attention: one attention entry, or one MLA entry when the config has
  ``kv_lora_rank`` (two for LongCat-Flash, which runs two attentions per layer);
- indexed attention: an MLA entry and the indexer's key cache (none for a layer whose
  ``indexer_types`` entry is ``shared``: it reads an earlier layer's indexer keys);
- linear attention / conv: one state entry (:mod:`.states`);
- hybrid: an attention entry and a state entry (Falcon-H1, Zamba2's hybrid layers);
- MLP / MoE, and layers that read another layer's KV (:mod:`.sharing`): no entry, declared in
  ``ModelKV.cacheless``.

The first entry of layer ``i`` is ``layers.{i}`` with index ``i``; a second one is named after its
role (``layers.{i}.indexer``, ``layers.{i}.mamba2``, ``layers.{i}.attn1``) and indexed after the
stack (``num_layers + k``), keeping ``layer_index=i``.
"""

from __future__ import annotations

from typing import Any

from graphkv.spec.hf._reader import ConfigReader, Options
from graphkv.spec.hf.attention import AttentionReader
from graphkv.spec.hf.families import Family
from graphkv.spec.hf.gpu_attention import attention_backend
from graphkv.spec.hf.gpu_backends import mla_backend
from graphkv.spec.hf.layout import Layout, Role, has_attention_heads, has_state_fields
from graphkv.spec.hf.mla import MLAReader, is_mla
from graphkv.spec.hf.states import STATE_BACKENDS, read_conv_state, read_state
from graphkv.spec.layers import KVSharedSpec, MambaSpec, NoCacheSpec
from graphkv.spec.model import CachelessDecl, LayerDecl

__all__ = ["build_layers", "probe_layers"]

_ATTENTION = (Role.FULL, Role.SLIDING, Role.CHUNKED, Role.HYBRID)


class _Entries:
    """Collects cache entries: first entries at their layer index, extra ones after the stack."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.layers: list[LayerDecl] = []
        self.extra: list[LayerDecl] = []

    def add(self, i: int, suffix: str, spec: Any, backend: str) -> None:
        if not suffix:
            self.layers.append(LayerDecl(index=i, name=f"layers.{i}", spec=spec, backend=backend))
        else:
            index = self.count + len(self.extra)
            self.extra.append(LayerDecl(index=index, name=f"layers.{i}.{suffix}", spec=spec, backend=backend,
                                        layer_index=i))


def build_layers(cfg: ConfigReader, opts: Options, layout: Layout, family: Family | None,
                 shared: dict[int, int]) -> tuple[list[LayerDecl], list[CachelessDecl]]:
    """Every cache entry and every cacheless layer of ``layout`` (problems recorded on ``cfg``,
    raised together before any spec is built)."""
    roles = layout.roles
    present = set(roles[i] for i in range(len(roles)) if i not in shared)
    layout_key = layout.source.split(" ", 1)[0]
    mla = (present & {Role.FULL, Role.SLIDING, Role.CHUNKED, Role.INDEXED}) and is_mla(cfg)
    if Role.INDEXED in present and not is_mla(cfg):
        cfg.fail(layout_key, "indexed_attention", "names indexed (sparse) attention layers but the config has no "
                 "kv_lora_rank: graphkv plans indexers on MLA layers (DeepSeek-V3.2, GLM-5)",
                 "pass the model's whole config.json, or declare the layers with ModelKV.from_specs")
    if mla and present & {Role.SLIDING, Role.CHUNKED, Role.HYBRID}:
        odd = sorted(r.value for r in present & {Role.SLIDING, Role.CHUNKED, Role.HYBRID})
        cfg.fail(layout_key, odd, "mixes sliding, chunked or hybrid layers with MLA latents, which graphkv does not "
                 "plan", "declare the layers with ModelKV.from_specs")
    latent = MLAReader(cfg, opts, indexed=Role.INDEXED in present) if mla else None
    attention = (AttentionReader(cfg, opts, present, num_layers=len(roles))
                 if not mla and present & set(_ATTENTION) else None)
    state = read_state(cfg, opts, layout_key) if present & {Role.STATE, Role.HYBRID} else None
    conv = read_conv_state(cfg, opts) if Role.CONV in present else None
    cfg.raise_if_any()

    indexer_owner = _indexer_owners(cfg, len(roles)) if Role.INDEXED in present else []
    attention_specs = {i: attention.spec(i, Role.FULL if role is Role.HYBRID else role) for i, role in enumerate(roles)
                       if attention is not None and i not in shared and role in _ATTENTION}
    triton_rule = _triton_rule(family, attention_specs.values())
    entries = _Entries(len(roles))
    cacheless: list[CachelessDecl] = []
    per_layer = family.attentions_per_layer if family is not None else 1
    for i, role in enumerate(roles):
        if i in shared:
            cacheless.append(CachelessDecl(index=i, name=f"layers.{i}", spec=KVSharedSpec(source=f"layers.{shared[i]}")))
        elif not role.holds_cache:
            cacheless.append(CachelessDecl(index=i, name=f"layers.{i}", spec=NoCacheSpec(role=role.value)))
        elif role in (Role.STATE, Role.CONV):
            spec = state if role is Role.STATE else conv
            assert isinstance(spec, MambaSpec)
            entries.add(i, "", spec, STATE_BACKENDS[spec.variant])
        elif latent is not None:
            assert latent.latent is not None
            for k in range(per_layer):
                entries.add(i, f"attn{k}" if k else "", latent.latent, mla_backend(
                    cfg, opts.gpu_arch, opts.mla_backend, latent.latent.dtype, indexed=latent.indexer is not None,
                    gpu=opts.gpu_label, gpu_value=opts.gpu_value))
            if role is Role.INDEXED and indexer_owner[i]:
                entries.add(i, "indexer", latent.indexer, "indexer")
        else:
            assert attention is not None
            spec = attention_specs[i]
            if spec is None:  # its problem is recorded and raised below
                continue
            entries.add(i, "", spec, attention_backend(
                cfg, opts.gpu_arch, None if opts.attention_backend == "auto" else opts.attention_backend,
                model_dtype=opts.model_dtype, cache_dtype=spec.dtype, head_size=spec.head_size,
                sinks=family is not None and family.attention_sinks, triton_rule=triton_rule, gpu=opts.gpu_label))
            if role is Role.HYBRID:
                assert isinstance(state, MambaSpec)
                entries.add(i, state.variant, state, STATE_BACKENDS[state.variant])
    cfg.raise_if_any()
    return entries.layers + entries.extra, cacheless


def _triton_rule(family: Family | None, specs: Any) -> str:
    """The family's rule for serving this model with Triton below Hopper (``triton_below_hopper``), when it applies:
    ``"always"``, or ``"mixed_heads"`` when its layers' head sizes differ; else ``""``."""
    rule = family.triton_below_hopper if family is not None else ""
    if rule == "mixed_heads" and len({s.head_size for s in specs if s is not None}) < 2:
        return ""
    return rule


def _indexer_owners(cfg: ConfigReader, count: int) -> list[bool]:
    """Per layer: whether its indexer caches its own keys (``indexer_types`` ``full``) or reuses an
    earlier layer's (``shared``); every indexed layer owns its keys when the field is absent."""
    value = cfg.get("indexer_types")
    if value is None:
        return [True] * count
    if not isinstance(value, (list, tuple)) or len(value) != count or not all(v in ("full", "shared") for v in value):
        cfg.fail("indexer_types", value if not isinstance(value, (list, tuple)) or len(value) <= 8
                 else f"<{len(value)} entries>", f"must list 'full' or 'shared' for each of the {count} layers",
                 "copy indexer_types from the model's config.json")
    return [v == "full" for v in value]


def probe_layers(cfg: ConfigReader, opts: Options) -> None:
    """Read the fields the config's likely layers need (state, MLA or attention) only to record
    their problems, when the layout itself could not be read."""
    if has_state_fields(cfg) and not has_attention_heads(cfg):
        read_state(cfg, opts, "layer_types")
    elif is_mla(cfg):
        MLAReader(cfg, opts, indexed=False)
    else:
        AttentionReader(cfg, opts, {Role.FULL})
