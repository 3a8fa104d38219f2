"""Compile stays linear in the number of layers: a 10,000-layer model plans (numbers asserted, not time)."""

from __future__ import annotations

from graphkv import FullAttentionSpec, Limits, MambaSpec, ModelKV, SlidingWindowSpec, compile_plan

FULL = FullAttentionSpec(num_kv_heads=8, head_size=128)  # 65536 B per 16-token page
SLIDING = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=128)  # same page


def test_ten_thousand_layers_compile_with_exact_numbers():
    """5,000 sliding + 5,000 full layers: 2 groups of 5,000, 5,000 slots, max_model_len 14816 in 1,000 pages."""
    model = ModelKV.from_specs("deep", [(SLIDING if i % 2 == 0 else FULL, "flash_attn") for i in range(10_000)],
                               max_position_embeddings=131072)
    plan = compile_plan(model, Limits(max_num_seqs=8, max_num_batched_tokens=512, num_blocks_override=1000))
    assert [len(g.layers) for g in plan.groups] == [5000, 5000] and plan.group_size == 5000
    assert len(plan.slots) == 5000 and plan.pool_bytes_per_block == 5000 * 65536
    # sliding: cdiv(127 + 2 x 512, 16) + 1 = 73 pages; full: the other 999 - 73 = 926 pages -> 926 x 16 tokens
    assert [g.pages_per_request for g in plan.groups] == [73, 926]
    assert plan.max_model_len == 14816
    assert len(plan.to_dict()["layers"]) == 10_000


def test_ten_thousand_layer_hybrid_compiles():
    """7,500 gated-delta + 2,500 full layers: block 544, 4 groups of 2,500, one state page per group per request."""
    state = MambaSpec(shapes=((3, 8192), (32, 128, 128)), dtypes=("bfloat16", "bfloat16"), variant="gated_delta")
    attention = FullAttentionSpec(num_kv_heads=2, head_size=256)  # 2048 B/token
    model = ModelKV.from_specs("deep-hybrid", [(attention, "flash_attn") if i % 4 == 3 else (state, "gdn")
                                               for i in range(10_000)], max_position_embeddings=262144)
    plan = compile_plan(model, Limits(max_num_seqs=8, max_num_batched_tokens=512, num_blocks_override=200))
    # 16 x cdiv(1097728 state bytes, 16 x 2048) = 544 tokens per page (the Qwen3-Next block size)
    assert plan.block_size == 544 and plan.group_size == 2500
    assert [g.pages_per_request for g in plan.groups] == [1, 1, 1, 196]  # 199 usable - 3 state pages
    assert plan.max_model_len == 196 * 544
