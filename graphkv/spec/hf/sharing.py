"""KV sharing: the last ``num_kv_shared_layers`` layers read an earlier layer's cache and hold none.

Gemma-3n and Gemma-4 compute K and V only in the first ``L - num_kv_shared_layers`` layers; each
later layer reads the cache of the last earlier layer of its own attention type (sliding reads
sliding, full reads full) — transformers' ``kv_sharing_modes`` and vLLM 0.33's
``kv_sharing_target_layer_name``. Shared layers are declared as
:class:`~graphkv.spec.layers.KVSharedSpec` and take no pages.
"""

from __future__ import annotations

from typing import Sequence

from graphkv.spec.hf._reader import ConfigReader
from graphkv.spec.hf.layout import Role

__all__ = ["kv_sources"]

_SHAREABLE = (Role.FULL, Role.SLIDING, Role.CHUNKED)


def kv_sources(cfg: ConfigReader, roles: Sequence[Role]) -> dict[int, int]:
    """``{shared layer: layer whose cache it reads}``; empty when the config shares nothing.

    Raises SpecError naming ``num_kv_shared_layers`` when a shared layer has no earlier layer of
    its type (or is not an attention layer)."""
    if not cfg.has("num_kv_shared_layers"):
        return {}
    count = len(roles)
    shared = cfg.int_field("num_kv_shared_layers", minimum=0, cap="layers")
    if shared is None:
        cfg.raise_if_any()
    assert shared is not None
    if shared == 0:
        return {}
    first = count - shared
    most = _most_shared(roles)
    fix = (f"set num_kv_shared_layers to <= {most} (each shared layer reads an earlier layer of its own type)"
           if most else "set num_kv_shared_layers to 0: no layer has an earlier one of its type to read")
    if first < 1:
        cfg.fail("num_kv_shared_layers", shared, f"must leave at least one of the {count} layers computing K and V",
                 fix)
    last_of: dict[Role, int] = {}
    for i in range(first):
        last_of[roles[i]] = i
    sources = {}
    for i in range(first, count):
        source = last_of.get(roles[i]) if roles[i] in _SHAREABLE else None
        if source is None:
            cfg.fail("num_kv_shared_layers", shared,
                     f"layer {i} ({roles[i].value}) would read the cache of an earlier {roles[i].value} layer, but "
                     f"layers 0..{first - 1} have none",
                     f"{fix}, or check num_kv_shared_layers and layer_types against the model's config.json")
        sources[i] = source
    return sources


def _most_shared(roles: Sequence[Role]) -> int:
    """The most trailing layers that can share: each an attention layer whose type some layer before the
    shared ones has (0 when none can)."""
    first_of: dict[Role, int] = {}
    for i, role in enumerate(roles):
        first_of.setdefault(role, i)
    best, needed = 0, 0  # needed: the first computing layer must come after each shared type's first layer
    for first in range(len(roles) - 1, 0, -1):  # share roles[first:]; once too many, more only gets worse
        if roles[first] not in _SHAREABLE or max(needed, first_of[roles[first]]) >= first:
            break
        needed, best = max(needed, first_of[roles[first]]), len(roles) - first
    return best
