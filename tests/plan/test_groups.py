"""Step 3: bucketing layers into KV-cache groups, the group size rule and pool slots."""

import pytest

from graphkv import (Budget, FullAttentionSpec, Limits, MambaSpec, MLASpec, ModelKV, PlanError, SlidingWindowSpec,
                     compile_plan)
from graphkv.plan.groups import build_groups, group_size_rule

FULL = FullAttentionSpec(num_kv_heads=8, head_size=128)  # 8 * 256 * 2 = 4096 B/token, 65536 B per 16-token page
SLIDING = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=1024)  # same page as FULL


def test_group_size_rule_min_unless_close():
    """gs is the smallest bucket, or the largest when largest < 1.5 * smallest."""
    assert group_size_rule([3, 7]) == 3  # 7 >= 4.5
    assert group_size_rule([12, 13]) == 13  # 13 < 18
    assert group_size_rule([2, 3]) == 2  # 3 == 1.5 * 2 is not below it
    assert group_size_rule([4, 5]) == 5  # 5 < 6
    assert group_size_rule([1, 1, 1]) == 1


def test_three_full_seven_sliding_groups_interleave():
    """3 full (0-2) + 7 sliding (3-9): gs 3, groups [0,1,2] [3,6,9] [4,7] [5,8]."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")] * 3 + [(SLIDING, "flash_attn")] * 7)
    plan = compile_plan(model, Limits(max_model_len=4096), Budget.kv_bytes("1GiB"))
    assert plan.group_size == 3
    assert [g.layers for g in plan.groups] == [(0, 1, 2), (3, 6, 9), (4, 7), (5, 8)]
    # Slot j holds the j-th layer of every group.
    assert [s.layers for s in plan.slots] == [(0, 3, 4, 5), (1, 6, 7, 8), (2, 9)]
    assert plan.pool_bytes_per_block == 3 * 65536
    assert plan.group_of(7).index == 2
    assert plan.slot_of(7).index == 1


def test_twelve_sliding_thirteen_full_use_the_larger_group_size():
    """12 sliding + 13 full: 13 < 1.5 * 12 so gs 13, one group each, 13 slots."""
    model = ModelKV.from_specs("m", [(SLIDING, "flash_attn")] * 12 + [(FULL, "flash_attn")] * 13)
    plan = compile_plan(model, Limits(max_model_len=4096), Budget.kv_bytes("1GiB"))
    assert plan.group_size == 13
    assert [len(g.layers) for g in plan.groups] == [12, 13]
    assert len(plan.slots) == 13
    assert plan.slots[12].layers == (24,)
    assert plan.pool_bytes_per_block == 13 * 65536


def test_smaller_page_that_divides_the_largest_gets_a_scaled_block_size():
    """A 4-head sliding page (half the 8-head page) gets block size 32 so all pages are 65536 bytes."""
    small = SlidingWindowSpec(num_kv_heads=4, head_size=128, window=512)  # 2048 B/token, 32768 B at 16 tokens
    model = ModelKV.from_specs("m", [(FULL, "flash_attn"), (small, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=4096), Budget.kv_bytes("1GiB"))
    assert [g.block_size for g in plan.groups] == [16, 32]
    assert [g.page_size_bytes for g in plan.groups] == [65536, 65536]
    assert [g.kernel_block_size for g in plan.groups] == [16, 32]
    assert "block size scaled to 32 tokens" in plan.notes[0]


def test_mla_page_scaled_to_the_attention_page():
    """An MLA page that divides the sliding page is scaled: 1152 B/token x 4 = 4608 B/token."""
    sliding = SlidingWindowSpec(num_kv_heads=9, head_size=128, window=512)  # 9 * 256 * 2 = 4608 B/token, 73728 B/page
    mla = MLASpec(kv_lora_rank=512, rope_dim=64)  # 576 * 2 = 1152 B/token, 18432 B per 16-token page
    model = ModelKV.from_specs("m", [(sliding, "flash_attn"), (mla, "flashmla")])
    plan = compile_plan(model, Limits(max_model_len=4096, max_num_batched_tokens=1024), Budget.kv_bytes("1GiB"))
    # block size 64: flashmla does not take vLLM's default 16, so it is the smallest size both backends take
    # (lcm(16, 64)); ratio 73728 / 18432 = 4 -> MLA block 256, split into flashmla's 64-token kernel blocks.
    assert plan.block_size == 64
    assert [(g.block_size, g.kernel_block_size) for g in plan.groups] == [(64, 64), (256, 64)]
    # Pages per request at 4096: sliding cdiv(min(511 + 2 x 1024, 4096), 64) + 1 = 40 + 1, MLA cdiv(4096, 256) = 16.
    assert [g.pages_per_request for g in plan.groups] == [41, 16]


def test_mla_and_full_attention_share_one_group():
    """MLA keeps every token like full attention (vLLM groups both under FullAttentionSpec): one group, a slot each."""
    full = FullAttentionSpec(num_kv_heads=9, head_size=128)  # 9 * 256 * 2 = 4608 B/token
    mla = MLASpec(kv_lora_rank=512, rope_dim=64)  # 1152 B/token -> 73728 B per 64-token page
    model = ModelKV.from_specs("m", [(full, "flash_attn"), (mla, "flashmla")])
    plan = compile_plan(model, Limits(block_size=64, max_model_len=4096), Budget.kv_bytes("1GiB"))
    assert [g.layers for g in plan.groups] == [(0, 1)]
    # full at 64 tokens: 64 * 9 * 256 * 2 = 294912 B; MLA: 64 * 1152 = 73728 B.
    assert [s.page_size_bytes for s in plan.slots] == [294912, 73728]
    assert plan.groups[0].pages_per_request == 64


def test_page_that_does_not_divide_the_largest_is_padded():
    """A 3-head sliding page (24576 B) does not divide 65536 B: kept at block 16, padded, padding in the ledger."""
    odd = SlidingWindowSpec(num_kv_heads=3, head_size=128, window=512)
    model = ModelKV.from_specs("m", [(FULL, "flash_attn"), (odd, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=4096, max_num_batched_tokens=1024), Budget.kv_bytes("1GiB"))
    assert [(g.block_size, g.page_size_bytes, g.real_page_size_bytes) for g in plan.groups] == [
        (16, 65536, 65536), (16, 65536, 24576)]
    # 1 GiB // 65536 = 16384 pages; per request 256 full + cdiv(min(511 + 2048, 4096), 16) + 1 = 161 sliding.
    assert plan.num_blocks == 16384 and plan.capacity.max_concurrency == 16383 // (256 + 161)
    padding = {e.name: e.nbytes for e in plan.ledger.entries}["group 1 page padding"]
    assert padding == 39 * 161 * (65536 - 24576)
    assert any("padded to 65536 B" in note for note in plan.notes)


def test_mla_page_that_does_not_divide_takes_vllms_full_allocation_fallback():
    """An MLA page (18432 B) that does not divide a 40960 B sliding page: the sliding layer is allocated as full
    attention and both layers share one group, each its own slot (vLLM 0.33's fallback)."""
    odd = SlidingWindowSpec(num_kv_heads=5, head_size=128, window=512)  # 5 * 256 * 2 * 16 = 40960 B
    model = ModelKV.from_specs("m", [(odd, "flash_attn"), (MLASpec(kv_lora_rank=512, rope_dim=64), "triton_mla")])
    plan = compile_plan(model, Limits(max_model_len=4096), Budget.kv_bytes("1GiB"))
    assert [(g.kind.value, g.layer_names, g.pages_per_request) for g in plan.groups] == [
        ("mla", ("layers.0", "layers.1"), 256)]
    assert [s.page_size_bytes for s in plan.slots] == [40960, 18432]
    assert plan.num_blocks == (1 << 30) // (40960 + 18432) == 18078


def test_mla_page_that_does_not_divide_beside_a_state_is_an_error():
    """Beside a Mamba state the fallback cannot make one group, so the MLA page is refused with the reason."""
    odd = SlidingWindowSpec(num_kv_heads=5, head_size=128, window=512)
    mamba = MambaSpec(shapes=((4, 16, 16),), dtypes=("float32",))
    model = ModelKV.from_specs("m", [(odd, "flash_attn"), (MLASpec(kv_lora_rank=512, rope_dim=64), "triton_mla"),
                                     (mamba, "mamba")])
    # MLA beside a state: vLLM 0.33 makes the page a multiple of 128 tokens (MLA 128 x 1152 B, sliding 128 x 2560 B)
    with pytest.raises(PlanError, match=r"layers.1 .*page of 147456 bytes at block_size=128 must divide the largest "
                                        r"page \(327680.*fallback does not apply: recurrent-state layers"):
        compile_plan(model, Limits(max_model_len=4096), Budget.kv_bytes("1GiB"))


def test_uniform_type_with_different_head_sizes_is_one_group_with_per_layer_slots():
    """Full-attention layers of different sizes form one group; each slot has its layer's page; ppb = sum."""
    big = FULL  # 65536 B per page
    mid = FullAttentionSpec(num_kv_heads=8, head_size=96)  # 8 * 192 * 2 * 16 = 49152 B (does not divide 65536)
    small = FullAttentionSpec(num_kv_heads=2, head_size=128)  # 2 * 256 * 2 * 16 = 16384 B
    model = ModelKV.from_specs("m", [(big, "flash_attn"), (mid, "flash_attn"), (small, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=4096), Budget.kv_bytes("1GiB"))
    assert [g.layers for g in plan.groups] == [(0, 1, 2)]
    assert [s.page_size_bytes for s in plan.slots] == [65536, 49152, 16384]
    assert [s.layers for s in plan.slots] == [(0,), (1,), (2,)]
    assert plan.pool_bytes_per_block == 65536 + 49152 + 16384
    # 1 GiB // 131072 = 8192 blocks.
    assert plan.num_blocks == 8192


def test_build_groups_equal_specs_form_one_bucket():
    """Layers with equal specs are one bucket: 4 equal layers -> gs 4, one group, 4 slots of one page."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")] * 4)
    grouping = build_groups(model.layers, 16)
    assert grouping.group_size == 4
    assert [tuple(layer.index for layer in g.layers) for g in grouping.groups] == [(0, 1, 2, 3)]
    assert grouping.slot_page_bytes == (65536,) * 4
