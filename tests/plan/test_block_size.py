"""Step 1: block size selection and Mamba page padding, with hand-computed expected numbers.

The hybrid model used throughout (numbers from DESIGN step 1):

- attention: FullAttentionSpec(2 KV heads, head_size 64, bf16)
  A1 = 2 heads * (64 + 64) * 2 bytes = 512 bytes per token;
- Mamba: conv (3, 1024) bf16 = 6144 B + ssm (8, 64, 64) fp32 = 131072 B, so M = 137216 bytes;
- layers: [attn, mamba, mamba, mamba, attn, mamba, mamba, mamba], attention on flash_attn
  (MultipleOf(16): preferred 16, smallest kernel size 16).
"""

import pytest

from graphkv import (Backend, CapacityError, Budget, CacheOrder, CudaGraphSupport, FullAttentionSpec, KVLayout, Limits, MambaSpec,
                     MLASpec, ModelKV, MultipleOf, PlanError, SpecError, compile_plan)
from graphkv.plan.block_size import choose_block_size

ATTN = FullAttentionSpec(num_kv_heads=2, head_size=64, dtype="bfloat16")
MAMBA = MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=("bfloat16", "float32"))
PATTERN = "AMMMAMMM"


def hybrid(attn=ATTN, mamba=MAMBA, backend="flash_attn", **kwargs) -> ModelKV:
    """The 8-layer hybrid model of this module."""
    return ModelKV.from_specs("hybrid", [(attn, backend) if c == "A" else (mamba, "mamba") for c in PATTERN], **kwargs)


def limits(**kwargs) -> Limits:
    """Limits small enough that 3 Mamba groups x 32 sequences fit 99 usable pages."""
    kwargs.setdefault("max_num_seqs", 32)
    kwargs.setdefault("max_num_batched_tokens", 2048)
    return Limits(**kwargs)


def test_hybrid_none_mode_auto_fit_is_exact():
    """Mode 'none': B = K * cdiv(M, K * A1), the Mamba page is padded to B * A1 and auto max_model_len is exact."""
    # K = max(16, 16) = 16; B = 16 * cdiv(137216, 16 * 512 = 8192) = 16 * 17 = 272.
    # Attention page = 272 * 512 = 139264 B; Mamba padding = 139264 - 137216 = 2048 B.
    # Buckets: attention 2 layers, Mamba 6 -> gs = 2 (6 >= 1.5 * 2); pool bytes per block = 2 * 139264 = 278528.
    # Budget 100 * 278528 + 12345 -> num_blocks = 100, usable 99.
    # Need per request: cdiv(L, 272) attention pages + 3 Mamba groups x 1 page <= 99 -> L <= 96 * 272 = 26112.
    budget = Budget.kv_bytes(100 * 278528 + 12345)
    plan = compile_plan(hybrid(), limits(), budget)
    assert plan.block_size == 272
    assert plan.block.mamba_block_size is None
    assert plan.block.mamba_state_bytes == 137216
    assert plan.block.mamba_page_bytes == 139264
    assert plan.block.mamba_page_padding_bytes == 2048
    assert plan.group_size == 2
    assert plan.pool_bytes_per_block == 278528
    assert plan.num_blocks == 100
    assert plan.max_model_len == 26112
    assert plan.capacity.pages_per_request == 99
    assert [layer.spec.page_size_bytes() for layer in plan.layers if layer.spec.is_ssm] == [139264] * 6
    assert [g.page_size_bytes for g in plan.groups] == [139264] * 4


def test_hybrid_auto_length_request_fits_and_one_more_token_does_not():
    """A fixed max_model_len equal to the auto-fit length compiles; one token more is a CapacityError."""
    # From the test above: 26112 needs 96 + 3 = 99 pages (fits 99); 26113 needs 97 + 3 = 100.
    budget = Budget.kv_bytes(100 * 278528 + 12345)
    assert compile_plan(hybrid(), limits(max_model_len=26112), budget).capacity.pages_per_request == 99
    with pytest.raises(PlanError, match="max seq len 26113 needs 100 pages"):
        compile_plan(hybrid(), limits(max_model_len=26113), budget)


def test_hybrid_align_mode_sets_mamba_block_size_to_block_size():
    """Mode 'align': same B as 'none', mamba_block_size == block_size and 3 Mamba2 pages per group."""
    # B = 272 as in 'none'. Mamba2 in align mode keeps 2 pages + 1 prefill checkpoint (vLLM 0.33), so
    # cdiv(L, 272) + 3 groups x 3 pages <= 99 -> L <= 90 * 272 = 24480.
    # 11 sequences x 3 groups x 3 live pages = 99 <= 99 usable pages.
    plan = compile_plan(hybrid(), limits(mamba_cache_mode="align", max_num_seqs=11), Budget.kv_bytes(100 * 278528))
    assert plan.block_size == 272
    assert plan.block.mamba_block_size == 272
    assert plan.max_model_len == 24480


def test_hybrid_all_mode_uses_lcm_of_chunk_and_kernel_alignment():
    """Mode 'all': C = lcm(chunk, K), B = C * cdiv(cdiv(M, A1), C) and mamba_block_size == B."""
    # chunk_size 256, K = 16: C = lcm(256, 16) = 256; cdiv(137216, 512) = 268; B = 256 * cdiv(268, 256) = 512.
    # Page = 512 * 512 = 262144 B; padding = 262144 - 137216 = 124928 B; pool bytes per block = 2 * 262144.
    # Override 100 (usable 99); need: cdiv(L, 512) attention + 3 groups x cdiv(L, 512) = 4 * cdiv(L, 512) <= 99
    # -> cdiv(L, 512) <= 24 -> L = 24 * 512 = 12288.
    plan = compile_plan(hybrid(), limits(mamba_cache_mode="all", num_blocks_override=100))
    assert plan.block_size == 512
    assert plan.block.mamba_block_size == 512
    assert plan.block.mamba_page_bytes == 262144
    assert plan.block.mamba_page_padding_bytes == 124928
    assert plan.pool_bytes_per_block == 524288
    assert plan.max_model_len == 12288


def test_all_mode_user_mamba_block_size_conflict_names_value_to_set():
    """Mode 'all' with a user mamba_block_size that is not B raises PlanError naming the value to set."""
    # C = lcm(128, 16) = 128; B = 128 * cdiv(268, 128) = 128 * 3 = 384 != 128.
    with pytest.raises(PlanError, match="set mamba_block_size=384") as info:
        compile_plan(hybrid(), limits(mamba_cache_mode="all", mamba_block_size=128), Budget.kv_bytes("1GiB"))
    assert info.value.field == "mamba_block_size"
    assert info.value.value == 128


def test_all_mode_user_mamba_block_size_equal_to_b_is_kept():
    """Mode 'all' with mamba_block_size set to the value the error suggested plans with it."""
    # C = lcm(384, 16) = 384; B = 384 * cdiv(268, 384) = 384.
    plan = compile_plan(hybrid(), limits(mamba_cache_mode="all", mamba_block_size=384), Budget.kv_bytes("1GiB"))
    assert plan.block_size == 384
    assert plan.block.mamba_block_size == 384


def test_align_mode_user_mamba_block_size_conflict_names_value_to_set():
    """Mode 'align' with mamba_block_size != block_size raises PlanError naming block_size."""
    with pytest.raises(PlanError, match="set mamba_block_size=272 or leave it unset") as info:
        compile_plan(hybrid(), limits(mamba_cache_mode="align", mamba_block_size=100), Budget.kv_bytes("1GiB"))
    assert info.value.value == 100


def test_none_mode_rejects_user_mamba_block_size():
    """Mode 'none' with a mamba_block_size set raises PlanError: it would be silently ignored."""
    with pytest.raises(PlanError, match="leave mamba_block_size unset"):
        compile_plan(hybrid(), limits(mamba_block_size=64), Budget.kv_bytes("1GiB"))


def test_mamba_block_size_without_mamba_layers_is_an_error():
    """A mamba_block_size on a model without state layers raises PlanError."""
    model = ModelKV.from_specs("attn", [(ATTN, "flash_attn")])
    with pytest.raises(PlanError, match="no Mamba"):
        compile_plan(model, Limits(mamba_block_size=64), Budget.kv_bytes("1GiB"))


def test_user_block_size_larger_than_needed_is_kept():
    """A user block_size above B is kept and the Mamba page is padded to it."""
    # K = max(16, 512) = 512; B = 512 * cdiv(137216, 512 * 512) = 512 -> block 512, page 512 * 512 = 262144.
    plan = compile_plan(hybrid(), limits(block_size=512), Budget.kv_bytes("1GiB"))
    assert plan.block_size == 512
    assert plan.block.mamba_page_bytes == 262144


def test_user_block_size_smaller_than_needed_grows_in_its_own_multiples():
    """A user block_size below B grows to K * cdiv(M, K * A1) with K = the user's size."""
    # K = max(16, 32) = 32; B = 32 * cdiv(137216, 16384) = 32 * 9 = 288 (not 272: K is 32 now).
    plan = compile_plan(hybrid(), limits(block_size=32), Budget.kv_bytes("1GiB"))
    assert plan.block_size == 288


def test_kernel_minimum_of_the_attention_backend_sets_the_alignment():
    """K is at least the smallest kernel block size of the attention backend."""
    wide = Backend(name="wide", supported_kernel_block_sizes=(MultipleOf(64),),
                   cudagraph_support=CudaGraphSupport.ALWAYS, kv_layout=KVLayout(order=CacheOrder.BLOCKS_FIRST))
    # preferred: 16 unsupported -> 64; K = 64; B = 64 * cdiv(137216, 64 * 512 = 32768) = 64 * 5 = 320.
    plan = compile_plan(hybrid(backend=wide), limits(), Budget.kv_bytes("1GiB"))
    assert plan.block_size == 320
    assert plan.kernel_block_sizes[0] == 320  # 320 = 5 * 64 is itself a MultipleOf(64)


def test_mla_beside_a_state_aligns_the_page_to_128_tokens_as_vllm():
    """vLLM 0.33 (_align_hybrid_block_size): with MLA attention beside a state the step is at least 128 tokens.
    Kimi-Linear at TP 2 (MLA 512 + 64 bf16 = 1152 B/token, here on flashmla, kernel 64; KDA state (3, 6144) bf16 +
    (16, 128, 128) fp32 = 1085440 B): 128 x cdiv(1085440, 128 x 1152) = 1024, where 64 x cdiv(1085440, 64 x 1152)
    = 960 before."""
    kda = MambaSpec(shapes=((3, 6144), (16, 128, 128)), dtypes=("bfloat16", "float32"))
    model = ModelKV.from_specs("mla-hybrid", [(MLASpec(kv_lora_rank=512, rope_dim=64), "flashmla"), (kda, "mamba"),
                                              (kda, "mamba")])
    choice = choose_block_size(model, limits())
    assert choice.block_size == 1024 and choice.mamba_page_bytes == 1024 * 1152
    assert "kernel alignment 128 (MLA beside a state: at least 128 tokens, as vLLM)" in choice.reason
    # without MLA the same state beside 1152-byte-per-token attention on a 64-token kernel keeps 960
    gqa = FullAttentionSpec(num_kv_heads=9, head_size=32, dtype="bfloat16")  # 9 x 64 x 2 = 1152 B/token
    wide = Backend(name="wide", supported_kernel_block_sizes=(MultipleOf(64),),
                   cudagraph_support=CudaGraphSupport.ALWAYS, kv_layout=KVLayout(order=CacheOrder.BLOCKS_FIRST))
    plain = ModelKV.from_specs("gqa-hybrid", [(gqa, wide), (kda, "mamba"), (kda, "mamba")])
    assert choose_block_size(plain, limits()).block_size == 960


def test_the_page_is_a_multiple_of_every_attention_backends_smallest_kernel_block():
    """vLLM 0.33 starts from the smallest size both backends take (16 is not a multiple of 40: lcm(16, 40) = 80),
    steps by the larger of that and the first backend's smallest kernel block (80), and rounds the result up to the lcm
    of every backend's (80): 80 x cdiv(137216, 80 x 512) = 320. Stepping by the largest (40), as graphkv did, gave 280,
    which no 16-token kernel block divides."""
    forty = Backend(name="forty", supported_kernel_block_sizes=(MultipleOf(40),),
                    cudagraph_support=CudaGraphSupport.ALWAYS, kv_layout=KVLayout(order=CacheOrder.BLOCKS_FIRST))
    model = ModelKV.from_specs("two-backends", [(ATTN, "flash_attn"), (MAMBA, "mamba"), (ATTN, forty), (MAMBA, "mamba")])
    choice = choose_block_size(model, limits())
    assert choice.block_size == 320 and 320 % 16 == 0 and 320 % 40 == 0
    assert choice.reason.startswith("the smallest size every attention backend (flash_attn [MultipleOf(16)], forty "
                                    "[MultipleOf(40)]) takes; grown to 320")
    assert "kernel alignment 80 x cdiv(137216 state bytes, 80 x 512 bytes/token)" in choice.reason
    # mode 'all' (graphkv's, after vLLM's newer main): C = lcm(chunk 256, 16, 80) = 1280; B = 1280 x cdiv(268, 1280)
    every = compile_plan(model, limits(mamba_cache_mode="all"), Budget.kv_bytes("1GiB"))
    assert every.block_size == every.block.mamba_block_size == 1280
    assert "every backend's smallest kernel block 80) = 1280" in every.block.reason


def test_user_padded_mamba_page_counts_in_alignment_but_not_as_state():
    """A user page_size_padded on the Mamba spec is what must fit; the real state bytes are recorded."""
    padded = MambaSpec(shapes=MAMBA.shapes, dtypes=MAMBA.dtypes, page_size_padded=140000)
    # M = 140000 -> B = 16 * cdiv(140000, 8192) = 16 * 18 = 288; page 288 * 512 = 147456;
    # padding recorded against the real 137216 B: 147456 - 137216 = 10240.
    plan = compile_plan(hybrid(mamba=padded), limits(), Budget.kv_bytes("1GiB"))
    assert plan.block_size == 288
    assert plan.block.mamba_state_bytes == 137216
    assert plan.block.mamba_page_padding_bytes == 10240


def test_padded_attention_page_sets_the_mamba_page():
    """With a padded attention page the Mamba page is padded to that page, not to block_size * A1."""
    attn = FullAttentionSpec(num_kv_heads=2, head_size=64, page_size_padded=150000)
    # B = 272 as without padding; attention page = max(272 * 512 = 139264, 150000) = 150000.
    plan = compile_plan(hybrid(attn=attn), limits(), Budget.kv_bytes("1GiB"))
    assert plan.block_size == 272
    assert plan.block.mamba_page_bytes == 150000
    assert plan.pool_bytes_per_block == 2 * 150000


def test_attention_only_block_size_is_first_backend_preference():
    """Without Mamba layers the block size is the first attention backend's preferred size."""
    # flashinfer supports 16 -> 16; a MultipleOf(64) backend does not -> its smallest, 64; flashmla only 64.
    wide = Backend(name="wide", supported_kernel_block_sizes=(MultipleOf(64),),
                   cudagraph_support=CudaGraphSupport.ALWAYS, kv_layout=KVLayout(order=CacheOrder.BLOCKS_FIRST))
    mla = MLASpec(kv_lora_rank=512, rope_dim=64)
    assert choose_block_size(ModelKV.from_specs("a", [(ATTN, "flashinfer")]), Limits()).block_size == 16
    assert choose_block_size(ModelKV.from_specs("b", [(ATTN, wide)]), Limits()).block_size == 64
    assert choose_block_size(ModelKV.from_specs("c", [(mla, "flashmla")]), Limits()).block_size == 64


def test_mamba_only_pages_are_padded_to_the_largest_state():
    """Without attention every Mamba page is padded to the largest state and the block size stays 16."""
    small = MambaSpec(shapes=((3, 512), (4, 64, 64)), dtypes=("bfloat16", "float32"))
    # small: 3 * 512 * 2 + 4 * 64 * 64 * 4 = 3072 + 65536 = 68608 B, padded to MAMBA's 137216 B.
    model = ModelKV.from_specs("ssm", [(MAMBA, "mamba"), (small, "gdn")], max_position_embeddings=4096)
    plan = compile_plan(model, Limits(max_num_seqs=4, max_num_batched_tokens=64), Budget.kv_bytes(10 * 137216))
    assert plan.block_size == 16
    assert plan.block.mamba_page_bytes == 137216
    assert plan.block.mamba_page_padding_bytes == 0
    assert [layer.spec.page_size_bytes() for layer in plan.layers] == [137216, 137216]
    assert plan.layers[1].spec.real_page_size_bytes() == 68608


def test_mamba_only_user_mamba_block_size_becomes_the_page():
    """Without attention a page is one Mamba block: mamba_block_size=64 in 'all' mode sets block_size 64."""
    model = ModelKV.from_specs("ssm", [(MAMBA, "mamba")], max_position_embeddings=4096)
    plan = compile_plan(model, Limits(mamba_cache_mode="all", mamba_block_size=64, max_num_seqs=4,
                                      max_num_batched_tokens=64), Budget.kv_bytes(200 * 137216))
    # 'all': cdiv(4096, 64) = 64 state pages per request (not cdiv(4096, 16) = 256); 199 usable fit it.
    assert (plan.block_size, plan.block.mamba_block_size) == (64, 64)
    assert plan.max_model_len == 4096
    assert plan.capacity.pages_per_request == 64


def test_mamba_only_align_mode_defaults_mamba_block_size_to_block_size():
    """Without attention and without a user value, 'align' uses mamba_block_size == block_size == 16."""
    model = ModelKV.from_specs("ssm", [(MAMBA, "mamba")], max_position_embeddings=4096)
    # 3 sequences x 3 align pages (Mamba2: 2 + 1 checkpoint) = 9 = the 9 usable pages.
    plan = compile_plan(model, Limits(mamba_cache_mode="align", max_num_seqs=3, max_num_batched_tokens=64),
                        Budget.kv_bytes(10 * 137216))
    assert (plan.block_size, plan.block.mamba_block_size) == (16, 16)


def test_align_mode_counts_two_live_state_pages_per_sequence():
    """Mode 'align' holds 2 state pages per sequence per Mamba group (+1 checkpoint page for Mamba2 layers)."""
    # Mamba2: 17 x 3 groups x 3 = 153 > 99 usable pages -> at most 99 // 9 = 11 sequences.
    with pytest.raises(CapacityError, match=r"max_num_seqs=17.*153 pages.*99 usable.*<= 11"):
        compile_plan(hybrid(), limits(mamba_cache_mode="align", max_num_seqs=17), Budget.kv_bytes(100 * 278528))
    # gated-delta layers keep no checkpoint page: 17 x 3 x 2 = 102 > 99 -> at most 99 // 6 = 16.
    gdn = MambaSpec(shapes=MAMBA.shapes, dtypes=MAMBA.dtypes, variant="gated_delta")
    with pytest.raises(CapacityError, match=r"max_num_seqs=17.*102 pages.*99 usable.*<= 16"):
        compile_plan(hybrid(mamba=gdn), limits(mamba_cache_mode="align", max_num_seqs=17),
                     Budget.kv_bytes(100 * 278528))


def test_prefill_checkpoint_alignment_steps_align_mode_pages_when_every_state_declares_it():
    """Mode 'align' with every state layer declaring prefill checkpoints every 64 tokens (Qwen's gated delta on
    FlashInfer): K = lcm(16, 64) = 64; B = 64 x cdiv(137216, 64 x 512) = 320 (272 without). Mode 'none' ignores it,
    so does a model where one state layer declares none; 0 is refused naming the field."""
    checkpointed = MambaSpec(shapes=MAMBA.shapes, dtypes=MAMBA.dtypes, variant="gated_delta",
                             prefill_checkpoint_pages=1, prefill_checkpoint_alignment=64)
    assert choose_block_size(hybrid(mamba=checkpointed), limits(mamba_cache_mode="align")).block_size == 320
    assert "(the lcm with prefill checkpoints every 64 tokens)" in choose_block_size(
        hybrid(mamba=checkpointed), limits(mamba_cache_mode="align")).reason
    assert choose_block_size(hybrid(mamba=checkpointed), limits()).block_size == 272
    mixed = ModelKV.from_specs("mixed", [(ATTN, "flash_attn"), (checkpointed, "gdn"), (MAMBA, "mamba")])
    assert choose_block_size(mixed, limits(mamba_cache_mode="align")).block_size == 272
    with pytest.raises(SpecError, match=r"prefill_checkpoint_alignment=0"):
        MambaSpec(shapes=MAMBA.shapes, dtypes=MAMBA.dtypes, prefill_checkpoint_alignment=0)


def test_several_attention_backends_start_from_a_size_every_one_takes():
    """vLLM 0.33 (Platform._preferred_block_size_for_backends): one backend's preferred size; several: 16 when every
    one takes it, else the smallest lcm of one size per backend that every one takes."""
    only64 = Backend(name="only64", supported_kernel_block_sizes=(64,), cudagraph_support=CudaGraphSupport.ALWAYS,
                     kv_layout=KVLayout(order=CacheOrder.BLOCKS_FIRST))
    both = ModelKV.from_specs("m", [(ATTN, "flash_attn"), (ATTN, "flashinfer")])
    assert (choose_block_size(both, limits()).block_size, choose_block_size(both, limits()).reason) == (
        16, "every attention backend (flash_attn [MultipleOf(16)], flashinfer [16, 32, 64]) takes 16")
    mixed = ModelKV.from_specs("m", [(ATTN, "flash_attn"), (ATTN, only64)])
    assert choose_block_size(mixed, limits()).block_size == 64
    alone = ModelKV.from_specs("m", [(ATTN, only64)])
    assert choose_block_size(alone, limits()).reason == "only64 (first attention backend) prefers 64 (16 unsupported)"
    odd = Backend(name="odd", supported_kernel_block_sizes=(24,), cudagraph_support=CudaGraphSupport.ALWAYS,
                  kv_layout=KVLayout(order=CacheOrder.BLOCKS_FIRST))
    with pytest.raises(PlanError, match="share no kernel block size: only64 \\[64\\], odd \\[24\\]"):
        choose_block_size(ModelKV.from_specs("m", [(ATTN, only64), (ATTN, odd)]), limits())
