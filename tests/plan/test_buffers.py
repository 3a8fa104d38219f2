"""Step 5: shapes and dtypes of the persistent static buffers."""

from graphkv import Budget, DType, FullAttentionSpec, Limits, ModelKV, SlidingWindowSpec, compile_plan
from graphkv.plan.buffers import flex_kv_indices_width

FULL = FullAttentionSpec(num_kv_heads=8, head_size=128)  # 65536 B per 16-token page


def test_block_tables_per_group_have_their_own_widths():
    """Full and sliding groups get (max_num_seqs, pages * bpk) int32 tables of different widths."""
    sliding = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=256)
    model = ModelKV.from_specs("m", [(FULL, "flash_attn"), (sliding, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=1024),
                        Budget.kv_bytes("1GiB"))
    # full: cdiv(4096, 16) = 256; sliding, 2 steps in flight: cdiv(min(255 + 2 x 1024, 4096) = 2303, 16) + 1 = 145.
    assert plan.buffers["block_table.0"].shape == (8, 256)
    assert plan.buffers["block_table.1"].shape == (8, 145)
    assert plan.buffers["block_table.0"].dtype is DType.INT32
    assert plan.buffers["block_table.0"].nbytes == 8 * 256 * 4


def test_block_table_width_counts_kernel_blocks():
    """A flashinfer group at block 128 (kernel 64, bpk 2) has 2 columns per page."""
    model = ModelKV.from_specs("m", [(FULL, "flashinfer")])
    plan = compile_plan(model, Limits(block_size=128, max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=1024),
                        Budget.kv_bytes("1GiB"))
    # cdiv(4096, 128) = 32 pages x bpk 2 = 64 kernel blocks.
    assert plan.buffers["block_table.0"].shape == (8, 64)


def test_slot_mapping_and_step_inputs():
    """slot_mapping is (num_groups, max_num_batched_tokens) int64; inputs are sized by tokens and sequences."""
    sliding = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=256)
    model = ModelKV.from_specs("m", [(FULL, "flash_attn"), (sliding, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=1024),
                        Budget.kv_bytes("1GiB"))
    b = plan.buffers
    assert (b["slot_mapping"].shape, b["slot_mapping"].dtype) == ((2, 1024), DType.INT64)
    assert (b["input_ids"].shape, b["input_ids"].dtype) == ((1024,), DType.INT64)
    assert (b["positions"].shape, b["positions"].dtype) == ((1024,), DType.INT64)
    assert (b["query_start_loc"].shape, b["query_start_loc"].dtype) == ((9,), DType.INT32)
    assert (b["seq_lens"].shape, b["seq_lens"].dtype) == ((8,), DType.INT32)
    assert "flex.0.kv_num_blocks" not in b


def test_flex_buffers_sized_by_step_tokens_not_sequence_length():
    """max_model_len 512 with 8192 tokens per step: 64 query tiles, each with 128 x 32 = 4096 kernel blocks."""
    model = ModelKV.from_specs("m", [(FULL, "flex")])
    plan = compile_plan(model, Limits(max_model_len=512, max_num_batched_tokens=8192), Budget.kv_bytes("1GiB"))
    # q_tile 128: cdiv(8192, 128) = 64 rows (not cdiv(512, 128) = 4).
    # width = min(min(128, max_num_seqs 256) * cdiv(512, 16) = 4096, pool kernel blocks 16384 * 1) = 4096.
    assert plan.num_blocks == 16384  # 1 GiB // 65536
    assert plan.buffers["flex.0.kv_num_blocks"].shape == (64,)
    assert plan.buffers["flex.0.kv_indices"].shape == (64, 4096)
    assert plan.buffers["flex.0.kv_indices"].dtype is DType.INT32


def test_flex_indices_width_capped_by_sequences_and_pool():
    """The kv_indices width is min(min(q_tile, max_num_seqs) * cdiv(len, kbs), pool kernel blocks)."""
    model = ModelKV.from_specs("m", [(FULL, "flex")])
    # max_num_seqs 4: min(128, 4) * 32 = 128.
    few = compile_plan(model, Limits(max_model_len=512, max_num_seqs=4, max_num_batched_tokens=8192),
                       Budget.kv_bytes("1GiB"))
    assert few.buffers["flex.0.kv_indices"].shape == (64, 128)
    # override 1000 blocks: min(4096, 1000 * bpk 1) = 1000.
    small_pool = compile_plan(model, Limits(max_model_len=512, max_num_batched_tokens=8192, num_blocks_override=1000))
    assert small_pool.buffers["flex.0.kv_indices"].shape == (64, 1000)


def test_flex_indices_width_function():
    """flex_kv_indices_width follows its documented formula on hand-picked numbers."""
    # min(min(128, 256) * cdiv(1000, 64) = 128 * 16 = 2048, 10**6) = 2048.
    assert flex_kv_indices_width(q_tile_tokens=128, max_model_len=1000, kernel_block_size=64, max_num_seqs=256,
                                 num_kernel_blocks=10**6) == 2048
    assert flex_kv_indices_width(q_tile_tokens=128, max_model_len=1000, kernel_block_size=64, max_num_seqs=3,
                                 num_kernel_blocks=10**6) == 48
    assert flex_kv_indices_width(q_tile_tokens=128, max_model_len=1000, kernel_block_size=64, max_num_seqs=256,
                                 num_kernel_blocks=100) == 100


def test_static_buffers_total_bytes():
    """total_bytes sums every buffer: hand count for one full group, 8 sequences, 1024 tokens, 4096 tokens each."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=1024),
                        Budget.kv_bytes("1GiB"))
    # input_ids 1024*8 + positions 1024*8 + query_start_loc 9*4 + seq_lens 8*4 + idx_mapping 8*4
    # + block_table (8, 256)*4 + slot_mapping (1, 1024)*8
    assert plan.buffers.total_bytes == 8192 + 8192 + 36 + 32 + 32 + 8192 + 8192
