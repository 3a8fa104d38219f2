"""Today's vLLM (0.33) planning rules as graphkv defaults, each with explicit upstream numbers.

- sliding / chunked pages reserve ``window - 1 + max_concurrent_batches * max_num_batched_tokens``
  (``SlidingWindowSpec.max_admission_blocks_per_request``, ``VllmConfig.max_in_flight_tokens``);
- Mamba2 layers keep a prefill-checkpoint page in align mode (``MambaMixer2.get_kv_cache_spec``);
- non-MLA attention pages that do not divide the largest page are padded (``unify_kv_cache_spec_page_size``);
- sliding layers of one window and different head sizes share a group (``UniformTypeKVCacheSpecs``);
- Nemotron-H's SSM state is float32 unless the config says otherwise (``NemotronHForCausalLMConfig``).
"""

from __future__ import annotations

import attrs
import pytest

from graphkv import (Budget, ChunkedLocalSpec, FullAttentionSpec, Limits, MambaSpec, ModelKV, SlidingWindowSpec,
                     compile_plan)
from graphkv.presets import load_preset_config, preset_model
from graphkv.spec import DType
from graphkv.spec.hf_config import model_from_hf_config

GIB20 = Budget.kv_bytes("20GiB")


def sliding_pages(plan) -> int:
    """Pages per request of the plan's sliding-window group."""
    return next(g.pages_per_request for g in plan.groups if g.kind.value == "sliding_window")


@pytest.mark.parametrize(("batches", "expected"), [(2, 265), (1, 137), (4, 521)])
def test_gpt_oss_20b_sliding_pages_follow_steps_in_flight(batches, expected):
    """gpt-oss-20b at 2048 tokens per step: 265 sliding pages per request (2 steps in flight), 137 with 1."""
    # window 128, block 16: cdiv(127 + batches x 2048, 16) + 1 -> cdiv(4223, 16) + 1 = 265, cdiv(2175, 16) + 1 = 137,
    # cdiv(8319, 16) + 1 = 521.
    limits = Limits(max_num_batched_tokens=2048, max_model_len=32768, max_concurrent_batches=batches)
    assert sliding_pages(compile_plan(preset_model("gpt-oss-20b"), limits, GIB20)) == expected


def test_default_limits_keep_two_steps_in_flight():
    """Limits() leaves max_concurrent_batches to the pipeline depth: 2 on one stage (vLLM's async scheduling)."""
    assert Limits().max_concurrent_batches is None and Limits().concurrent_batches() == 2
    assert sliding_pages(compile_plan(preset_model("gpt-oss-20b"), Limits(max_num_batched_tokens=2048,
                                                                          max_model_len=32768), GIB20)) == 265


def test_multi_module_mtp_retains_lookahead_minus_one_tokens():
    """A 3-token MTP drafter reading ahead keeps 2 more tokens below the window: cdiv(4225, 16) + 1 = 266."""
    limits = Limits(max_num_batched_tokens=2048, max_model_len=32768, speculative_lookahead_tokens=3)
    assert limits.extra_retained_tokens == 2
    assert sliding_pages(compile_plan(preset_model("gpt-oss-20b"), limits, GIB20)) == 266


def test_chunked_local_pages_follow_steps_in_flight():
    """Llama-4 chunked attention (chunk 8192, block 16): cdiv(8192 + 2 x 8192, 16) = 1536 pages, 1024 with 1 step."""
    chunked = ChunkedLocalSpec(num_kv_heads=8, head_size=128, chunk=8192)
    model = ModelKV.from_specs("l4", [(chunked, "flash_attn")] * 3 + [(FullAttentionSpec(num_kv_heads=8, head_size=128),
                                                                        "flash_attn")])
    # With the hybrid manager kept (vLLM: VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1); by default vLLM 0.33
    # allocates chunked layers as full attention (tests/plan/test_promotion.py).
    limits = Limits(max_model_len=131072, max_num_batched_tokens=8192, disable_hybrid_kv_cache_manager=False)
    groups = compile_plan(model, limits, Budget.kv_bytes("80GiB")).groups
    assert [(g.kind.value, g.pages_per_request) for g in groups][:1] == [("chunked_local", 1536)]
    groups = compile_plan(model, attrs.evolve(limits, max_concurrent_batches=1), Budget.kv_bytes("80GiB")).groups
    assert groups[0].pages_per_request == 1024


def test_mamba2_align_plan_pages_per_request():
    """Nemotron-H-8B in align mode at 8192 tokens: 8 attention pages + 6 Mamba2 groups x 3 pages = 26 per request."""
    # A1 = 8 heads x 256 x 2 = 4096 B/token; state 4255744 B (float32 ssm) -> block 16 x cdiv(4255744, 65536) = 1040;
    # attention cdiv(8192, 1040) = 8; each Mamba2 group: 2 live + 1 prefill-checkpoint page.
    plan = compile_plan(preset_model("nemotron-h-8b"), Limits(mamba_cache_mode="align", max_model_len=8192,
                                                              max_num_seqs=16), GIB20)
    assert plan.block_size == 1040
    assert [g.pages_per_request for g in plan.groups] == [3] * 6 + [8]
    assert plan.capacity.pages_per_request == 26


def test_gated_delta_align_plan_keeps_a_checkpoint_page_on_64_token_multiples():
    """Qwen3-Next in align mode, as vLLM 0.33 plans it on sm_90 (FlashInfer's GDN prefill exports checkpoints every
    64 tokens: QwenGatedDeltaNetAttention.get_kv_cache_spec): pages are multiples of lcm(16, 64) = 64 tokens,
    64 x cdiv(1097728, 64 x 2048) = 576 (544 in mode none), and each gated-delta group keeps 2 + 1 checkpoint pages:
    cdiv(8192, 576) = 15 attention + 3 groups x 3 = 24. OLMo-Hybrid's gated delta exports none."""
    plan = compile_plan(preset_model("qwen3-next-80b-a3b"), Limits(mamba_cache_mode="align", max_model_len=8192,
                                                                   max_num_seqs=16), GIB20)
    assert plan.block_size == 576
    assert [g.pages_per_request for g in plan.groups] == [3, 3, 3, 15]
    assert plan.capacity.pages_per_request == 24
    none = compile_plan(preset_model("qwen3-next-80b-a3b"), Limits(mamba_cache_mode="none", max_model_len=8192,
                                                                   max_num_seqs=16), GIB20)
    assert none.block_size == 544 and [g.pages_per_request for g in none.groups] == [1, 1, 1, 16]


def test_non_divisible_hybrid_attention_page_is_padded_with_its_padding_in_the_ledger():
    """Full 8x128 + sliding 3x128 + a Mamba state: the sliding page does not divide and is padded, not refused."""
    full = FullAttentionSpec(num_kv_heads=8, head_size=128)  # 4096 B/token
    sliding = SlidingWindowSpec(num_kv_heads=3, head_size=128, window=512)  # 1536 B/token
    state = MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=("bfloat16", "float32"))  # 137216 B
    model = ModelKV.from_specs("h", [(full, "flash_attn"), (sliding, "flash_attn"), (state, "mamba"),
                                     (state, "mamba")], max_position_embeddings=16384)
    plan = compile_plan(model, Limits(max_model_len=16384, max_num_seqs=4, max_num_batched_tokens=1024),
                        Budget.kv_bytes("1GiB"))
    # block = 16 x cdiv(137216, 16 x 4096) = 48; pages: full 196608 B, sliding 73728 B (196608 % 73728 != 0).
    assert plan.block_size == 48
    sliding_group = next(g for g in plan.groups if g.kind.value == "sliding_window")
    assert (sliding_group.block_size, sliding_group.page_size_bytes, sliding_group.real_page_size_bytes) == (
        48, 196608, 73728)
    entries = {e.name: e for e in plan.ledger.entries}
    padding = entries[f"group {sliding_group.index} page padding"]
    # sliding pages per request: cdiv(min(511 + 2048, 16384), 48) + 1 = 54 + 1 = 55
    assert sliding_group.pages_per_request == 55
    assert padding.nbytes == plan.capacity.max_concurrency * 55 * (196608 - 73728)
    assert plan.ledger.kv_total_bytes == plan.ledger.budget_bytes


def test_same_window_sliding_layers_with_different_head_sizes_share_one_group():
    """Sliding layers of one window but different head sizes form one group with a slot each, like full attention."""
    a = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=4096)  # 65536 B per 16-token page
    b = SlidingWindowSpec(num_kv_heads=2, head_size=256, window=4096)  # 32768 B
    model = ModelKV.from_specs("s", [(a, "flash_attn"), (b, "flash_attn")] * 2, max_position_embeddings=32768)
    plan = compile_plan(model, Limits(max_num_batched_tokens=2048), Budget.kv_bytes("1GiB"))
    assert [g.layers for g in plan.groups] == [(0, 1, 2, 3)]
    assert [s.page_size_bytes for s in plan.slots] == [65536, 32768, 65536, 32768]
    # one request: cdiv(min(4095 + 4096, 32768), 16) + 1 = 513 pages; 1 GiB // 196608 B = 5461 blocks
    assert (plan.groups[0].pages_per_request, plan.num_blocks) == (513, 5461)
    other = SlidingWindowSpec(num_kv_heads=2, head_size=256, window=1024)
    split = compile_plan(ModelKV.from_specs("t", [(a, "flash_attn"), (other, "flash_attn")],
                                            max_position_embeddings=32768), Limits(max_num_batched_tokens=2048),
                         Budget.kv_bytes("1GiB"))
    assert len(split.groups) == 2  # two windows need different pages: never one group


def test_nemotron_h_ssm_state_is_float32_unless_the_config_says_otherwise():
    """The Nemotron-H preset plans a float32 SSM state (61440 + 4194304 B); a config saying bfloat16 halves the ssm."""
    plan = compile_plan(preset_model("nemotron-h-8b"), Limits(max_model_len=8192, max_num_seqs=128), GIB20)
    assert plan.block.mamba_state_bytes == 3 * 10240 * 2 + 128 * 64 * 128 * 4
    config = {**load_preset_config("nemotron-h-8b"), "mamba_ssm_cache_dtype": "bfloat16"}
    state = next(x.spec for x in model_from_hf_config(config).layers if x.spec.is_ssm)
    assert state.dtypes == (DType.BFLOAT16, DType.BFLOAT16) and state.page_size_bytes() == 61440 + 2097152
