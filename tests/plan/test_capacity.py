"""Step 4: pool size in pages, worst-case pages per request, the max-length fit and admission checks."""

import attrs
import pytest

from graphkv import (Budget, CapacityError, ChunkedLocalSpec, FullAttentionSpec, Limits, MambaCacheMode, MambaSpec,
                     ModelKV, SlidingWindowSpec, compile_plan)
from graphkv.spec.layers import PageDemand

FULL = FullAttentionSpec(num_kv_heads=8, head_size=128)  # 65536 B per 16-token page
MAMBA = MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=("bfloat16", "float32"))  # 137216 B


def two_full() -> ModelKV:
    """Two full-attention layers: one group of 2, pool bytes per block 2 * 65536 = 131072."""
    return ModelKV.from_specs("two-full", [(FULL, "flash_attn")] * 2)


def demand(**kwargs) -> PageDemand:
    """A page demand at block 16 with 8192 tokens per step unless overridden."""
    kwargs.setdefault("block_size", 16)
    kwargs.setdefault("max_num_batched_tokens", 8192)
    return PageDemand(**kwargs)


def test_sliding_window_pages_formula():
    """Sliding pages = cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block_size) + 1."""
    spec = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=4096)
    # min(4095 + 8192 = 12287, 32768) = 12287; cdiv(12287, 16) = 768; + 1 = 769.
    assert spec.max_pages(demand(max_model_len=32768)) == 769
    # min(12287, 1000) = 1000; cdiv(1000, 16) = 63; + 1 = 64.
    assert spec.max_pages(demand(max_model_len=1000)) == 64
    # window 1, 16 tokens per step, length 10**6: min(0 + 16, 10**6) = 16 -> 1 + 1 = 2.
    one = SlidingWindowSpec(num_kv_heads=1, head_size=64, window=1)
    assert one.max_pages(demand(max_model_len=10**6, max_num_batched_tokens=16)) == 2


def test_chunked_local_pages_formula():
    """Chunked pages = cdiv(min(chunk + max_num_batched_tokens, max_model_len), block_size)."""
    spec = ChunkedLocalSpec(num_kv_heads=8, head_size=128, chunk=8192)
    # min(8192 + 2048, 131072) = 10240 -> 640.
    assert spec.max_pages(demand(max_model_len=131072, max_num_batched_tokens=2048)) == 640
    # min(10240, 5000) = 5000 -> cdiv(5000, 16) = 313.
    assert spec.max_pages(demand(max_model_len=5000, max_num_batched_tokens=2048)) == 313


def test_full_attention_pages_formula():
    """Full attention pages = cdiv(max_model_len, block_size)."""
    assert FULL.max_pages(demand(max_model_len=1000)) == 63
    assert FULL.max_pages(demand(max_model_len=1024)) == 64


@pytest.mark.parametrize(("mode", "spec_blocks", "expected"), [
    ("none", 0, 1), ("align", 0, 3), ("all", 0, 63),  # align: 2 + 1 Mamba2 checkpoint page; all: cdiv(1000, 16)
    ("none", 2, 3), ("align", 2, 5), ("all", 2, 65),
])
def test_mamba_pages_per_mode_and_speculative_blocks(mode, spec_blocks, expected):
    """Mamba2 pages: none 1, align 2 + 1 checkpoint, all cdiv(max_model_len, block_size), each + speculative blocks."""
    d = demand(max_model_len=1000, mamba_cache_mode=MambaCacheMode(mode), num_speculative_blocks=spec_blocks)
    assert MAMBA.max_pages(d) == expected


def test_num_blocks_is_budget_floor_divided_by_pool_bytes_per_block():
    """num_blocks = budget // pool_bytes_per_block; auto max_model_len = (num_blocks - 1) * block_size."""
    # 1 GiB + 131071 B // 131072 = 8192 blocks (the 131071 B remainder is not a page).
    plan = compile_plan(two_full(), Limits(), Budget.kv_bytes(2**30 + 131071))
    assert plan.pool_bytes_per_block == 131072
    assert plan.num_blocks == 8192
    assert plan.capacity.usable_pages == 8191
    assert plan.max_model_len == 8191 * 16


def test_override_too_small_for_fixed_max_model_len_raises_max_seq_len_error():
    """num_blocks_override=32 with 80 GiB of memory cannot hold max_model_len=16384: CapacityError."""
    # cdiv(16384, 16) = 1024 pages per request, but 32 - 1 = 31 usable pages; 31 * 16 = 496 tokens fit.
    with pytest.raises(CapacityError, match="max seq len") as info:
        compile_plan(two_full(), Limits(max_model_len=16384, num_blocks_override=32), Budget.kv_bytes("80GiB"))
    message = str(info.value)
    assert "needs 1024 pages" in message
    assert "31 usable pages" in message
    assert "lower max_model_len to <= 496" in message
    assert "raise num_blocks_override to >= 1025" in message
    assert info.value.field == "max_model_len"
    assert info.value.value == 16384


def test_override_auto_max_model_len_fits_the_override():
    """With num_blocks_override=32 and auto, max_model_len is 31 * 16 = 496 and that request fits."""
    plan = compile_plan(two_full(), Limits(num_blocks_override=32), Budget.kv_bytes("80GiB"))
    assert plan.num_blocks == 32
    assert plan.max_model_len == 496
    assert plan.max_model_len <= 31 * plan.block_size
    fixed = compile_plan(two_full(), Limits(max_model_len=496, num_blocks_override=32), Budget.kv_bytes("80GiB"))
    assert fixed.capacity.pages_per_request == 31


def test_null_page_is_counted():
    """Page 0 is not usable: 33 blocks hold 512 tokens (32 pages), not 528."""
    assert compile_plan(two_full(), Limits(num_blocks_override=33)).max_model_len == 512
    compile_plan(two_full(), Limits(max_model_len=512, num_blocks_override=33))
    with pytest.raises(CapacityError, match="needs 33 pages .* 32 usable pages"):
        compile_plan(two_full(), Limits(max_model_len=513, num_blocks_override=33))


def test_auto_fit_is_exact_with_sliding_and_full_groups():
    """Auto-fit over full + sliding is the exact maximum: pages(L) = cdiv(L, 16) + cdiv(min(383, L), 16) + 1."""
    sliding = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=128)
    model = ModelKV.from_specs("m", [(FULL, "flash_attn"), (sliding, "flash_attn")])
    limits = Limits(max_num_seqs=16, max_num_batched_tokens=256, num_blocks_override=126)
    # usable 125; two steps in flight: for L >= 639 the sliding group needs cdiv(127 + 2 x 256, 16) + 1 = 40 + 1
    # = 41 pages, so cdiv(L, 16) <= 84 -> L = 1344 (1345 would need 85 + 41 = 126).
    plan = compile_plan(model, limits)
    assert plan.max_model_len == 1344
    assert [g.pages_per_request for g in plan.groups] == [84, 41]
    # one step in flight (a synchronous scheduler): 127 + 256 -> 25 pages, cdiv(L, 16) <= 100 -> L = 1600.
    plan = compile_plan(model, attrs.evolve(limits, max_concurrent_batches=1))
    assert plan.max_model_len == 1600
    assert [g.pages_per_request for g in plan.groups] == [100, 25]


def test_budget_below_two_pages_is_an_error():
    """A budget holding fewer than 2 pages (one is the null page) raises CapacityError naming the minimum."""
    # pool bytes per block 131072; 262143 B holds 1 page; 2 pages = 256.00 KiB.
    with pytest.raises(CapacityError, match=r"raise the KV budget to >= 256.00 KiB") as info:
        compile_plan(two_full(), Limits(), Budget.kv_bytes(262143))
    assert info.value.field == "budget"


def test_no_budget_and_no_override_is_an_error():
    """Without a budget the plan needs num_blocks_override."""
    with pytest.raises(CapacityError, match="a budget or num_blocks_override is required"):
        compile_plan(two_full(), Limits())


def test_override_larger_than_given_budget_is_an_error():
    """An override needing more bytes than the given budget raises CapacityError naming the largest override."""
    # 1 MiB // 131072 = 8 blocks at most.
    with pytest.raises(CapacityError, match="lower num_blocks_override to <= 8") as info:
        compile_plan(two_full(), Limits(num_blocks_override=9), Budget.kv_bytes("1MiB"))
    assert info.value.value == 9


def hybrid() -> ModelKV:
    """1 attention (2 heads x 64, A1 = 512 B/token) + 3 Mamba layers: block 272, gs 1, 4 groups."""
    attn = FullAttentionSpec(num_kv_heads=2, head_size=64)
    return ModelKV.from_specs("h", [(attn, "flash_attn")] + [(MAMBA, "mamba")] * 3)


def test_max_num_seqs_above_mamba_pages_names_both_numbers():
    """max_num_seqs=34 with 3 Mamba groups and 99 usable pages needs 102 pages: CapacityError."""
    # gs = 1 (buckets of 1 and 3: 3 >= 1.5), Mamba groups 3; each sequence holds 3 state pages.
    limits = Limits(max_model_len=272, max_num_seqs=34, max_num_batched_tokens=2048, num_blocks_override=100)
    with pytest.raises(CapacityError) as info:
        compile_plan(hybrid(), limits)
    message = str(info.value)
    assert info.value.field == "max_num_seqs"
    assert "34 sequences need 102 pages" in message
    assert "99 usable pages" in message
    assert "lower max_num_seqs to <= 33" in message
    # 33 x 3 = 99 fits.
    compile_plan(hybrid(), Limits(max_model_len=272, max_num_seqs=33, max_num_batched_tokens=2048,
                                  num_blocks_override=100))


def test_max_num_seqs_check_counts_speculative_state_pages():
    """With 1 speculative token each sequence holds 3 x 2 = 6 state pages: 99 // 6 = 16 sequences."""
    limits = Limits(max_model_len=272, max_num_seqs=17, max_num_batched_tokens=2048, num_blocks_override=100,
                    num_speculative_tokens=1)
    with pytest.raises(CapacityError, match="lower max_num_seqs to <= 16"):
        compile_plan(hybrid(), limits)


def test_auto_with_only_sliding_layers_and_no_position_cap_is_an_error():
    """'auto' is unbounded when no layer's need grows with length and no max_position_embeddings is declared."""
    sliding = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=1024)
    model = ModelKV.from_specs("s", [(sliding, "flash_attn")])
    with pytest.raises(CapacityError, match="set max_model_len explicitly or declare max_position_embeddings") as info:
        compile_plan(model, Limits(), Budget.kv_bytes("1GiB"))
    assert info.value.value == "auto"


def test_auto_with_only_sliding_layers_uses_the_position_cap():
    """With max_position_embeddings=4096 a sliding-only model gets max_model_len 4096 (257 pages, 193 with one step)."""
    sliding = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=1024)
    model = ModelKV.from_specs("s", [(sliding, "flash_attn")], max_position_embeddings=4096)
    plan = compile_plan(model, Limits(max_num_batched_tokens=2048), Budget.kv_bytes("1GiB"))
    # two steps in flight: min(1023 + 2 x 2048, 4096) = 4096 -> cdiv(4096, 16) = 256, + 1 = 257.
    assert plan.max_model_len == 4096
    assert plan.capacity.pages_per_request == 257
    one_step = compile_plan(model, Limits(max_num_batched_tokens=2048, max_concurrent_batches=1),
                            Budget.kv_bytes("1GiB"))
    # one step: min(1023 + 2048, 4096) = 3071 -> cdiv(3071, 16) = 192, + 1 = 193.
    assert one_step.capacity.pages_per_request == 193


def test_auto_is_capped_by_max_position_embeddings():
    """A large pool gives auto max_model_len = max_position_embeddings, and the reason says so."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")] * 2, max_position_embeddings=8000)
    plan = compile_plan(model, Limits(), Budget.kv_bytes("1GiB"))  # 8191 usable pages hold 131056 tokens
    assert plan.max_model_len == 8000
    assert "capped by max_position_embeddings=8000" in plan.capacity.max_model_len_reason


def test_auto_below_the_position_cap_when_the_pool_is_smaller():
    """A pool smaller than the cap gives (num_blocks - 1) * block_size."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")] * 2, max_position_embeddings=8000)
    assert compile_plan(model, Limits(num_blocks_override=101)).max_model_len == 1600


def test_auto_when_not_even_one_token_fits():
    """'auto' with a pool smaller than a 1-token request raises CapacityError naming the pages needed."""
    # 1 attention page + 3 Mamba pages = 4 > 2 usable pages; the fix asks for >= 5 pages.
    limits = Limits(max_num_seqs=1, max_num_batched_tokens=16, num_blocks_override=3)
    with pytest.raises(CapacityError, match="even a 1-token request needs 4 pages .* 2 usable pages") as info:
        compile_plan(hybrid(), limits)
    assert str(info.value).endswith("; raise num_blocks_override to >= 5")  # no length or step budget helps


def test_speculative_tokens_that_leave_no_room_for_one_token_are_named():
    """When a 1-token request fits without its speculative state pages, the error names num_speculative_tokens
    (not max_model_len) and the most that fit: 1 attention + 3 x (1 + 11) Mamba pages = 37 <= 39 usable pages."""
    limits = Limits(max_num_seqs=1, max_num_batched_tokens=64, num_speculative_tokens=50, num_blocks_override=40)
    with pytest.raises(CapacityError, match=r"even a 1-token request needs 154 pages \(4 without speculative tokens\)"
                       ) as info:
        compile_plan(hybrid(), limits)
    assert info.value.field == "num_speculative_tokens"
    assert "lower num_speculative_tokens to <= 11, or raise num_blocks_override to >= 155" in str(info.value)
    compile_plan(hybrid(), attrs.evolve(limits, num_speculative_tokens=11))  # the advice works
    with pytest.raises(CapacityError, match="num_speculative_tokens"):
        compile_plan(hybrid(), attrs.evolve(limits, num_speculative_tokens=12))


def test_fixed_length_with_too_many_speculative_tokens_names_them_too():
    """A fixed max_model_len fails the same way, naming the speculative tokens rather than the length."""
    limits = Limits(max_model_len=64, max_num_seqs=1, max_num_batched_tokens=64, num_speculative_tokens=50,
                    num_blocks_override=40)
    with pytest.raises(CapacityError, match="lower num_speculative_tokens to <= 11") as info:
        compile_plan(hybrid(), limits)
    assert info.value.field == "num_speculative_tokens"


def test_gpu_budget_gives_total_times_utilization_pages():
    """An H100 (81559 MiB) at utilization 0.5 gives 40779.5 MiB // 0.125 MiB = 326236 blocks."""
    by_helper = compile_plan(two_full(), Limits(max_model_len=4096), Budget.for_gpu("H100", utilization=0.5))
    by_name = compile_plan(two_full(), Limits(max_model_len=4096), Budget(gpu="h100", utilization=0.5))
    assert by_helper.num_blocks == by_name.num_blocks == 326236


def test_gpu_budget_subtracts_weights_activations_and_graph_reserve():
    """Weights 40 GiB, activations 1 GiB, graph reserve 512 MiB come off before pages are counted."""
    budget = Budget.for_gpu("H100", utilization=0.9, weights_bytes=40 << 30, activation_bytes=1 << 30,
                            graph_reserve_bytes=512 << 20)
    # int(81559 MiB * 0.9) = 76968728985 B; minus 41.5 GiB = 44560285696 B -> 32408443289 B;
    # 32408443289 // 131072 = 247256 (247256.97).
    plan = compile_plan(two_full(), Limits(max_model_len=4096), budget)
    assert plan.num_blocks == 247256
