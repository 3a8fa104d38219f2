"""Step 7: every byte of the KV budget attributed, with the reason for each number."""

from graphkv import (Budget, FullAttentionSpec, Limits, MambaSpec, ModelKV, SlidingWindowSpec, compile_plan)

FULL = FullAttentionSpec(num_kv_heads=8, head_size=128)  # 65536 B per 16-token page


def kv_entries(plan) -> dict:
    """The KV-budget entries of a plan by name."""
    return {e.name: e.nbytes for e in plan.ledger.kv_entries}


def test_entries_sum_exactly_to_the_budget():
    """Two full layers, 1 GiB + 1000 B, max_model_len 4096: KV, null page, spare pages and remainder add up."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")] * 2)
    plan = compile_plan(model, Limits(max_model_len=4096), Budget.kv_bytes(2**30 + 1000))
    # ppb 131072 -> 8192 blocks, remainder 1000 B; usable 8191; 256 pages per request -> 31 requests, 7936 pages;
    # KV = 7936 x 2 layers x 65536 = 1040187392; spare 8191 - 7936 = 255 pages x 131072 = 33423360.
    assert plan.capacity.max_concurrency == 31
    assert kv_entries(plan) == {
        "group 0 full_attention KV": 1040187392,
        "null page": 131072,
        "spare pages": 33423360,
        "unallocated remainder": 1000,
    }
    assert plan.ledger.budget_bytes == 2**30 + 1000
    assert plan.ledger.kv_total_bytes == 2**30 + 1000


def test_override_without_budget_makes_the_budget_the_pool():
    """With num_blocks_override and no budget, the budget is num_blocks * pool_bytes_per_block."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")] * 2)
    plan = compile_plan(model, Limits(num_blocks_override=32))
    assert plan.ledger.budget_bytes == 32 * 131072
    assert plan.ledger.kv_total_bytes == 32 * 131072
    # 31 usable pages, max_model_len 496 needs all 31: no spare, no remainder.
    assert kv_entries(plan) == {"group 0 full_attention KV": 31 * 2 * 65536, "null page": 131072}


def test_mamba_page_padding_is_its_own_entry():
    """Hybrid: Mamba groups report real state bytes and the 2048 B per page padding separately."""
    attn = FullAttentionSpec(num_kv_heads=2, head_size=64)  # A1 = 512
    mamba = MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=("bfloat16", "float32"))  # M = 137216
    model = ModelKV.from_specs("h", [(attn, "flash_attn") if c == "A" else (mamba, "mamba") for c in "AMMMAMMM"])
    plan = compile_plan(model, Limits(max_num_seqs=32, max_num_batched_tokens=2048, num_blocks_override=100))
    # block 272, page 139264, gs 2, ppb 278528; auto 26112 -> 96 + 3 = 99 pages = all usable -> 1 request.
    assert kv_entries(plan) == {
        "group 0 full_attention KV": 96 * 2 * 139264,  # 26738688
        "group 1 mamba KV": 2 * 137216,
        "group 1 page padding": 2 * 2048,
        "group 2 mamba KV": 2 * 137216,
        "group 2 page padding": 2 * 2048,
        "group 3 mamba KV": 2 * 137216,
        "group 3 page padding": 2 * 2048,
        "null page": 278528,
    }
    assert plan.ledger.kv_total_bytes == 100 * 278528


def test_groups_with_fewer_layers_than_slots_report_empty_slots():
    """12 sliding + 13 full (gs 13): the sliding group leaves slot 12 empty on its pages."""
    sliding = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=512)
    model = ModelKV.from_specs("m", [(sliding, "flash_attn")] * 12 + [(FULL, "flash_attn")] * 13)
    plan = compile_plan(model, Limits(max_model_len=1024, max_num_batched_tokens=512, num_blocks_override=200))
    # sliding: cdiv(min(511 + 512, 1024) = 1023, 16) + 1 = 65 pages; full: 64; 129 per request; 199 // 129 = 1.
    entries = kv_entries(plan)
    assert entries["group 0 sliding_window KV"] == 65 * 12 * 65536
    assert entries["group 0 empty slots"] == 65 * 1 * 65536
    assert entries["group 1 full_attention KV"] == 64 * 13 * 65536
    assert entries["spare pages"] == (199 - 129) * 13 * 65536
    assert plan.ledger.kv_total_bytes == 200 * 13 * 65536


def test_uniform_group_padding_is_per_slot():
    """One uniform group with a padded layer: padding is that slot's page minus its real page."""
    padded = FullAttentionSpec(num_kv_heads=2, head_size=128, page_size_padded=20000)  # real 16384 at block 16
    model = ModelKV.from_specs("m", [(FULL, "flash_attn"), (padded, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=160, num_blocks_override=11))
    # ppb 65536 + 20000 = 85536; 10 pages per request fill the 10 usable pages.
    assert kv_entries(plan) == {"group 0 full_attention KV": 10 * (65536 + 16384),
                                "group 0 page padding": 10 * (20000 - 16384),
                                "null page": 85536}


def test_static_buffers_and_graph_pool_sit_beside_the_budget():
    """Beside the KV budget: the CUDA runtime's device buffers, its host buffers and each capture key's graph memory."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")], hidden_size=4096)
    plan = compile_plan(model, Limits(max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=64,
                                      max_cudagraph_capture_size=64),  # every step captured, not vLLM's 16 tokens
                        Budget.kv_bytes("1GiB"))
    other = {e.name: e for e in plan.ledger.other_entries}
    # 64 pages per request x 8 rows: two device tables 2 x 512 int32 = 4096, group offset + width 12, staged page
    # entries 2 x (8 + 64 / 16) = 24 x 3 int64 = 576, idx_mapping 32, int32 metadata (3 x 8 + 2) x 4 = 104,
    # int64 metadata (2 x 8 + 4 x 64) x 8 = 2176, token ids 64 x 8 = 512.
    assert other["static buffers"].nbytes == 4096 + 12 + 576 + 32 + 104 + 2176 + 512 == 7508
    assert other["host buffers"].on_device is False and other["static buffers"].on_device is True
    assert other["host buffers"].nbytes == plan.ledger.runtime_bytes("cuda").host_bytes
    # Uncalibrated: each key keeps 4096 x 2 B of outputs per token; the first (64 tokens) also reserves the
    # workspace, 4 x 4096 x 2 B per token.
    tokens = [k.num_tokens for k in plan.ledger.graph_keys]
    assert tokens == [64, 56, 48, 40, 32, 24, 16, 8, 8, 4, 4, 2, 2, 1, 1]
    assert plan.ledger.graph_keys[0].nbytes == 64 * 8192 + 64 * 4 * 8192
    assert other["graph pool"].nbytes == sum(tokens) * 8192 + 64 * 4 * 8192 == 4636672
    assert "UNCALIBRATED" in other["graph pool"].reason
    assert plan.ledger.kv_total_bytes == 2**30


def test_allocator_rounding_sits_beside_the_budget_on_the_device():
    """Two full layers in 1 GiB: the pool's two 512 MiB slots fill whole 2 MiB segments (+0 B); the step's 369,300 B
    of device buffers take one 2 MiB small segment (+1,727,852 B); the GPU loses that much beside the pool."""
    model = ModelKV.from_specs("tiny", [(FULL, "flash_attn")] * 2)
    plan = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=8), Budget.kv_bytes("1GiB"))
    other = {e.name: e for e in plan.ledger.other_entries}
    rounding = other["allocator rounding"]
    assert other["static buffers"].nbytes == 369_300
    assert rounding.nbytes == 0 + (2 * 2**20 - 369_300) == 1_727_852
    assert rounding.on_device and not rounding.in_kv_budget
    assert "pool +0 B (2 slot(s)), static buffers +1727852 B (8 buffer(s))" in rounding.reason
    assert [e.name for e in plan.ledger.other_entries] == ["static buffers", "allocator rounding", "lazy workspaces",
                                                           "host buffers", "graph pool"]
    lazy = 2 * (32 + 2) * 2**20  # cuBLAS 32 MiB + cuBLASLt 1 MiB (a 2 MiB small segment) on 2 streams, sm_90 assumed
    assert other["lazy workspaces"].nbytes == lazy
    assert plan.ledger.beside_pool_device_bytes == 369_300 + 1_727_852 + lazy + other["graph pool"].nbytes
