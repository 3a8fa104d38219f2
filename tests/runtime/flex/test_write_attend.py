"""write_and_attend: the branch-free K/V write (padding to the null page) and the fused attention call."""

import pytest
import torch

from graphkv.runtime import allocate
from graphkv.runtime.flex.attention import paged_flex_attention
from graphkv.runtime.flex.write_attend import write_and_attend, write_kv_padding_to_null
from graphkv.runtime.ops.reference import reshape_and_cache_ref, slot_mapping_ref

from flex_reference import builder_for, make_paged_batch
from runtime_plans import hybrid_plan


def kv_first_cache(page_local: bool) -> tuple[torch.Tensor, object]:
    """A kv-first cache view with random contents: page-local (a hybrid pool's slot) or split."""
    if page_local:
        pool = allocate(hybrid_plan(order="kv_first", num_blocks=6))
        cache = pool.kv_cache("layers.0")
        cache.copy_(torch.randn(cache.shape))
        return cache, pool.layout("layers.0")
    from graphkv.spec.backends import CacheOrder, KVLayout
    return torch.randn(2, 6, 16, 2, 8), KVLayout(order=CacheOrder.KV_FIRST)


@pytest.mark.parametrize("page_local", [False, True])
def test_write_matches_reference_and_padding_lands_in_the_null_page(page_local: bool) -> None:
    """Real tokens are written as reshape_and_cache_ref writes them; padding touches slot 0 only."""
    cache, layout = kv_first_cache(page_local)
    kbs = cache.shape[2]
    gen = torch.Generator().manual_seed(3)
    slots = torch.tensor([17, 18, 95, -1, 40, -1, 16 * 5 + 3, -1], dtype=torch.int64)
    key = torch.randn(slots.shape[0], 2, 8, generator=gen)
    value = torch.randn(slots.shape[0], 2, 8, generator=gen)
    expected = cache.clone()
    reshape_and_cache_ref(key, value, expected, slots, layout=layout)
    write_kv_padding_to_null(key, value, cache, slots)
    assert torch.equal(cache[:, 1:], expected[:, 1:])  # every kernel block but the null one
    assert torch.equal(cache[:, 0, 1:], expected[:, 0, 1:])  # the null block beyond slot 0
    padding = {tuple(key[t].flatten().tolist()) for t in (3, 5, 7)}
    assert tuple(cache[0, 0, 0].flatten().tolist()) in padding and kbs == 16


def test_write_and_attend_equals_a_write_then_paged_flex_attention() -> None:
    """The fused call returns what writing the step's K/V and then paged_flex_attention return."""
    batch = make_paged_batch(query_lens=[1, 5, 33], seq_lens=[20, 5, 40], kernel_block_size=16, max_num_seqs=4,
                             num_tokens_padded=44, hq=4, hkv=2, seed=5)
    builder = builder_for(batch, bpk=1, window=None)
    mask = builder.build(batch.num_reqs, num_tokens_padded=44)
    gen = torch.Generator().manual_seed(6)
    key, value = torch.randn(44, 2, batch.query.shape[2], generator=gen), torch.randn(44, 2, batch.query.shape[2],
                                                                                     generator=gen)
    # Slots: each request's new tokens (its last query_len positions) through its table; padding -1.
    table, kbs = batch.block_table, batch.kernel_block_size
    positions = torch.cat([torch.arange(s - q, s) for q, s in zip([1, 5, 33], [20, 5, 40])])
    slots = slot_mapping_ref(batch.query_start_loc, positions, [table], [kbs], batch.num_reqs, 44)[0]
    fused_cache = batch.kv_cache.clone()
    out, lse = write_and_attend(batch.query, key, value, fused_cache, slots, mask, scale=0.3, return_lse=True)
    write_kv_padding_to_null(key, value, batch.kv_cache, slots)
    ref, ref_lse = paged_flex_attention(batch.query, batch.kv_cache, mask, scale=0.3, return_lse=True)
    assert torch.equal(fused_cache, batch.kv_cache)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, ref_lse)
    # The log-sum-exp of the first request's one token (position 19) over its 20 keys, by hand.
    positions = torch.arange(20)
    keys = batch.kv_cache[0][table[0, positions // kbs].long(), positions % kbs]  # [20, Hkv, D]
    scores = torch.einsum("hd,nhd->hn", batch.query[0], keys.repeat_interleave(2, dim=1)) * 0.3
    torch.testing.assert_close(lse[0], scores.logsumexp(-1), atol=1e-5, rtol=1e-5)
    assert torch.isinf(lse[39:]).all()  # padding tokens
