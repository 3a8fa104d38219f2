"""Paged decode attention kernel (triton_paged) on every device present: mixed lengths, GQA, windows, every layout."""

from __future__ import annotations

import pytest
import torch
from runtime_plans import attention_plan

from graphkv import CacheOrder, KVLayout, SpecError
from graphkv.kernels.paged_attention import paged_decode_attention
from graphkv.runtime import allocate
from graphkv.runtime.ops.reference import paged_decode_attention_ref

SEQ_LENS = (1, 54, 97, 232)
LAYOUTS = [("blocks_first", "NHD"), ("blocks_first", "HND"), ("kv_first", "NHD"), ("kv_first", "HND")]


def _batch(order: str, stride: str, bpk: int, device: str, seq_lens=SEQ_LENS, dtype: str = "float32", seed: int = 0):
    """A filled pool on ``device`` and random, distinct kernel blocks per sequence (junk past each sequence)."""
    num_blocks = 3 if bpk == 17 else 64
    pool = allocate(attention_plan(order=order, stride=stride, bpk=bpk, num_blocks=num_blocks, heads=2,
                                   head_size=16, dtype=dtype, max_model_len=256), device)
    cache = pool.kv_cache(0)
    gen = torch.Generator().manual_seed(seed)
    cache.copy_(torch.randn(cache.shape, generator=gen))
    kbs = cache.shape[2]
    width = -(-max(seq_lens) // kbs)
    free = torch.randperm(cache.shape[pool.layout(0).block_dim], generator=gen)
    table = free[:len(seq_lens) * width].view(len(seq_lens), width).to(torch.int32).contiguous()
    query = torch.randn(len(seq_lens), 8, 16, generator=gen).to(device, cache.dtype)  # 8 q heads on 2 kv heads
    return pool, query, table.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device)


@pytest.mark.parametrize("bpk", [1, 17])
@pytest.mark.parametrize("order,stride", LAYOUTS)
def test_decode_matches_reference_for_mixed_lengths(order, stride, bpk, device):
    """Lengths 1, 54, 97, 232 in one batch with 4 query heads per KV head match the fp64 reference."""
    pool, query, table, seq_lens = _batch(order, stride, bpk, device)
    out = paged_decode_attention(query, pool.kv_cache(0), table, seq_lens, layout=pool.layout(0))
    want = paged_decode_attention_ref(query, pool.kv_cache(0), table, seq_lens, layout=pool.layout(0))
    assert out.device == query.device
    torch.testing.assert_close(out.cpu().double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [1, 40, 300])
def test_sliding_window_attends_only_the_last_tokens(window, device):
    """With a sliding window only the last `window` tokens count (a window longer than the sequence is a no-op)."""
    pool, query, table, seq_lens = _batch("blocks_first", "NHD", 1, device, seed=window)
    args = (query, pool.kv_cache(0), table, seq_lens)
    out = paged_decode_attention(*args, layout=pool.layout(0), sliding_window=window, scale=0.3)
    want = paged_decode_attention_ref(*args, layout=pool.layout(0), sliding_window=window, scale=0.3)
    torch.testing.assert_close(out.cpu().double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,tol", [("float16", 2e-3), ("bfloat16", 2e-2)])
def test_half_precision_accumulates_in_fp32(dtype, tol, device):
    """A float16 / bfloat16 cache and query give the reference result within the output's rounding."""
    pool, query, table, seq_lens = _batch("kv_first", "HND", 17, device, dtype=dtype)
    out = paged_decode_attention(query, pool.kv_cache(0), table, seq_lens, layout=pool.layout(0))
    want = paged_decode_attention_ref(query, pool.kv_cache(0), table, seq_lens, layout=pool.layout(0))
    assert out.dtype == getattr(torch, dtype)
    torch.testing.assert_close(out.cpu().double(), want, atol=tol, rtol=tol)


def test_padding_rows_give_zeros_and_out_is_reused(device):
    """Rows with seq_len 0 (batch padding) output zeros, written into the given out buffer."""
    pool, query, table, _ = _batch("blocks_first", "NHD", 1, device)
    seq_lens = torch.tensor([54, 0, 1, 0], dtype=torch.int32, device=device)
    out = torch.full_like(query, 5.0)
    result = paged_decode_attention(query, pool.kv_cache(0), table, seq_lens, layout=pool.layout(0), out=out)
    assert result.data_ptr() == out.data_ptr()
    assert (out[1] == 0).all() and (out[3] == 0).all()
    want = paged_decode_attention_ref(query, pool.kv_cache(0), table, seq_lens, layout=pool.layout(0))
    torch.testing.assert_close(out.cpu().double(), want, atol=1e-5, rtol=1e-5)


def test_launcher_rejects_misuse(device):
    """Bad GQA ratios, int64 tables, bad windows and latent layouts raise SpecError naming the argument."""
    pool, query, table, seq_lens = _batch("blocks_first", "NHD", 1, device)
    cache, layout = pool.kv_cache(0), pool.layout(0)
    with pytest.raises(SpecError, match="query"):
        paged_decode_attention(query[:, :3], cache, table, seq_lens, layout=layout)
    with pytest.raises(SpecError, match="block_table"):
        paged_decode_attention(query, cache, table.long(), seq_lens, layout=layout)
    with pytest.raises(SpecError, match="sliding_window"):
        paged_decode_attention(query, cache, table, seq_lens, layout=layout, sliding_window=0)
    with pytest.raises(SpecError, match="seq_lens"):
        paged_decode_attention(query, cache, table, seq_lens[:2], layout=layout)
    with pytest.raises(SpecError, match="latent"):
        paged_decode_attention(query, cache, table, seq_lens, layout=KVLayout(order=CacheOrder.LATENT))
