"""Attention / state backend capability descriptors: data, not code paths.

A backend says which kernel block sizes it can address, how well it can be captured in a CUDA
graph, and the logical order of its cache tensor (from which the block dimension is *read*, never
guessed from a shape: with ``num_blocks == 2`` blocks-first and kv-first shapes coincide).

Example::

    >>> b = get_backend("flashinfer")
    >>> b.supports(32), b.preferred_block_size(16)
    (True, 16)
"""

from __future__ import annotations

import enum
import types
from typing import Mapping, Union

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec._checks import Checker, as_int

__all__ = [
    "ARCH_DEPENDENT_BACKENDS",
    "BUILTIN_BACKENDS",
    "Backend",
    "CacheOrder",
    "CudaGraphSupport",
    "KVLayout",
    "KernelBlockSize",
    "MultipleOf",
    "StrideOrder",
    "get_backend",
]


@attrs.frozen
class MultipleOf:
    """Any kernel block size that is a positive multiple of ``n``."""

    n: int = attrs.field(converter=as_int)

    def __attrs_post_init__(self) -> None:
        check = Checker("MultipleOf")
        check.positive_int("n", self.n)
        check.raise_if_any()

    def accepts(self, size: int) -> bool:
        """Whether ``size`` is a positive multiple of ``n``."""
        return size > 0 and size % self.n == 0

    def __str__(self) -> str:
        return f"MultipleOf({self.n})"


KernelBlockSize = Union[int, MultipleOf]


class CudaGraphSupport(enum.IntEnum):
    """How much of a step a backend can run inside a captured CUDA graph (higher is more)."""

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2
    ALWAYS = 3


class CacheOrder(enum.Enum):
    """Logical order of an attention cache tensor's leading dimensions."""

    BLOCKS_FIRST = "blocks_first"  # (num_blocks, 2, kernel_block_size, heads, head_size)
    KV_FIRST = "kv_first"  # (2, num_blocks, kernel_block_size, heads, head_size)
    LATENT = "latent"  # (num_blocks, kernel_block_size, head_size) — MLA
    STATE = "state"  # (num_blocks, *state_shape) — Mamba-style states


class StrideOrder(enum.Enum):
    """Physical order of the last three dims of an attention page: tokens-heads-dim or heads-tokens-dim."""

    NHD = "NHD"
    HND = "HND"


@attrs.frozen(kw_only=True)
class KVLayout:
    """A cache layout: logical dimension order plus the physical stride order."""

    order: CacheOrder
    stride: StrideOrder = StrideOrder.NHD

    def __attrs_post_init__(self) -> None:
        check = Checker("KVLayout")
        if not isinstance(self.order, CacheOrder):
            check.add("order", self.order, f"must be a CacheOrder ({', '.join(o.name for o in CacheOrder)})",
                      "pass e.g. order=CacheOrder.BLOCKS_FIRST")
        if not isinstance(self.stride, StrideOrder):
            check.add("stride", self.stride, "must be StrideOrder.NHD or StrideOrder.HND",
                      "pass e.g. stride=StrideOrder.NHD")
        check.raise_if_any()

    @property
    def block_dim(self) -> int:
        """Index of the block (page) dimension in the logical shape — declared, not guessed."""
        return 1 if self.order is CacheOrder.KV_FIRST else 0

    def logical_shape(self, num_blocks: int, kernel_block_size: int, num_heads: int, head_size: int) -> tuple[int, ...]:
        """The logical cache shape for this layout."""
        if self.order is CacheOrder.BLOCKS_FIRST:
            return (num_blocks, 2, kernel_block_size, num_heads, head_size)
        if self.order is CacheOrder.KV_FIRST:
            return (2, num_blocks, kernel_block_size, num_heads, head_size)
        if self.order is CacheOrder.LATENT:
            return (num_blocks, kernel_block_size, head_size)
        raise SpecError(Problem(field="KVLayout.order", value=self.order.value,
                                limit="state layouts have no attention shape",
                                fix="use MambaSpec shapes for state layers"))


def _sizes(value: object) -> object:
    if isinstance(value, (int, MultipleOf)):
        return (value,)
    try:
        return tuple(value)  # type: ignore[arg-type]
    except TypeError:
        return value


@attrs.frozen(kw_only=True, cache_hash=True)  # hashed per layer when layers are grouped
class Backend:
    """Capabilities of one attention (or state) implementation.

    ``supported_kernel_block_sizes`` mixes exact ints and :class:`MultipleOf`; ``q_tile_tokens``
    is the query tile of block-sparse backends (flex attention), ``None`` elsewhere.
    """

    name: str
    supported_kernel_block_sizes: tuple[KernelBlockSize, ...] = attrs.field(converter=_sizes)
    cudagraph_support: CudaGraphSupport
    kv_layout: KVLayout
    is_ssm: bool = False
    is_mla: bool = False
    q_tile_tokens: int | None = attrs.field(default=None, converter=as_int)

    def __attrs_post_init__(self) -> None:
        check = Checker(f"Backend[{self.name}]")
        sizes = self.supported_kernel_block_sizes
        if not isinstance(sizes, tuple) or not sizes:
            check.add("supported_kernel_block_sizes", sizes, "must list at least one size",
                      "give exact ints and/or MultipleOf(n)")
        else:
            for s in sizes:
                if isinstance(s, MultipleOf):
                    continue
                if isinstance(s, bool) or not isinstance(s, int) or s <= 0:
                    check.add("supported_kernel_block_sizes", s, "each entry must be an int > 0 or MultipleOf(n)",
                              "remove or fix that entry")
        if not isinstance(self.cudagraph_support, CudaGraphSupport):
            check.add("cudagraph_support", self.cudagraph_support,
                      f"must be a CudaGraphSupport ({', '.join(m.name for m in CudaGraphSupport)})",
                      "pass e.g. cudagraph_support=CudaGraphSupport.ALWAYS")
        if not isinstance(self.kv_layout, KVLayout):
            check.add("kv_layout", self.kv_layout, "must be a KVLayout",
                      "pass e.g. kv_layout=KVLayout(order=CacheOrder.BLOCKS_FIRST)")
        if self.q_tile_tokens is not None:
            check.positive_int("q_tile_tokens", self.q_tile_tokens)
        check.raise_if_any()

    def supports(self, kernel_block_size: int) -> bool:
        """Whether this backend can address pages of ``kernel_block_size`` tokens."""
        return any(s.accepts(kernel_block_size) if isinstance(s, MultipleOf) else s == kernel_block_size
                   for s in self.supported_kernel_block_sizes)

    def smallest_kernel_block_size(self) -> int:
        """The smallest kernel block size this backend supports."""
        return min(s.n if isinstance(s, MultipleOf) else s for s in self.supported_kernel_block_sizes)

    def preferred_block_size(self, default: int = 16) -> int:
        """``default`` if supported, else the smallest supported size."""
        return default if self.supports(default) else self.smallest_kernel_block_size()

    def describe_sizes(self) -> str:
        """The supported sizes as text, e.g. ``[64, MultipleOf(16)]``."""
        return "[" + ", ".join(str(s) for s in self.supported_kernel_block_sizes) + "]"


_PAGED_NHD_BLOCKS_FIRST = KVLayout(order=CacheOrder.BLOCKS_FIRST, stride=StrideOrder.NHD)
_STATE = KVLayout(order=CacheOrder.STATE)

BUILTIN_BACKENDS: Mapping[str, Backend] = types.MappingProxyType({
    b.name: b
    for b in (
        # graphkv's own flex-attention backend: block masks built from block tables into
        # persistent buffers, so a whole mixed step is capturable.
        Backend(name="flex", supported_kernel_block_sizes=(MultipleOf(16),),
                cudagraph_support=CudaGraphSupport.ALWAYS,
                kv_layout=KVLayout(order=CacheOrder.KV_FIRST, stride=StrideOrder.NHD), q_tile_tokens=128),
        # graphkv's own Triton paged attention kernel.
        Backend(name="triton_paged", supported_kernel_block_sizes=(MultipleOf(16),),
                cudagraph_support=CudaGraphSupport.ALWAYS, kv_layout=_PAGED_NHD_BLOCKS_FIRST),
        # FlashAttention 3 (Hopper): varlen kernels capture mixed batches.
        Backend(name="flash_attn", supported_kernel_block_sizes=(MultipleOf(16),),
                cudagraph_support=CudaGraphSupport.ALWAYS,
                kv_layout=KVLayout(order=CacheOrder.KV_FIRST, stride=StrideOrder.NHD)),
        # FlashInfer paged kernels: HND pages, decode wrappers capture single-token batches only.
        Backend(name="flashinfer", supported_kernel_block_sizes=(16, 32, 64),
                cudagraph_support=CudaGraphSupport.UNIFORM_SINGLE_TOKEN_DECODE,
                kv_layout=KVLayout(order=CacheOrder.BLOCKS_FIRST, stride=StrideOrder.HND)),
        # FlashAttention 3's MLA kernels (Hopper; bf16 / fp16 caches): vLLM 0.33's first MLA backend on sm_90.
        Backend(name="flash_attn_mla", supported_kernel_block_sizes=(MultipleOf(16),),
                cudagraph_support=CudaGraphSupport.UNIFORM_BATCH,
                kv_layout=KVLayout(order=CacheOrder.LATENT), is_mla=True),
        # FlashMLA decode kernel: fixed 64-token pages.
        Backend(name="flashmla", supported_kernel_block_sizes=(64,),
                cudagraph_support=CudaGraphSupport.UNIFORM_BATCH,
                kv_layout=KVLayout(order=CacheOrder.LATENT), is_mla=True),
        Backend(name="triton_mla", supported_kernel_block_sizes=(MultipleOf(16),),
                cudagraph_support=CudaGraphSupport.UNIFORM_BATCH,
                kv_layout=KVLayout(order=CacheOrder.LATENT), is_mla=True),
        # DeepSeek-V3.2 / GLM-5 indexer keys: 64-token pages on CUDA (vLLM 0.33 DeepseekV32IndexerBackend).
        Backend(name="indexer", supported_kernel_block_sizes=(64,),
                cudagraph_support=CudaGraphSupport.UNIFORM_BATCH,
                kv_layout=KVLayout(order=CacheOrder.LATENT), is_mla=True),
        # State backends: one page holds one whole state.
        Backend(name="mamba", supported_kernel_block_sizes=(MultipleOf(1),),
                cudagraph_support=CudaGraphSupport.UNIFORM_BATCH, kv_layout=_STATE, is_ssm=True),
        Backend(name="gdn", supported_kernel_block_sizes=(MultipleOf(1),),
                cudagraph_support=CudaGraphSupport.UNIFORM_BATCH, kv_layout=_STATE, is_ssm=True),
        Backend(name="kda", supported_kernel_block_sizes=(MultipleOf(1),),
                cudagraph_support=CudaGraphSupport.UNIFORM_BATCH, kv_layout=_STATE, is_ssm=True),
        Backend(name="short_conv", supported_kernel_block_sizes=(MultipleOf(1),),
                cudagraph_support=CudaGraphSupport.UNIFORM_BATCH, kv_layout=_STATE, is_ssm=True),
        # MiniMax lightning attention: vLLM 0.33's linear-attention backend captures single-token decode only.
        Backend(name="lightning", supported_kernel_block_sizes=(MultipleOf(1),),
                cudagraph_support=CudaGraphSupport.UNIFORM_SINGLE_TOKEN_DECODE, kv_layout=_STATE, is_ssm=True),
    )
})


ARCH_DEPENDENT_BACKENDS = ("flash_attn", "flashinfer", "flash_attn_mla", "flashmla")
"""Built-in backends whose kernel blocks or CUDA-graph support differ by GPU architecture, or that need Hopper
(:mod:`graphkv.spec.hf.gpu_attention`, :mod:`graphkv.spec.hf.gpu_backends`): their built-in descriptors are an
H100's."""


def get_backend(name: "str | Backend") -> Backend:
    """Look up a built-in backend by name (a :class:`Backend` passes through)."""
    if isinstance(name, Backend):
        return name
    try:
        return BUILTIN_BACKENDS[name]
    except (KeyError, TypeError):
        raise SpecError(Problem(field="backend", value=name, limit=f"must be one of {sorted(BUILTIN_BACKENDS)}",
                                fix="pick a built-in backend name or pass a Backend descriptor")) from None
