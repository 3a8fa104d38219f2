"""Paged decode attention kernel (triton_paged) on every device present: mixed lengths, GQA, windows, sinks,
soft-caps, split-KV, every layout; the split rule's numbers; capture and replay on a GPU."""

from __future__ import annotations

import functools

import pytest
import torch
from runtime_plans import ORDERS, STRIDES, attention_plan

from graphkv import CacheOrder, KVLayout, SpecError
from graphkv.kernels.decode_splits import workspace_row_floats
from graphkv.kernels.paged_attention import (decode_workspace, decode_workspace_shape, num_decode_splits,
                                             paged_decode_attention)
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


# --- split-KV: awkward sizes on raw cache views of every layout -----------------------------------------------------


def _raw_cache(order: str, stride: str, num_blocks: int, kbs: int, heads: int, head_size: int, dtype: torch.dtype,
               device: str, gen: torch.Generator) -> tuple[torch.Tensor, KVLayout]:
    """A random cache as the logical (block, kv, token, head, dim) or (kv, block, ...) view of storage laid out
    NHD or HND, and its layout."""
    physical = (num_blocks, 2) if order == "blocks_first" else (2, num_blocks)
    inner = (kbs, heads, head_size) if stride == "NHD" else (heads, kbs, head_size)
    storage = torch.randn(*physical, *inner, generator=gen).to(device, dtype)
    cache = storage if stride == "NHD" else storage.permute(0, 1, 3, 2, 4)
    return cache, KVLayout(order=ORDERS[order], stride=STRIDES[stride])


def _raw_batch(order: str, stride: str, *, kbs: int, group: int, kv_heads: int, head_size: int, seq_lens, device: str,
               dtype: torch.dtype = torch.float32, seed: int = 0):
    """Cache, layout, query ``[num_seqs, group * kv_heads, head_size]``, a table of distinct random kernel blocks
    (one spare column of junk) and seq_lens."""
    gen = torch.Generator().manual_seed(seed)
    width = -(-max(max(seq_lens), 1) // kbs) + 1
    num_blocks = len(seq_lens) * width + 3
    cache, layout = _raw_cache(order, stride, num_blocks, kbs, kv_heads, head_size, dtype, device, gen)
    table = torch.randperm(num_blocks, generator=gen)[:len(seq_lens) * width].view(len(seq_lens), width)
    query = torch.randn(len(seq_lens), group * kv_heads, head_size, generator=gen).to(device, dtype)
    return (cache, layout, query, table.to(device, torch.int32).contiguous(),
            torch.tensor(seq_lens, dtype=torch.int32, device=device))


# (order, stride, kbs, group, kv_heads, head_size, seq_lens, window, num_splits)
AWKWARD = {
    "bf-NHD-kbs16-mha-d64-one-split": ("blocks_first", "NHD", 16, 1, 2, 64, (0, 1, 54, 97, 232), None, 1),
    "bf-HND-kbs16-gqa2-d80-3-splits": ("blocks_first", "HND", 16, 2, 2, 80, (1, 54, 97, 232, 0), None, 3),
    "kf-NHD-kbs64-gqa5-d128-page-ends": ("kv_first", "NHD", 64, 5, 1, 128, (64, 128, 232, 1), None, 4),
    "kf-HND-kbs64-gqa8-d64-2-splits": ("kv_first", "HND", 64, 8, 1, 64, (97, 0, 192), None, 2),
    "bf-NHD-kbs16-gqa4-d128-window-40": ("blocks_first", "NHD", 16, 4, 2, 128, (232, 48, 16, 1), 40, 4),
    "kf-NHD-kbs16-gqa2-d64-window-300": ("kv_first", "NHD", 16, 2, 2, 64, (54, 97, 232), 300, 5),
    "bf-HND-kbs64-gqa8-d80-window-65-many-splits": ("blocks_first", "HND", 64, 8, 1, 80, (232, 97, 64), 65, 8),
    "kf-HND-kbs16-gqa1-d128-rule-splits": ("kv_first", "HND", 16, 1, 1, 128, (1000,), None, None),  # 4 splits
    "kf-NHD-kbs16-gqa2-d128-20-splits": ("kv_first", "NHD", 16, 2, 1, 128, (1250, 3), None, 20),  # 2 combine chunks
}


@pytest.mark.parametrize("case", list(AWKWARD), ids=list(AWKWARD))
def test_split_kv_decode_matches_reference_over_awkward_sizes(case, device):
    """Every layout, kernel block 16/64, GQA 1/2/5/8, head 64/80/128, windows, 1..20 splits, padding rows: as fp64."""
    order, stride, kbs, group, kv_heads, head_size, seq_lens, window, num_splits = AWKWARD[case]
    cache, layout, query, table, lens = _raw_batch(order, stride, kbs=kbs, group=group, kv_heads=kv_heads,
                                                   head_size=head_size, seq_lens=seq_lens, device=device)
    out = paged_decode_attention(query, cache, table, lens, layout=layout, sliding_window=window, num_splits=num_splits)
    want = paged_decode_attention_ref(query, cache, table, lens, layout=layout, sliding_window=window)
    torch.testing.assert_close(out.cpu().double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("sinks,softcap", [(True, None), (None, 5.0), (True, 5.0)], ids=["sinks", "softcap", "both"])
def test_sinks_and_softcap_match_reference(sinks, softcap, num_splits, device):
    """Sink logits join only the denominator and scores are soft-capped, with one split or several (padding row: 0)."""
    cache, layout, query, table, lens = _raw_batch("blocks_first", "NHD", kbs=16, group=4, kv_heads=2, head_size=64,
                                                   seq_lens=(97, 0, 232, 1), device=device, seed=1)
    query = query * 4  # large scores, so the cap bites
    sink = torch.linspace(-3, 6, 8, device=device) if sinks else None  # one large enough to dominate
    out = paged_decode_attention(query, cache, table, lens, layout=layout, sinks=sink, softcap=softcap,
                                 num_splits=num_splits, scale=0.2)
    want = paged_decode_attention_ref(query, cache, table, lens, layout=layout, sinks=sink, softcap=softcap, scale=0.2)
    torch.testing.assert_close(out.cpu().double(), want, atol=1e-5, rtol=1e-5)
    assert (out[1] == 0).all()


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_half_precision_splits_with_sinks_accumulate_in_fp32(dtype, tol, device):
    """Half-precision caches with 3 splits and bfloat16 sinks match the fp64 reference within the output's rounding."""
    cache, layout, query, table, lens = _raw_batch("kv_first", "HND", kbs=16, group=2, kv_heads=2, head_size=128,
                                                   seq_lens=(232, 54, 0), device=device, dtype=dtype, seed=2)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.bfloat16, device=device)
    out = paged_decode_attention(query, cache, table, lens, layout=layout, sinks=sinks, num_splits=3)
    want = paged_decode_attention_ref(query, cache, table, lens, layout=layout, sinks=sinks)
    assert out.dtype == dtype
    torch.testing.assert_close(out.cpu().double(), want, atol=tol, rtol=tol)


def test_persistent_workspace_holds_neutral_partials_for_empty_splits(device):
    """Given out and workspace are written in place; splits with no tokens leave (acc 0, max -1e30, sum 0), no NaN."""
    cache, layout, query, table, lens = _raw_batch("blocks_first", "NHD", kbs=16, group=2, kv_heads=2, head_size=64,
                                                   seq_lens=(54, 0), device=device)
    workspace = torch.full((8, 4, workspace_row_floats(64)), float("nan"), device=device)  # 2 seqs x 4 splits
    out = torch.full_like(query, float("nan"))
    result = paged_decode_attention(query, cache, table, lens, layout=layout, out=out, workspace=workspace,
                                    num_splits=4)
    assert result.data_ptr() == out.data_ptr()
    partials = workspace.view(2, 4, 4, -1).cpu()  # [seq, split, q head, row]
    empty = torch.cat([partials[0, 1:], partials[1]]).flatten(0, 1)  # 54 tokens fill one 64-token tile: split 0
    assert (empty[:, :64] == 0).all() and (empty[:, 64] == -1e30).all() and (empty[:, 65] == 0).all()
    assert torch.isfinite(partials[0, 0, :, :66]).all()
    want = paged_decode_attention_ref(query, cache, table, lens, layout=layout)
    torch.testing.assert_close(out.cpu().double(), want, atol=1e-5, rtol=1e-5)


def test_split_rule_numbers():
    """One split when seqs x KV heads reach 2 programs per SM; else enough to fill, >= 64 tokens each, <= 128."""
    rule = functools.partial(num_decode_splits, kernel_block_size=16)
    assert rule(1, num_kv_heads=8, table_width_kernel_blocks=2048) == 33  # 32k tokens: 264 programs
    assert rule(32, num_kv_heads=8, table_width_kernel_blocks=1024) == 2  # 256 < 264
    assert rule(33, num_kv_heads=8, table_width_kernel_blocks=1024) == 1  # 264 programs fill 132 SMs twice
    assert rule(1, num_kv_heads=8, table_width_kernel_blocks=32) == 8  # 512 tokens: 64 per split (64 programs)
    assert rule(4, num_kv_heads=2, table_width_kernel_blocks=15) == 3  # 240 tokens: 3 splits of >= 64
    assert rule(4, num_kv_heads=2, table_width_kernel_blocks=3) == 1  # 48 tokens: too short to split
    assert rule(1, num_kv_heads=1, table_width_kernel_blocks=100_000) == 128  # the cap
    assert rule(1, num_kv_heads=1, table_width_kernel_blocks=2048, num_sms=1) == 2
    assert num_decode_splits(1, num_kv_heads=8, table_width_kernel_blocks=8, kernel_block_size=64) == 8  # 1 per split
    assert num_decode_splits(1, num_kv_heads=8, table_width_kernel_blocks=8, kernel_block_size=512) == 8


def test_workspace_shape_covers_every_batch_that_splits(device):
    """Rows = the largest num_seqs x num_splits over batches up to max_num_seqs that split; rows of 16 bytes."""
    shape = functools.partial(decode_workspace_shape, table_width_kernel_blocks=2048, kernel_block_size=16)
    assert shape(256, num_q_heads=32, num_kv_heads=8, head_size=128) == (64, 32, 132)  # 32 seqs x 2 splits
    assert shape(1, num_q_heads=32, num_kv_heads=8, head_size=128) == (33, 32, 132)
    assert shape(4, num_q_heads=8, num_kv_heads=1, head_size=80) == (264, 8, 84)  # 4 seqs x 66 splits
    assert shape(8, num_q_heads=300, num_kv_heads=300, head_size=64) == (1, 300, 68)  # never splits
    for n in range(1, 257):
        splits = num_decode_splits(n, num_kv_heads=8, table_width_kernel_blocks=2048, kernel_block_size=16)
        assert splits == 1 or n * splits <= 64
    workspace = decode_workspace(256, num_q_heads=32, num_kv_heads=8, head_size=128, table_width_kernel_blocks=2048,
                                 kernel_block_size=16, device=device)
    assert (workspace.shape, workspace.dtype, workspace.device.type) == ((64, 32, 132), torch.float32, device)


def test_split_launcher_rejects_misuse(device):
    """Bad sinks, soft-caps, scales, split counts, dtypes and small workspaces raise SpecError naming the argument."""
    cache, layout, query, table, lens = _raw_batch("blocks_first", "NHD", kbs=16, group=2, kv_heads=2, head_size=64,
                                                   seq_lens=(54, 1), device=device)
    args = (query, cache, table, lens)
    with pytest.raises(SpecError, match=r"sinks=\(\(3,\).*must be \[4\] \(one logit per query head\)"):
        paged_decode_attention(*args, layout=layout, sinks=torch.zeros(3, device=device))
    with pytest.raises(SpecError, match=r"softcap=0.0: must be None or a finite float > 0"):
        paged_decode_attention(*args, layout=layout, softcap=0.0)
    with pytest.raises(SpecError, match="scale=nan"):
        paged_decode_attention(*args, layout=layout, scale=float("nan"))
    with pytest.raises(SpecError, match=r"num_splits=0: must be None or 1\.\.128"):
        paged_decode_attention(*args, layout=layout, num_splits=0)
    with pytest.raises(SpecError, match=r"query.dtype=.*cast query to the cache's dtype \(torch.float32\)"):
        paged_decode_attention(query.half(), cache, table, lens, layout=layout)
    with pytest.raises(SpecError, match=r"workspace=\(\(5, 4, 68\).*must be float32 \[>= 6 \(num_seqs \* num_splits\), "
                                        r"4, >= 66\].*decode_workspace\(max_num_seqs"):
        paged_decode_attention(*args, layout=layout, num_splits=3, workspace=torch.zeros(5, 4, 68, device=device))
    with pytest.raises(SpecError, match=r"(?s)2 problems:.*softcap.*num_sms"):
        paged_decode_attention(*args, layout=layout, softcap=-1.0, num_sms=0)
    with pytest.raises(SpecError, match=r"num_kv_heads=0: must be an int >= 1"):
        num_decode_splits(1, num_kv_heads=0, table_width_kernel_blocks=8, kernel_block_size=16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU to capture and replay a CUDA graph")
def test_split_decode_replays_in_a_cuda_graph_after_the_tables_change():
    """Captured once with persistent out and workspace (2 kernels), replayed with new tables and lengths: as fp64."""
    cache, layout, query, table, lens = _raw_batch("blocks_first", "NHD", kbs=16, group=4, kv_heads=2, head_size=128,
                                                   seq_lens=(1000, 97), device="cuda", dtype=torch.bfloat16)
    assert num_decode_splits(2, num_kv_heads=2, table_width_kernel_blocks=table.shape[1], kernel_block_size=16) == 16
    workspace = decode_workspace(2, num_q_heads=8, num_kv_heads=2, head_size=128, kernel_block_size=16,
                                 table_width_kernel_blocks=table.shape[1], device="cuda")
    out = torch.empty_like(query)
    sinks = torch.randn(8, device="cuda")

    def launch() -> None:
        paged_decode_attention(query, cache, table, lens, layout=layout, sinks=sinks, out=out, workspace=workspace)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        launch()  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    gen = torch.Generator().manual_seed(5)
    for new_lens in ((1, 1000), (54, 0), (800, 600)):
        table.copy_(table[torch.randperm(2, generator=gen)].roll(1, dims=1))
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want = paged_decode_attention_ref(query, cache, table, lens, layout=layout, sinks=sinks)
        torch.testing.assert_close(out.cpu().double(), want, atol=2e-2, rtol=2e-2)
