"""The KV pool: one raw byte tensor per plan slot, and every layer's typed view into it.

Example (the tiny hybrid "MAMA": Mamba layers 0 and 2, attention layers 1 and 3, 8 pages)::

    >>> import graphkv
    >>> from graphkv.models.tiny_hybrid import TinyHybridConfig, model_kv
    >>> plan = graphkv.compile(model_kv(TinyHybridConfig(pattern="MAMA")), graphkv.Limits(
    ...     max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32, num_blocks_override=8))
    >>> from graphkv.runtime import allocate
    >>> pool = allocate(plan, device="cpu")
    >>> tuple(pool.kv_cache("layers.1").shape)  # kv-first (2, N, kbs, H, D)
    (2, 8, 16, 2, 16)
    >>> [tuple(state.shape) for state in pool.mamba_states("layers.0")]  # conv, ssm: (N, *state_shape) each
    [(8, 3, 64), (8, 2, 8, 16)]
"""

from __future__ import annotations

from typing import Mapping

import attrs
import torch

from graphkv.errors import PlanError, Problem, SpecError
from graphkv.plan.plan import Plan
from graphkv.runtime.buffers import LedgerBuffers
from graphkv.runtime.device import resolve_device
from graphkv.runtime.pool.views import AttentionGeometry, StateGeometry, attention_view, state_views
from graphkv.spec.backends import CacheOrder, KVLayout
from graphkv.spec.model import LayerDecl

__all__ = ["KVPool", "allocate", "layer_geometry", "page_local_slots"]


@attrs.frozen(kw_only=True, eq=False)
class KVPool:
    """The allocated pool of a :class:`Plan`: raw slots plus persistent per-layer views.

    ``slots[j]``: ``[num_blocks * plan.slots[j].page_size_bytes] uint8``. Views are built once at
    allocation; :meth:`kv_cache` and :meth:`mamba_states` return the same tensors every call
    (capture-safe, no allocation).
    """

    plan: Plan
    slots: tuple[torch.Tensor, ...]
    attention: Mapping[str, torch.Tensor]  # layer name -> logical cache view
    states: Mapping[str, tuple[torch.Tensor, ...]]  # layer name -> state views
    geometry: Mapping[str, "AttentionGeometry | StateGeometry"]

    @property
    def device(self) -> torch.device:
        """Where the pool lives."""
        return self.slots[0].device

    @property
    def nbytes(self) -> int:
        """Bytes allocated for the pool (equals ``plan.pool_bytes``)."""
        return sum(s.numel() for s in self.slots)

    def layer(self, layer: "str | int") -> LayerDecl:
        """The plan's declaration of ``layer`` (a layer name or model layer index)."""
        for decl in self.plan.layers:
            if decl.name == layer or (isinstance(layer, int) and not isinstance(layer, bool) and decl.index == layer):
                return decl
        names = [d.name for d in self.plan.layers]
        raise SpecError(Problem(field="layer", value=layer, limit="is not a KV layer of this plan",
                                fix=f"pass a layer name or index, e.g. {names[:4]}"))

    def layout(self, layer: "str | int") -> KVLayout:
        """The backend's declared layout of ``layer`` (pass it to the kernels with the view)."""
        return self.layer(layer).backend.kv_layout

    def kv_cache(self, layer: "str | int") -> torch.Tensor:
        """The attention cache of ``layer`` in its backend's logical shape and the spec dtype:
        blocks-first ``(N, 2, kbs, H, D)``, kv-first ``(2, N, kbs, H, D)`` or MLA ``(N, kbs, D)``
        with ``N = num_blocks * bpk`` kernel blocks. A view of the pool; capture-safe."""
        decl = self.layer(layer)
        if decl.name not in self.attention:
            raise SpecError(Problem(field="layer", value=decl.name, limit="is a state layer, it has no attention cache",
                                    fix="use pool.mamba_states(layer)"))
        return self.attention[decl.name]

    def mamba_states(self, layer: "str | int") -> tuple[torch.Tensor, ...]:
        """The state tensors of a Mamba layer, one ``(num_blocks, *shape_i)`` view per state in
        its spec dtype, page stride = page bytes. Views of the pool; capture-safe."""
        decl = self.layer(layer)
        if decl.name not in self.states:
            raise SpecError(Problem(field="layer", value=decl.name, limit="is an attention layer, it has no states",
                                    fix="use pool.kv_cache(layer)"))
        return self.states[decl.name]

    def page_bytes(self, layer: "str | int", page: int) -> torch.Tensor:
        """The raw bytes ``[P] uint8`` of ``page`` in ``layer``'s slot (for tests and debugging)."""
        slot = self.plan.slot_of(self.layer(layer).index)
        p = slot.page_size_bytes
        return self.slots[slot.index][page * p:(page + 1) * p]


def page_local_slots(plan: Plan) -> tuple[bool, ...]:
    """Per slot of ``plan``: whether its kv-first layers are *page-local* (each kernel block
    physically ``(2, kbs, H, D)`` inside its page) rather than split (K of all pages, then V).
    Decided by the planner (:mod:`graphkv.plan.layout`, ``SlotPlan.page_local``); read here.

    Example::

        >>> import graphkv
        >>> from graphkv.models.tiny_hybrid import TinyHybridConfig, model_kv
        >>> plan = graphkv.compile(model_kv(TinyHybridConfig(pattern="MAMA")), graphkv.Limits(
        ...     max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32, num_blocks_override=8))
        >>> page_local_slots(plan)  # both slots hold a Mamba layer
        (True, True)
    """
    return tuple(slot.page_local for slot in plan.slots)


def layer_geometry(plan: Plan, decl: LayerDecl,
                   page_local: "tuple[bool, ...]") -> "AttentionGeometry | StateGeometry":
    """Where ``decl``'s pages live in its slot: the one place that decides an attention layer's
    page-locality (``page_local``: :func:`page_local_slots` of ``plan``) and kernel-block stride
    (slot page bytes / bpk). :func:`allocate` and the flex mask geometry both read it. Pure.

    Raises :class:`PlanError` for a blocks-first or kv-first layer with ``head_size_v != head_size``."""
    group, slot = plan.group_of(decl.index), plan.slot_of(decl.index)
    spec = decl.spec
    if spec.is_ssm:
        return StateGeometry(layer_name=decl.name, num_blocks=plan.num_blocks, shapes=spec.shapes,
                             dtypes=tuple(d.to_torch() for d in spec.dtypes), page_size_bytes=slot.page_size_bytes)
    order = decl.backend.kv_layout.order
    if order is not CacheOrder.LATENT and spec.value_head_size != spec.head_size:
        raise PlanError(Problem(field=f"{decl.name}.head_size_v", value=spec.value_head_size,
                                limit=f"the {order.value} layout stores K and V as one (.., 2, kbs, H, D) tensor, "
                                      f"so it needs head_size_v == head_size={spec.head_size}",
                                fix="pad V to head_size in the model, or use a backend with separate K/V caches"))
    return AttentionGeometry(
        layer_name=decl.name, layout=decl.backend.kv_layout, num_blocks=plan.num_blocks, bpk=group.bpk,
        kernel_block_size=group.kernel_block_size, num_heads=spec.num_kv_heads, head_size=spec.head_size,
        dtype=spec.dtype.to_torch(), page_size_bytes=slot.page_size_bytes,
        page_local=order is CacheOrder.KV_FIRST and page_local[slot.index])


def allocate(plan: Plan, device: "str | torch.device" = "cpu") -> KVPool:
    """Allocate ``plan``'s pool on ``device``: one zeroed ``[num_blocks * page_bytes] uint8``
    tensor per slot (``plan.pool_bytes`` in all, exactly), plus every layer's view.

    Raises :class:`PlanError` when a layer cannot be viewed in its dtype (page bytes or a state
    offset not a multiple of the element size, or ``head_size_v != head_size``), and
    :class:`SpecError` for a device that is not a CPU or an existing CUDA device. Not capture-safe
    (it allocates); call it once, before capturing.
    """
    if not isinstance(plan, Plan):
        raise SpecError(Problem(field="plan", value=type(plan).__name__, limit="must be a graphkv Plan",
                                fix="build it with graphkv.compile(model, limits, budget)"))
    device = resolve_device(device)
    buffers = LedgerBuffers.of_plan(plan, device, ("kv_pool.",))  # the ledger's kv_pool.slot{j} entries
    slots = tuple(buffers.tensor(f"kv_pool.slot{s.index}") for s in plan.slots)
    assert sum(s.numel() for s in slots) == plan.pool_bytes, "slot pages must add up to the planned pool"
    attention: dict[str, torch.Tensor] = {}
    states: dict[str, tuple[torch.Tensor, ...]] = {}
    geometry: dict[str, AttentionGeometry | StateGeometry] = {}
    local = page_local_slots(plan)
    for decl in plan.layers:
        geo = layer_geometry(plan, decl, local)
        slot = slots[plan.slot_of(decl.index).index]
        geometry[decl.name] = geo
        if isinstance(geo, StateGeometry):
            states[decl.name] = state_views(slot, geo)
        else:
            attention[decl.name] = attention_view(slot, geo)
    return KVPool(plan=plan, slots=slots, attention=attention, states=states, geometry=geometry)
