"""Small plans for runtime tests: awkward page splits, both layouts, NHD/HND, hybrids."""

from __future__ import annotations

import graphkv
from graphkv import (Backend, CacheOrder, CudaGraphSupport, FullAttentionSpec, KVLayout, Limits, MambaSpec,
                     MLASpec, ModelKV, MultipleOf, SlidingWindowSpec, StrideOrder)

ORDERS = {"blocks_first": CacheOrder.BLOCKS_FIRST, "kv_first": CacheOrder.KV_FIRST}
STRIDES = {"NHD": StrideOrder.NHD, "HND": StrideOrder.HND}


def backend(order: str = "blocks_first", stride: str = "NHD", sizes: tuple = (MultipleOf(16),),
            name: str | None = None) -> Backend:
    """An attention backend with the given layout and kernel block sizes."""
    return Backend(name=name or f"test_{order}_{stride}", supported_kernel_block_sizes=sizes,
                   cudagraph_support=CudaGraphSupport.ALWAYS,
                   kv_layout=KVLayout(order=ORDERS[order], stride=STRIDES[stride]))


def attention_plan(*, order: str = "blocks_first", stride: str = "NHD", bpk: int = 1, num_blocks: int = 2,
                   heads: int = 2, head_size: int = 8, num_layers: int = 1, max_num_seqs: int = 2,
                   max_num_batched_tokens: int = 64, max_model_len: int | str = "auto",
                   dtype: str = "float32") -> graphkv.Plan:
    """Full attention with ``bpk`` kernel blocks of 32 tokens per page (block 544 for bpk 17) or
    16-token pages for bpk 1; ``num_blocks`` pages in the pool."""
    kbs = 16 if bpk == 1 else 32
    sizes = (MultipleOf(16),) if bpk == 1 else (32,)
    spec = FullAttentionSpec(num_kv_heads=heads, head_size=head_size, dtype=dtype)
    model = ModelKV.from_specs("attn", [(spec, backend(order, stride, sizes))] * num_layers)
    return graphkv.compile(model, Limits(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                                         max_num_batched_tokens=max_num_batched_tokens, block_size=kbs * bpk,
                                         num_blocks_override=num_blocks), None)


def hybrid_plan(*, order: str = "kv_first", stride: str = "NHD", num_blocks: int = 6, max_num_seqs: int = 2,
                sliding_window: int | None = None) -> graphkv.Plan:
    """Attention (+ optional sliding window) + a Mamba layer with two states of different dtypes,
    all sharing one pool slot; the Mamba page is padded up to the attention page."""
    attn = FullAttentionSpec(num_kv_heads=2, head_size=8, dtype="float32")
    mamba = MambaSpec(shapes=((3, 20), (2, 4, 8)), dtypes=("float32", "float16"))
    layers = [(attn, backend(order, stride)), (mamba, "mamba")]
    if sliding_window is not None:
        window = SlidingWindowSpec(num_kv_heads=2, head_size=8, dtype="float32", window=sliding_window)
        layers.append((window, backend("blocks_first", "HND", name="test_window")))
    model = ModelKV.from_specs("hybrid", layers)
    return graphkv.compile(model, Limits(max_model_len="auto", max_num_seqs=max_num_seqs,
                                         max_num_batched_tokens=32, num_blocks_override=num_blocks), None)


def mla_plan(*, num_blocks: int = 3) -> graphkv.Plan:
    """One MLA layer (latent cache ``(N, 16, 16)``) with 16-token pages."""
    model = ModelKV.from_specs("mla", [(MLASpec(kv_lora_rank=12, rope_dim=4, dtype="float32"), "triton_mla")])
    return graphkv.compile(model, Limits(max_model_len="auto", max_num_seqs=2, max_num_batched_tokens=64,
                                         num_blocks_override=num_blocks), None)


def widths_plan() -> graphkv.Plan:
    """Three groups of different block-table widths: full attention (bpk 2), sliding window
    (bpk 2, fewer pages) and Mamba (one page)."""
    full = FullAttentionSpec(num_kv_heads=1, head_size=8, dtype="float32")
    window = SlidingWindowSpec(num_kv_heads=1, head_size=8, dtype="float32", window=40)
    mamba = MambaSpec(shapes=((2, 16),), dtypes=("float32",))
    k16 = backend(sizes=(16,), name="k16")
    model = ModelKV.from_specs("widths", [(full, k16), (window, k16), (mamba, "mamba")])
    return graphkv.compile(model, Limits(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=32,
                                         block_size=32, num_blocks_override=64, max_concurrent_batches=1), None)
