"""Local attention allocated as full attention, number for number with vLLM 0.33.

The expected numbers come from running vLLM 0.33's own planning code (``get_kv_cache_groups``,
``get_kv_cache_configs``) on the same per-layer specs: the full-allocation fallback cases of its
KV-cache planning tests (``test_mla_with_incompatible_swa_uses_one_full_allocation_group``,
``test_unify_hybrid_kv_cache_specs``, the disable-hybrid case of
``test_get_kv_cache_config_one_worker``) and a tensor-parallel MLA + sliding-window model whose
pages do not divide. vLLM gives each spec its own block size where graphkv has one per model;
the cases here use one block size, as a served model does (one ``cache_config.block_size``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from graphkv import (Budget, ChunkedLocalSpec, FullAttentionSpec, IndexerKeySpec, Limits, MambaSpec, MLASpec, ModelKV,
                     PlanError, SlidingWindowSpec, compile_plan)
from graphkv.emit.vllm import VllmTarget, vllm_serve_command
from graphkv.spec.layers import LayerKind, PromotedLocalSpec

F32 = "float32"


def _kinds(plan) -> list[tuple[str, tuple[str, ...], int]]:
    return [(g.kind.value, g.layer_names, g.pages_per_request) for g in plan.groups]


def test_mla_beside_an_incompatible_sliding_draft_is_one_full_allocation_group():
    """vLLM's fallback test: MLA (147456 B) + indexer (8448 B) + a sliding draft (65536 B at block 64); 8448 does not
    divide 147456, so the draft is allocated as full attention and all three share one group: 100 pages from
    22144001 B, 16 pages per request at max_model_len=1024 (vLLM 0.33: num_blocks 100, 16 pages, one
    UniformTypeKVCacheSpecs group of page 221440)."""
    model = ModelKV.from_specs("target+draft", [
        (MLASpec(kv_lora_rank=512, rope_dim=64, dtype=F32), "flashmla"),
        (IndexerKeySpec(head_size=132), "flashmla"),
        (SlidingWindowSpec(num_kv_heads=2, head_size=64, dtype=F32, window=1), "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=1024), Budget.kv_bytes(221440 * 100 + 1))
    assert plan.block_size == 64
    assert _kinds(plan) == [("mla", ("layers.0", "layers.1", "layers.2"), 16)]
    assert [s.page_size_bytes for s in plan.slots] == [147456, 8448, 65536]
    assert plan.pool_bytes_per_block == 221440 and plan.num_blocks == 100
    draft = plan.layers[2].spec
    assert isinstance(draft, PromotedLocalSpec) and draft.kind is LayerKind.FULL_ATTENTION and draft.window == 1
    assert model.layers[2].spec.kind is LayerKind.SLIDING_WINDOW  # the model itself is unchanged
    note = next(n for n in plan.notes if "allocated as full attention" in n)
    assert note == ("1 local-attention layer(s) allocated as full attention (vLLM 0.33's full-allocation fallback: "
                    "page sizes cannot be unified, the indexer page of 8448 B (layers.1) does not divide the largest "
                    "page of 147456 B, and only non-MLA attention pages are padded); their attention still reads "
                    "only its window or chunk; sliding_window layers (window 1: layers.2) now hold 16 pages per "
                    "request instead of 17 at max_model_len=1024")


def test_pages_that_unify_keep_their_own_groups():
    """vLLM's counter-test: MLA and a sliding draft with equal pages (36864 B) stay two groups, nothing promoted."""
    model = ModelKV.from_specs("m", [(MLASpec(kv_lora_rank=512, rope_dim=64, dtype=F32), "triton_mla"),
                                     (SlidingWindowSpec(num_kv_heads=1, head_size=288, dtype=F32, window=1),
                                      "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=1024, block_size=16), Budget.kv_bytes("1GiB"))
    assert [(g.kind.value, g.page_size_bytes) for g in plan.groups] == [("mla", 36864), ("sliding_window", 36864)]
    assert not any("allocated as full attention" in n for n in plan.notes)


def test_tp4_mla_and_sliding_pages_that_do_not_divide():
    """Rank 0 of tp 4: 4 MLA layers (73728 B, whole on every rank) and 4 sliding layers of 16 KV heads (4 per rank,
    131072 B); 73728 does not divide 131072. vLLM 0.33: one group of 8 slots (819200 B per page index),
    num_blocks 10485 from 8 GiB, 512 pages per request at max_model_len=32768."""
    mla = MLASpec(kv_lora_rank=512, rope_dim=64)
    sliding = SlidingWindowSpec(num_kv_heads=16, head_size=128, window=4096)
    model = ModelKV.from_specs("mla-swa", [(mla, "flashmla"), (sliding, "flash_attn")] * 4).shard(4, 0)
    plan = compile_plan(model, Limits(max_model_len=32768), Budget.kv_bytes("8GiB"))
    assert plan.block_size == 64
    assert [s.page_size_bytes for s in plan.slots] == [73728, 131072] * 4
    assert plan.pool_bytes_per_block == 819200 and plan.num_blocks == 10485
    assert [(g.kind.value, len(g.layers), g.pages_per_request) for g in plan.groups] == [("mla", 8, 512)]
    note = next(n for n in plan.notes if "allocated as full attention" in n)
    assert "the mla page of 73728 B (layers.0) does not divide the largest page of 131072 B" in note
    # cdiv(min(4096 - 1 + 2 x 8192, 32768), 64) + 1 = 321 pages as a sliding layer
    assert note.endswith("now hold 512 pages per request instead of 321 at max_model_len=32768")


def test_fallback_refused_where_vllm_refuses():
    """vLLM's fallback gives up beside chunked-local layers (hybrid manager kept), beside a Mamba state, and without a
    sliding layer; graphkv refuses with the same condition named."""
    mla = (MLASpec(kv_lora_rank=512, rope_dim=64, dtype=F32), "flashmla")
    indexer = (IndexerKeySpec(head_size=132), "flashmla")
    sliding = (SlidingWindowSpec(num_kv_heads=2, head_size=64, dtype=F32, window=1), "flash_attn")
    chunked = (ChunkedLocalSpec(num_kv_heads=2, head_size=64, dtype=F32, chunk=4), "flash_attn")
    mamba = (MambaSpec(shapes=((4, 16, 16),), dtypes=(F32,)), "mamba")
    kept = Limits(max_model_len=1024, disable_hybrid_kv_cache_manager=False)
    cases = [([mla, indexer, chunked], "the model has chunked-local layers"),
             ([mla, indexer, sliding, mamba], "recurrent-state layers cannot join a full-attention group")]
    for specs, reason in cases:
        with pytest.raises(PlanError, match="full-allocation fallback does not apply: " + reason):
            compile_plan(ModelKV.from_specs("m", specs), kept, Budget.kv_bytes("1GiB"))


def test_disable_hybrid_promotes_sliding_and_chunked_beside_full_attention():
    """vLLM's test_unify_hybrid_kv_cache_specs at one block size (64): a sliding layer padded to 32768 B becomes full
    attention of page 65536 (its real page at block 64); a chunked one keeps its 32768 B padding at block 16; both at
    once are promoted together."""
    full = (FullAttentionSpec(num_kv_heads=2, head_size=64, dtype=F32), "flash_attn")
    sliding = (SlidingWindowSpec(num_kv_heads=2, head_size=64, dtype=F32, window=1024, page_size_padded=32768),
               "flash_attn")
    chunked = (ChunkedLocalSpec(num_kv_heads=2, head_size=64, dtype=F32, chunk=512, page_size_padded=32768),
               "flash_attn")
    on = Limits(max_model_len=4096, disable_hybrid_kv_cache_manager=True)
    plan = compile_plan(ModelKV.from_specs("m", [full, sliding]), attrs_evolve(on, block_size=64),
                        Budget.kv_bytes("1GiB"))
    promoted = plan.layers[1].spec
    assert isinstance(promoted, PromotedLocalSpec) and promoted.window == 1024
    assert promoted.page_size_padded == 32768 and promoted.page_size_bytes(64) == 65536
    assert _kinds(plan) == [("full_attention", ("layers.0", "layers.1"), 64)]
    plan = compile_plan(ModelKV.from_specs("m", [full, chunked]), on, Budget.kv_bytes("1GiB"))
    assert plan.layers[1].spec.chunk == 512 and plan.layers[1].spec.page_size_bytes(16) == 32768
    assert _kinds(plan) == [("full_attention", ("layers.0", "layers.1"), 256)]
    plan = compile_plan(ModelKV.from_specs("m", [full, sliding, chunked]), on, Budget.kv_bytes("1GiB"))
    assert [type(d.spec).__name__ for d in plan.layers] == ["FullAttentionSpec", "PromotedLocalSpec",
                                                            "PromotedLocalSpec"]
    assert len(plan.groups) == 1


def test_disable_hybrid_without_full_attention_is_refused_as_vllm_refuses():
    """Sliding + chunked with no layer keeping every token cannot become one type: vLLM 0.33 fails to start
    ('Failed to promote local KV cache specs to one unified type'), graphkv raises naming the option."""
    model = ModelKV.from_specs("m", [(SlidingWindowSpec(num_kv_heads=2, head_size=64, window=1024), "flash_attn"),
                                     (ChunkedLocalSpec(num_kv_heads=2, head_size=64, chunk=512), "flash_attn")])
    with pytest.raises(PlanError, match="disable_hybrid_kv_cache_manager=True: the layers are of 2 kinds .*"
                                        "Failed to promote local KV cache specs to one unified type"):
        compile_plan(model, Limits(max_model_len=4096, disable_hybrid_kv_cache_manager=True), Budget.kv_bytes("1GiB"))


def test_disable_hybrid_one_worker_numbers():
    """vLLM's test_get_kv_cache_config_one_worker, disable-hybrid case: full + sliding (window 1) of 16384 B pages,
    1048576 B and max_model_len=16 -> one group of both layers, num_blocks 32."""
    spec = dict(num_kv_heads=2, head_size=64, dtype=F32)
    model = ModelKV.from_specs("m", [(FullAttentionSpec(**spec), "flash_attn"),
                                     (SlidingWindowSpec(window=1, **spec), "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=16, max_num_seqs=16, max_num_batched_tokens=16,
                                      disable_hybrid_kv_cache_manager=True), Budget.kv_bytes(1048576))
    assert _kinds(plan) == [("full_attention", ("layers.0", "layers.1"), 1)]
    assert [s.page_size_bytes for s in plan.slots] == [16384, 16384] and plan.num_blocks == 32


def test_disable_hybrid_gpt_oss_like_numbers():
    """2 full + 2 sliding (window 128) layers of 8 x 64 bf16 with the flag: vLLM 0.33 gives one group, num_blocks 8192
    from 1 GiB and 512 pages per request at max_model_len=8192; without the flag graphkv keeps two groups."""
    full = (FullAttentionSpec(num_kv_heads=8, head_size=64), "flash_attn")
    sliding = (SlidingWindowSpec(num_kv_heads=8, head_size=64, window=128), "flash_attn")
    model = ModelKV.from_specs("m", [sliding, full] * 2)
    plan = compile_plan(model, Limits(max_model_len=8192, disable_hybrid_kv_cache_manager=True),
                        Budget.kv_bytes("1GiB"))
    assert plan.num_blocks == 8192 and [(g.kind.value, g.pages_per_request) for g in plan.groups] == [
        ("full_attention", 512)]
    assert plan.groups[0].spec == FullAttentionSpec(num_kv_heads=8, head_size=64)  # a layer that keeps every token
    hybrid = compile_plan(model, Limits(max_model_len=8192), Budget.kv_bytes("1GiB"))
    assert sorted(g.kind.value for g in hybrid.groups) == ["full_attention", "sliding_window"]


def test_disable_hybrid_refuses_recurrent_states_as_vllm_does():
    """A Mamba hybrid cannot run without vLLM's hybrid manager: with the flag, vLLM 0.33's promotion of full + sliding +
    Mamba raises 'Failed to promote local KV cache specs to one unified type'; graphkv names the option and the fix."""
    model = ModelKV.from_specs("m", [
        (FullAttentionSpec(num_kv_heads=2, head_size=64), "flash_attn"),
        (SlidingWindowSpec(num_kv_heads=2, head_size=64, window=256), "flash_attn"),
        (MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=("bfloat16", "float32")), "mamba")])
    with pytest.raises(PlanError, match=r"disable_hybrid_kv_cache_manager=True: the layers are of 3 kinds \(full_attention, "
                                        r"mamba2, sliding_window 256\).*recurrent states need the hybrid manager.*leave "
                                        "disable_hybrid_kv_cache_manager unset"):
        compile_plan(model, Limits(max_model_len=4096, max_num_seqs=8, disable_hybrid_kv_cache_manager=True),
                     Budget.kv_bytes("1GiB"))


def test_chunked_local_attention_is_promoted_by_default_as_vllm_does():
    """Llama-4-like (3 chunked + 1 full): vLLM 0.33 turns its hybrid manager off for chunked-local attention unless
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1, so by default every layer holds 8192 pages at 131072 tokens;
    False keeps the chunked group (1536 pages) and the emitted command sets that variable."""
    chunked = (ChunkedLocalSpec(num_kv_heads=8, head_size=128, chunk=8192), "flash_attn")
    model = ModelKV.from_specs("l4", [chunked] * 3 + [(FullAttentionSpec(num_kv_heads=8, head_size=128), "flash_attn")])
    auto = compile_plan(model, Limits(max_model_len=131072), Budget.kv_bytes("80GiB"))
    assert [(g.kind.value, g.pages_per_request) for g in auto.groups] == [("full_attention", 8192)]
    assert "unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1" in " ".join(auto.notes)
    kept = compile_plan(model, Limits(max_model_len=131072, disable_hybrid_kv_cache_manager=False),
                        Budget.kv_bytes("80GiB"))
    assert [(g.kind.value, g.pages_per_request) for g in kept.groups] == [("chunked_local", 1536)] * 3 + [
        ("full_attention", 8192)]
    command = vllm_serve_command(kept, VllmTarget(model="m"))
    assert "\nVLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 vllm serve m \\" in command
    assert "--disable-hybrid-kv-cache-manager" not in command
    assert "turns its hybrid KV cache manager off by itself for chunked-local attention" in vllm_serve_command(
        auto, VllmTarget(model="m"))


def test_emit_vllm_carries_the_flag_and_the_fallback_needs_none():
    """The deliberate promotion is emitted as --disable-hybrid-kv-cache-manager; the fallback is what vLLM does by
    itself, so the command only says so."""
    full = (FullAttentionSpec(num_kv_heads=8, head_size=64), "flash_attn")
    sliding = (SlidingWindowSpec(num_kv_heads=8, head_size=64, window=128), "flash_attn")
    plan = compile_plan(ModelKV.from_specs("m", [sliding, full]),
                        Limits(max_model_len=8192, disable_hybrid_kv_cache_manager=True), Budget.kv_bytes("1GiB"))
    command = vllm_serve_command(plan, VllmTarget(model="m"))
    assert "--disable-hybrid-kv-cache-manager" in [line.strip(" \\") for line in command.splitlines()]
    assert "# --disable-hybrid-kv-cache-manager: planned with 1 local-attention layer(s) allocated as full" in command
    fallback = compile_plan(ModelKV.from_specs("m", [(SlidingWindowSpec(num_kv_heads=5, head_size=128, window=512),
                                                      "flash_attn"),
                                                     (MLASpec(kv_lora_rank=512, rope_dim=64), "triton_mla")]),
                            Limits(max_model_len=4096), Budget.kv_bytes("1GiB"))
    command = vllm_serve_command(fallback, VllmTarget(model="m"))
    assert "--disable-hybrid-kv-cache-manager" not in command
    assert "allocates the 1 sliding-window layer(s) as full attention by itself (its full-allocation fallback" in command


def test_cli_flag_prints_the_note_and_reaches_emit():
    """`graphkv plan --preset gpt-oss-20b --disable-hybrid-kv-cache-manager` plans one group and says what it
    costs; with --emit vllm the flag is in the command."""
    argv = [sys.executable, "-m", "graphkv.cli", "plan", "--preset", "gpt-oss-20b", "--kv-memory", "4GiB",
            "--max-model-len", "8192", "--disable-hybrid-kv-cache-manager"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert ("12 local-attention layer(s) allocated as full attention (disable_hybrid_kv_cache_manager=True, as "
            "vLLM's --disable-hybrid-kv-cache-manager)") in out
    assert "now hold 512 pages per request instead of 513 at max_model_len=8192" in out
    emitted = subprocess.run(argv + ["--emit", "vllm"], capture_output=True, text=True, check=True).stdout
    assert "--disable-hybrid-kv-cache-manager" in [line.strip(" \\") for line in emitted.splitlines()]


def attrs_evolve(limits: Limits, **changes) -> Limits:
    """``limits`` with ``changes``."""
    import attrs

    return attrs.evolve(limits, **changes)
