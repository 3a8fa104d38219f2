"""Step 5: shapes and dtypes of the flex mask buffers, and of the step buffers the ledger allocates."""

from graphkv import Budget, DType, FullAttentionSpec, Limits, ModelKV, SlidingWindowSpec, compile_plan
from graphkv.plan.buffers import flex_kv_indices_width

FULL = FullAttentionSpec(num_kv_heads=8, head_size=128)  # 65536 B per 16-token page


def _cuda(plan):
    """The plan's CUDA allocations by name."""
    return {a.name: a for a in plan.ledger.allocations("cuda")}


def _step_rows(plan):
    """The step's block tables (every group's (max_num_seqs, width) table, packed) and their allocation."""
    tables = _cuda(plan)["tables.device"]
    return tables.part("step_rows"), tables


def test_block_tables_per_group_have_their_own_widths():
    """Full and sliding groups get (max_num_seqs, pages * bpk) int32 tables of different widths."""
    sliding = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=256)
    model = ModelKV.from_specs("m", [(FULL, "flash_attn"), (sliding, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=1024),
                        Budget.kv_bytes("1GiB"))
    # full: cdiv(4096, 16) = 256; sliding, 2 steps in flight: cdiv(min(255 + 2 x 1024, 4096) = 2303, 16) + 1 = 145.
    rows, tables = _step_rows(plan)
    assert [g.block_table_width for g in plan.groups] == [256, 145]
    assert rows.shape == (8 * 256 + 8 * 145,)  # (8, 256) then (8, 145)
    assert tables.dtype is DType.INT32
    assert 8 * plan.groups[0].block_table_width * tables.dtype.itemsize == 8 * 256 * 4


def test_block_table_width_counts_kernel_blocks():
    """A flashinfer group at block 128 (kernel 64, bpk 2) has 2 columns per page."""
    model = ModelKV.from_specs("m", [(FULL, "flashinfer")])
    plan = compile_plan(model, Limits(block_size=128, max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=1024),
                        Budget.kv_bytes("1GiB"))
    # cdiv(4096, 128) = 32 pages x bpk 2 = 64 kernel blocks.
    assert plan.groups[0].block_table_width == 64
    assert _step_rows(plan)[0].shape == (8 * 64,)


def test_slot_mapping_and_step_inputs():
    """slot_mapping is (num_groups, max_num_batched_tokens) int64; inputs are sized by tokens and sequences."""
    sliding = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=256)
    model = ModelKV.from_specs("m", [(FULL, "flash_attn"), (sliding, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=1024),
                        Budget.kv_bytes("1GiB"))
    b = _cuda(plan)
    i32, i64 = b["staging.int32"], b["staging.int64"]
    assert (i64.part("slot_mappings").shape, i64.dtype) == ((2, 1024), DType.INT64)
    assert (b["step.input_ids"].shape, b["step.input_ids"].dtype) == ((1024,), DType.INT64)
    assert (i64.part("positions").shape, i64.dtype) == ((1024,), DType.INT64)
    assert (i32.part("query_start_loc").shape, i32.dtype) == ((9,), DType.INT32)
    assert (i32.part("seq_lens").shape, i32.dtype) == ((8,), DType.INT32)
    assert "flex.0.kv_num_blocks" not in plan.buffers and "flex.0.kv_num_blocks" not in b


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


def test_step_input_buffers_bytes():
    """The CUDA step's inputs, hand counted for one full group, 8 sequences, 1024 tokens, 4096 tokens each."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=1024),
                        Budget.kv_bytes("1GiB"))
    b = _cuda(plan)
    i32, i64, tables = b["staging.int32"], b["staging.int64"], b["tables.device"]

    def nbytes(allocation, part):
        return allocation.part(part).numel * allocation.dtype.itemsize

    # input_ids 1024*8 + positions 1024*8 + query_start_loc 9*4 + seq_lens 8*4 + idx_mapping 8*4
    # + block_table (8, 256)*4 + slot_mapping (1, 1024)*8
    total = (b["step.input_ids"].nbytes + nbytes(i64, "positions") + nbytes(i32, "query_start_loc")
             + nbytes(i32, "seq_lens") + b["tables.idx_mapping"].nbytes + nbytes(tables, "step_rows")
             + nbytes(i64, "slot_mappings"))
    assert total == 8192 + 8192 + 36 + 32 + 32 + 8192 + 8192
