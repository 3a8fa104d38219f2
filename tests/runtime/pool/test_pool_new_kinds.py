"""The runtime pool on the new layer kinds: indexer keys, KDA / lightning / short-conv states, KV-shared
layers (no view of their own) and V heads smaller than K (refused by allocate with a PlanError)."""

from __future__ import annotations

import pytest
import torch

import graphkv
from graphkv import (CachelessDecl, FullAttentionSpec, IndexerKeySpec, KVSharedSpec, LayerDecl, Limits, MambaSpec,
                     MLASpec, ModelKV, PlanError, SpecError)
from graphkv.runtime import allocate

LIMITS = Limits(max_model_len=256, max_num_seqs=2, max_num_batched_tokens=64, num_blocks_override=40)
ATTN = FullAttentionSpec(num_kv_heads=2, head_size=8, dtype="float32")


def plan_of(model: ModelKV) -> graphkv.Plan:
    """The plan of ``model`` with a 40-page pool."""
    return graphkv.compile(model, LIMITS, None)


def test_indexer_keys_are_a_uint8_latent_view_in_their_own_slot():
    """MLA latents (N, 64, 24) float32 and indexer keys (N, 64, 132) uint8: writing one never touches the other."""
    mla = MLASpec(kv_lora_rank=16, rope_dim=8, dtype="float32")
    model = ModelKV.from_specs("dsv32", [(mla, "flashmla"), (IndexerKeySpec(head_size=132), "indexer")])
    pool = allocate(plan_of(model))
    latent, keys = pool.kv_cache("layers.0"), pool.kv_cache("layers.1")
    assert (latent.shape, latent.dtype, keys.shape, keys.dtype) == ((40, 64, 24), torch.float32, (40, 64, 132),
                                                                    torch.uint8)
    latent[3].fill_(1.5)
    assert int(keys.sum()) == 0
    keys[3].fill_(7)
    assert bool((latent[3] == 1.5).all()) and int(keys[3].sum()) == 7 * 64 * 132
    assert pool.nbytes == pool.plan.pool_bytes


@pytest.mark.parametrize(("state", "backend", "shapes", "dtypes"), [
    (MambaSpec(shapes=((3, 24), (2, 4, 4)), dtypes=("bfloat16", "float32"), variant="kda"), "kda",
     [(40, 3, 24), (40, 2, 4, 4)], [torch.bfloat16, torch.float32]),
    (MambaSpec(shapes=((2, 8, 8),), dtypes=("bfloat16",), variant="lightning"), "lightning", [(40, 2, 8, 8)],
     [torch.bfloat16]),
    (MambaSpec(shapes=((2, 32),), dtypes=("bfloat16",), variant="short_conv"), "short_conv", [(40, 2, 32)],
     [torch.bfloat16]),
])
def test_state_variants_get_typed_views_beside_attention(state, backend, shapes, dtypes):
    """Each recurrent variant is viewed as (num_blocks, *shape) per state in its dtype; a state page write stays
    inside its page (the attention pages before and after it keep their bytes)."""
    pool = allocate(plan_of(ModelKV.from_specs("h", [(ATTN, "flash_attn"), (state, backend)])))
    views = pool.mamba_states("layers.1")
    assert [tuple(v.shape) for v in views] == shapes and [v.dtype for v in views] == dtypes
    cache = pool.kv_cache("layers.0")  # kv-first, page-local: page b is cache.select(1, b)
    cache.select(1, 5).fill_(2.0)
    cache.select(1, 7).fill_(3.0)
    for view in views:
        view[6] = 1
    assert bool((cache.select(1, 5) == 2.0).all()) and bool((cache.select(1, 7) == 3.0).all())
    assert all(bool((view[6] == 1).all()) and int(view[8].abs().sum()) == 0 for view in views)


def test_kv_shared_layer_gets_no_view_of_its_own():
    """A layer reading another layer's KV holds no cache: the pool has no view for it and says so."""
    model = ModelKV(name="shared", layers=[LayerDecl(index=0, name="layers.0", spec=ATTN, backend="flash_attn")],
                    cacheless=[CachelessDecl(index=1, name="layers.1", spec=KVSharedSpec(source="layers.0"))])
    pool = allocate(plan_of(model))
    assert list(pool.attention) == ["layers.0"] and pool.states == {}
    with pytest.raises(SpecError, match=r"layer='layers.1': is not a KV layer of this plan"):
        pool.kv_cache("layers.1")


def test_v_head_smaller_than_k_is_refused_by_allocate():
    """K 8 / V 4 cannot be viewed as one (.., 2, kbs, H, D) cache: allocate raises PlanError naming head_size_v."""
    spec = FullAttentionSpec(num_kv_heads=2, head_size=8, head_size_v=4, dtype="float32")
    plan = plan_of(ModelKV.from_specs("mimo", [(spec, "flash_attn")]))
    with pytest.raises(PlanError, match=r"layers.0.head_size_v=4: .* needs head_size_v == head_size=8"):
        allocate(plan)
