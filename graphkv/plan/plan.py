"""The frozen output of :func:`graphkv.compile`: everything the runtime allocates, with reasons."""

from __future__ import annotations

import math
from typing import Any

import attrs

from graphkv.errors import Problem, SpecError, UnknownNameError
from graphkv.plan.capacity import PageCounter, longest_len
from graphkv.plan.cudagraph_plan import CaptureSizes, CudaGraphPlan
from graphkv.plan.ledger_entries import Ledger, LedgerEntry
from graphkv.plan.concurrency import capacity_tables
from graphkv.spec._checks import count_arg, got, whole_int
from graphkv.spec.dtypes import DType
from graphkv.spec.layers import LayerKind, LayerSpec
from graphkv.spec.limits import Limits
from graphkv.spec.model import CachelessDecl, LayerDecl

__all__ = ["BlockSizeChoice", "BufferSpec", "Capacity", "CaptureSizes", "CudaGraphPlan", "GroupPlan", "Ledger",
           "LedgerEntry", "Plan", "SlotPlan", "StaticBuffers"]


@attrs.frozen(kw_only=True)
class BlockSizeChoice:
    """Step 1: the page size in tokens, and how hybrid alignment changed it."""

    block_size: int
    mamba_block_size: int | None
    reason: str
    mamba_state_bytes: int = 0  # real (unpadded) bytes of the largest Mamba state
    mamba_page_bytes: int = 0  # bytes a Mamba page takes after padding to the attention page

    @property
    def mamba_page_padding_bytes(self) -> int:
        """Bytes of padding at the end of every Mamba page."""
        return self.mamba_page_bytes - self.mamba_state_bytes


@attrs.frozen(kw_only=True)
class GroupPlan:
    """One KV-cache group: layers with one spec that share a block table."""

    index: int
    spec: LayerSpec
    layers: tuple[int, ...]  # model layer indices, slot j holds layers[j]
    layer_names: tuple[str, ...]
    backends: tuple[str, ...]  # distinct backend names of the group's layers
    block_size: int  # tokens per page for this group (scaled up when its page was smaller)
    kernel_block_size: int
    page_size_bytes: int  # bytes per page per layer, padded
    real_page_size_bytes: int  # bytes per page of the group's spec actually holding data
    layer_real_page_bytes: tuple[int, ...]  # real bytes per page of each layer (slot j holds layers[j])
    pages_per_request: int  # at the plan's max_model_len

    @property
    def kind(self) -> LayerKind:
        """The layer family of the group."""
        return self.spec.kind

    @property
    def is_ssm(self) -> bool:
        """Whether the group holds recurrent states."""
        return self.spec.is_ssm

    @property
    def bpk(self) -> int:
        """Kernel blocks per page."""
        return self.block_size // self.kernel_block_size

    @property
    def block_table_width(self) -> int:
        """Columns of this group's block table, in kernel blocks."""
        return self.pages_per_request * self.bpk


@attrs.frozen(kw_only=True)
class SlotPlan:
    """One raw byte tensor of the pool: ``num_blocks * page_size_bytes`` bytes, shared by the
    ``j``-th layer of every group (``layers``, one per group that has a ``j``-th layer).
    ``page_local``: kv-first layers keep each page's K and V inside the page
    (:mod:`graphkv.plan.layout`)."""

    index: int
    page_size_bytes: int
    layers: tuple[int, ...]
    page_local: bool = False


@attrs.frozen(kw_only=True)
class Capacity:
    """Step 4: pool size in pages and the resulting max model length."""

    num_blocks: int
    pool_bytes_per_block: int
    pages_per_request: int  # sum over groups, at max_model_len
    max_model_len: int
    max_model_len_reason: str
    num_blocks_reason: str
    from_override: bool
    max_position_embeddings: int | None = None  # the model's cap on max_model_len, if it declares one

    @property
    def usable_pages(self) -> int:
        """Pages a scheduler can hand out (page 0 is the null page)."""
        return self.num_blocks - 1

    @property
    def max_concurrency(self) -> int:
        """Requests of ``max_model_len`` tokens the pool holds at once."""
        return self.usable_pages // self.pages_per_request


@attrs.frozen(kw_only=True)
class BufferSpec:
    """A persistent static buffer to allocate once: its name, shape, dtype and why that size."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    reason: str

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer."""
        return math.prod(self.shape) * self.dtype.itemsize


@attrs.frozen(kw_only=True)
class StaticBuffers:
    """Step 5: the flex mask index buffers whose shapes the runtime reads (``flex.{g}.kv_num_blocks``,
    ``flex.{g}.kv_indices``); every buffer allocated is in ``Ledger.allocations(kind)``."""

    buffers: tuple[BufferSpec, ...]

    def __getitem__(self, name: str) -> BufferSpec:
        for b in self.buffers:
            if b.name == name:
                return b
        raise UnknownNameError(Problem(field="static buffer", value=name,
                                       limit="is not one of this plan's: " + (", ".join(b.name for b in self.buffers)
                                                                            or "(none)"),
                                       fix="use a name from plan.buffers.buffers"))

    def __contains__(self, name: object) -> bool:
        return any(b.name == name for b in self.buffers)



@attrs.frozen(kw_only=True)
class Plan:
    """Everything decided about a model's KV cache and CUDA graphs, before any weight is loaded."""

    model_name: str
    limits: Limits  # as given, max_concurrent_batches resolved from the pipeline stages
    layers: tuple[LayerDecl, ...]  # every KV layer, Mamba pages padded as planned
    block: BlockSizeChoice
    groups: tuple[GroupPlan, ...]
    slots: tuple[SlotPlan, ...]
    group_size: int
    capacity: Capacity
    buffers: StaticBuffers  # flex mask index shapes; what the runtime allocates is ledger.allocations(kind)
    cudagraph: CudaGraphPlan
    ledger: Ledger
    notes: tuple[str, ...] = ()
    cacheless: tuple[CachelessDecl, ...] = ()  # layers that hold no cache of their own (KV-shared, MLP)

    def group_of(self, layer_index: int) -> GroupPlan:
        """The group holding model layer ``layer_index`` (an int; numpy ints too, a bool is refused)."""
        index = self._layer_index(layer_index)
        for g in self.groups:
            if index in g.layers:
                return g
        raise self._unknown_layer(layer_index)

    def slot_of(self, layer_index: int) -> SlotPlan:
        """The pool slot holding model layer ``layer_index`` (as :meth:`group_of` takes it)."""
        index = self._layer_index(layer_index)
        for s in self.slots:
            if index in s.layers:
                return s
        raise self._unknown_layer(layer_index)

    def _layer_index(self, layer_index: Any) -> int:
        index = whole_int(layer_index)
        if index is None:  # True would equal layer 1 and 2.0 layer 2
            raise self._unknown_layer(layer_index, "is not an integer layer index" + got(layer_index))
        return index

    def _unknown_layer(self, layer_index: Any, why: str = "is not the index of a layer holding a cache in this plan"
                       ) -> SpecError:
        held = sorted(i for g in self.groups for i in g.layers)
        listed = ", ".join(map(str, held[:8])) + (f", … ({len(held)} in all)" if len(held) > 8 else "")
        return SpecError(Problem(field="layer_index", value=layer_index,
                                 limit=f"{why} (this plan's layers holding a cache: {listed})",
                                 fix="pass a LayerDecl.index from plan.layers, e.g. plan.layers[0].index"))

    @property
    def block_size(self) -> int:
        """Tokens per page (the base block size; see each group's own)."""
        return self.block.block_size

    @property
    def num_blocks(self) -> int:
        """Pages in the pool, the null page included."""
        return self.capacity.num_blocks

    @property
    def max_model_len(self) -> int:
        """Resolved max tokens per request."""
        return self.capacity.max_model_len

    @property
    def kernel_block_sizes(self) -> tuple[int, ...]:
        """Kernel block size of each group, in group order."""
        return tuple(g.kernel_block_size for g in self.groups)

    @property
    def pool_bytes_per_block(self) -> int:
        """Bytes one page index takes across all slots."""
        return self.capacity.pool_bytes_per_block

    @property
    def pool_bytes(self) -> int:
        """Bytes of the whole pool."""
        return self.num_blocks * self.pool_bytes_per_block

    def _page_counter(self) -> PageCounter:
        return PageCounter.for_limits(self.groups, self.limits)  # type: ignore[arg-type]  # GroupPlan has spec, block_size

    def pages_per_request_at(self, max_model_len: int) -> int:
        """Worst-case pages one request of ``max_model_len`` tokens needs, summed over groups.

        >>> from graphkv import Budget, FullAttentionSpec, Limits, ModelKV, compile
        >>> model = ModelKV.from_specs("tiny", [(FullAttentionSpec(num_kv_heads=8, head_size=128), "flash_attn")] * 2)
        >>> compile(model, Limits(max_model_len=4096), Budget.kv_bytes("1GiB")).pages_per_request_at(1000)
        63
        """
        length = count_arg("max_model_len", max_model_len, 1,
                           f"pass a request length in tokens, e.g. max_model_len={self.max_model_len} (the plan's)")
        return self._page_counter().pages(length)

    def concurrency_at(self, max_model_len: int) -> int:
        """How many requests of ``max_model_len`` tokens this pool holds at once. Raises :class:`SpecError`
        for a length that is not an integer >= 1 (a bool, a float, a string)."""
        return self.capacity.usable_pages // self.pages_per_request_at(max_model_len)

    def max_model_len_for(self, concurrency: int) -> int:
        """The longest length at which ``concurrency`` requests fit this pool at once (0: none fits),
        capped by the model's ``max_position_embeddings`` (else by this plan's ``max_model_len``).
        Raises :class:`SpecError` for a count that is not an integer >= 1."""
        requests = count_arg("concurrency", concurrency, 1, "pass how many requests must fit the pool at once, "
                                                            "e.g. concurrency=1")
        hi = self.capacity.max_position_embeddings or self.max_model_len
        return longest_len(self._page_counter(), self.capacity.usable_pages // requests, hi)

    def layer_entries(self) -> list[dict[str, Any]]:
        """What every layer became, in stack order: ``{"index", "name", "kind", "group", "kv_source"}``
        per cache entry (``index``: the model layer; ``kv_source``: the entry whose cache it reads,
        itself for a cache holder, ``None`` for a layer that holds nothing; ``group``: ``None`` for a
        layer without a cache of its own). Linear in the number of layers."""
        group_of = {i: g.index for g in self.groups for i in g.layers}
        rows: list[tuple[int, int, dict[str, Any]]] = []
        for order, decl in enumerate(self.layers):
            rows.append((decl.model_layer, order, {"index": decl.model_layer, "name": decl.name,
                                                   "kind": decl.spec.kind.value, "group": group_of[decl.index],
                                                   "kv_source": decl.name}))
        for order, other in enumerate(self.cacheless, start=len(self.layers)):
            source = getattr(other.spec, "source", None)
            rows.append((other.model_layer, order, {"index": other.model_layer, "name": other.name,
                                                    "kind": other.spec.kind.value, "group": None,
                                                    "kv_source": source}))
        rows.sort(key=lambda row: row[:2])
        return [row[2] for row in rows]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``graphkv plan --json`` object)."""
        return {
            "model": self.model_name,
            "block_size": self.block_size,
            "block_size_reason": self.block.reason,
            "mamba_block_size": self.block.mamba_block_size,
            "kernel_block_sizes": list(self.kernel_block_sizes),
            "num_blocks": self.num_blocks,
            "num_blocks_reason": self.capacity.num_blocks_reason,
            "usable_pages": self.capacity.usable_pages,
            "max_model_len": self.max_model_len,
            "max_model_len_reason": self.capacity.max_model_len_reason,
            "pages_per_request": self.capacity.pages_per_request,
            "max_concurrency": self.capacity.max_concurrency,
            "concurrency": self.limits.concurrency,
            "pages_per_request_table": capacity_tables(
                self.groups, self.limits, self.capacity.usable_pages,
                self.capacity.max_position_embeddings or self.max_model_len, self.max_model_len),
            "group_size": self.group_size,
            "layers": self.layer_entries(),
            "groups": [
                {
                    "kind": g.kind.value,
                    "spec": g.spec.to_dict(),
                    "spec_text": g.spec.describe(),
                    "layers": list(g.layers),
                    "backends": list(g.backends),
                    "block_size": g.block_size,
                    "kernel_block_size": g.kernel_block_size,
                    "page_size_bytes": g.page_size_bytes,
                    "real_page_size_bytes": g.real_page_size_bytes,
                    "pages_per_request": g.pages_per_request,
                    "block_table_width": g.block_table_width,
                }
                for g in self.groups
            ],
            "slots": [{"page_size_bytes": s.page_size_bytes, "layers": list(s.layers), "page_local": s.page_local}
                      for s in self.slots],
            "pool_bytes_per_block": self.pool_bytes_per_block,
            "pool_bytes": self.pool_bytes,
            "mamba_page_padding_bytes": self.block.mamba_page_padding_bytes,
            "cudagraph": {
                "support": self.cudagraph.support.name,
                "limited_by": self.cudagraph.limited_by,
                "requested_mode": self.cudagraph.requested_mode.value,
                "mode": self.cudagraph.mode.value,
                "downgrades": list(self.cudagraph.downgrades),
                "capture_sizes": {"decode": list(self.cudagraph.capture_sizes.decode),
                                  "mixed": list(self.cudagraph.capture_sizes.mixed)},
                "max_capture_size": self.cudagraph.max_capture_size,
            },
            "ledger": {
                "budget_bytes": self.ledger.budget_bytes,
                "entries": [{"name": e.name, "bytes": e.nbytes, "reason": e.reason, "in_kv_budget": e.in_kv_budget,
                             "on_device": e.on_device} for e in self.ledger.entries],
                "graph_keys": [{"num_tokens": k.num_tokens, "uniform": k.uniform, "bytes": k.nbytes,
                                "reason": k.reason} for k in self.ledger.graph_keys],
                "runtime": {kind: {**attrs.asdict(self.ledger.runtime_bytes(kind)),
                                   **({"caching_allocator": _cuda_memory_dict(self.ledger)} if kind == "cuda" else {}),
                                   "allocations": [a.to_dict() for a in self.ledger.allocations(kind)]}
                            for kind in ("cuda", "cpu")},
            },
            "notes": list(self.notes),
        }


def _cuda_memory_dict(ledger: Ledger) -> dict[str, Any]:
    """``ledger.cuda_memory()`` per phase, as ``--json`` carries it under ``ledger.runtime.cuda``."""
    memory = ledger.cuda_memory()
    return {phase: {"tensor_bytes": b.tensor_bytes, "allocated_bytes": b.allocated_bytes,
                    "reserved_bytes": b.reserved_bytes}
            for phase, b in (("pool", memory.pool), ("static_buffers", memory.static_buffers))}
