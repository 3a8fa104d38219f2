"""Step 2: the kernel block size of each group, chosen from its backends' supported sizes."""

import pytest

from graphkv import (Backend, Budget, CacheOrder, CudaGraphSupport, FullAttentionSpec, KVLayout, Limits, MambaSpec,
                     ModelKV, MultipleOf, PlanError, compile_plan, get_backend)
from graphkv.plan.kernel_blocks import choose_kernel_block_size

_LAYOUT = KVLayout(order=CacheOrder.BLOCKS_FIRST)


def backend(name: str, *sizes) -> Backend:
    """A custom attention backend supporting exactly ``sizes``."""
    return Backend(name=name, supported_kernel_block_sizes=sizes, cudagraph_support=CudaGraphSupport.ALWAYS,
                   kv_layout=_LAYOUT)


def test_block_size_kept_when_every_backend_supports_it():
    """[MultipleOf(32)] and [64, MultipleOf(16)] both accept 128, so the kernel block is 128."""
    assert choose_kernel_block_size(128, [backend("a", MultipleOf(32)), backend("b", 64, MultipleOf(16))]) == 128


def test_largest_common_divisor_size_when_block_size_unsupported():
    """[128, 64] and [64, 32] at 256: 128 only in the first, 32 only in the second, so 64."""
    assert choose_kernel_block_size(256, [backend("a", 128, 64), backend("b", 64, 32)]) == 64


def test_multiple_of_candidates_must_divide_block_size():
    """flashinfer [16, 32, 64] with flash_attn [MultipleOf(16)] at 128 picks 64, the largest common divisor."""
    assert choose_kernel_block_size(128, [get_backend("flashinfer"), get_backend("flash_attn")]) == 64
    # At 96 = 3 * 32: flashinfer's 64 does not divide 96, so 32.
    assert choose_kernel_block_size(96, [get_backend("flashinfer"), get_backend("flash_attn")]) == 32


def test_no_common_size_names_backends_and_sizes():
    """[64] and [MultipleOf(16)] at 48 have no common divisor size: PlanError naming both backends and sizes."""
    with pytest.raises(PlanError) as info:
        choose_kernel_block_size(48, [backend("fixed64", 64), backend("mult16", MultipleOf(16))], group="group 3")
    message = str(info.value)
    assert info.value.field == "block_size"
    assert info.value.value == 48
    assert "fixed64 [64]" in message
    assert "mult16 [MultipleOf(16)]" in message
    assert "group 3" in message


def test_state_backends_address_whole_pages():
    """A Mamba group's kernel block is its whole page (bpk 1), whatever the page size."""
    assert choose_kernel_block_size(272, [get_backend("mamba"), get_backend("gdn")]) == 272


def test_disagreeing_backends_in_one_group_through_compile():
    """Two same-spec layers on [128, 64] and [64, 32] share a group with kernel block 64 and bpk 4 at block 256."""
    spec = FullAttentionSpec(num_kv_heads=8, head_size=128)
    model = ModelKV.from_specs("mixed", [(spec, backend("a", 128, 64)), (spec, backend("b", 64, 32))])
    # block 256, max_model_len 1024: 4 pages per request, bpk 256 // 64 = 4, block table width 16.
    plan = compile_plan(model, Limits(block_size=256, max_model_len=1024), Budget.kv_bytes("1GiB"))
    (group,) = plan.groups
    assert group.backends == ("a", "b")
    assert group.kernel_block_size == 64
    assert group.bpk == 4
    assert group.block_table_width == 16
    step_rows = {a.name: a for a in plan.ledger.allocations("cuda")}["tables.device"].part("step_rows")
    assert step_rows.shape == (256 * 16,)  # the (max_num_seqs 256, 16) step table


def test_hybrid_attention_group_splits_pages_and_mamba_group_does_not():
    """In a hybrid plan at block 272 flashinfer gets kernel block 16 (bpk 17) and the Mamba group bpk 1."""
    attn = FullAttentionSpec(num_kv_heads=2, head_size=64)  # A1 = 512 B/token
    mamba = MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=("bfloat16", "float32"))  # M = 137216 B
    # B = 16 * cdiv(137216, 8192) = 272 = 16 * 17; flashinfer [16, 32, 64]: only 16 divides 272 -> bpk 17.
    model = ModelKV.from_specs("h", [(attn, "flashinfer"), (mamba, "mamba")])
    plan = compile_plan(model, Limits(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=2720),
                        Budget.kv_bytes("64MiB"))
    assert plan.block_size == 272
    assert [(g.kernel_block_size, g.bpk) for g in plan.groups] == [(16, 17), (272, 1)]
    # attention: cdiv(2720, 272) = 10 pages x 17 = 170 kernel blocks; Mamba: 1 page x 1.
    assert [g.block_table_width for g in plan.groups] == [170, 1]


def test_incompatible_group_through_compile_raises_plan_error():
    """compile raises PlanError when one group's backends share no kernel block size dividing block_size."""
    spec = FullAttentionSpec(num_kv_heads=8, head_size=128)
    model = ModelKV.from_specs("bad", [(spec, backend("fixed64", 64)), (spec, backend("mult16", MultipleOf(16)))])
    with pytest.raises(PlanError, match=r"group 0: no kernel block size is supported by all of fixed64 \[64\]"):
        compile_plan(model, Limits(block_size=48, max_model_len=480), Budget.kv_bytes("1GiB"))
