"""Step 6: CUDA-graph support, the resolved capture mode and the capture sizes."""

import pytest

from graphkv import (Backend, Budget, CacheOrder, CaptureError, CudaGraphMode, CudaGraphSupport, FullAttentionSpec,
                     KVLayout, Limits, MambaSpec, ModelKV, Plan, SlidingWindowSpec, compile_plan)
from graphkv.errors import SpecError
from graphkv.plan.cudagraph import capture_ceiling, engine_capture_sizes, request_counts, vllm_uniform_decode_sizes

FULL = FullAttentionSpec(num_kv_heads=8, head_size=128)
SLIDING = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=512)
GRID_512 = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))  # vLLM's sizes up to its 512-token cap


def fa_plus_flashinfer(**limits) -> Plan:
    """Group 0 full attention on flash_attn (ALWAYS), group 1 sliding on flashinfer (single-token decode)."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn"), (SLIDING, "flashinfer")])
    limits.setdefault("max_model_len", 4096)
    return compile_plan(model, Limits(**limits), Budget.kv_bytes("1GiB"))


def test_engine_capture_sizes():
    """vLLM's grid: 1, 2, 4, every 8 below 256, every 16 from 256, plus max_num_batched_tokens within the ceiling and
    the uniform decode sizes within max_num_batched_tokens."""
    assert engine_capture_sizes(1, 8192) == (1,)
    assert engine_capture_sizes(3, 3) == (1, 2, 3)
    assert engine_capture_sizes(20, 20) == (1, 2, 4, 8, 16, 20)
    assert engine_capture_sizes(14, 8192) == (1, 2, 4, 8)  # 14 itself is off the grid: not captured
    assert engine_capture_sizes(512, 8192) == GRID_512
    assert engine_capture_sizes(1000, 1000)[-4:] == (960, 976, 992, 1000)
    assert engine_capture_sizes(20, 30, uniform_decode_sizes=(3, 6, 12, 27, 33)) == (1, 2, 3, 4, 6, 8, 12, 16, 27)


def test_capture_sizes_are_vllms_default_list():
    """vLLM's ``VllmConfig._set_cudagraph_sizes`` (vllm/config/vllm.py, commit 000fc94b) and its decode keys: sizes
    up to min(2 x max_num_seqs x (1 + k), 512) on the grid, never max_num_seqs itself; full decode graphs up to
    max_num_seqs without speculative tokens, the request grid x 3 with k=2 (whose sizes join the mixed list)."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")])

    def sizes(max_num_seqs, num_speculative_tokens=0):
        limits = Limits(max_model_len=1024, max_num_seqs=max_num_seqs, max_num_batched_tokens=8192,
                        num_speculative_tokens=num_speculative_tokens)
        return compile_plan(model, limits, Budget.kv_bytes("1GiB")).cudagraph.capture_sizes

    assert sizes(20).mixed == (1, 2, 4, 8, 16, 24, 32, 40)  # 20 is no size: 17..20 requests pad to 24
    assert sizes(20).decode == (1, 2, 4, 8, 16)
    assert sizes(100).mixed == (1, 2, 4, *range(8, 201, 8))
    assert sizes(100).decode == (1, 2, 4, *range(8, 97, 8))  # 97..100 requests: the mixed graph of 104
    assert sizes(300).mixed == GRID_512  # min(600, 512)
    assert sizes(300).decode == (1, 2, 4, *range(8, 256, 8), 256, 272, 288)  # 289..300: the mixed graph of 304
    assert request_counts(48) == (1, 2, 4, 8, 16, 24, 32, 40, 48)
    assert vllm_uniform_decode_sizes(48, 2) == (3, 6, 12, 24, 48, 72, 96, 120, 144)
    assert vllm_uniform_decode_sizes(48, 0) == ()
    assert sizes(48, 2).mixed == (1, 2, 3, 4, 6, 8, 12, *range(16, 256, 8), 256, 272, 288)  # min(2 x 48 x 3, 512)
    assert sizes(48, 2).decode == (3, 6, 12, 24, 48, 72, 96, 120, 144)


def test_capture_ceiling_follows_vllm_unless_set():
    """min(2 x max_num_seqs x (1 + k), 512), capped by max_num_batched_tokens; a set limit replaces the rule."""
    assert capture_ceiling(Limits(max_num_seqs=32, max_num_batched_tokens=2048)) == (
        64, "max_cudagraph_capture_size: vLLM's default min(2 x max_num_seqs, 512)")
    assert capture_ceiling(Limits(max_num_seqs=1024, max_num_batched_tokens=8192))[0] == 512
    assert capture_ceiling(Limits(max_num_seqs=32, max_num_batched_tokens=2048, num_speculative_tokens=2)) == (
        192, "max_cudagraph_capture_size: vLLM's default min(2 x max_num_seqs x (1 + 2), 512)")
    assert capture_ceiling(Limits(max_num_seqs=32, max_num_batched_tokens=40)) == (
        40, "max_num_batched_tokens=40, below max_cudagraph_capture_size: vLLM's default min(2 x max_num_seqs, 512)")
    assert capture_ceiling(Limits(max_num_seqs=32, max_num_batched_tokens=2048,
                                  max_cudagraph_capture_size=4096)) == (
        2048, "max_num_batched_tokens=2048, below max_cudagraph_capture_size=4096")
    with pytest.raises(SpecError, match="max_cudagraph_capture_size"):
        Limits(max_cudagraph_capture_size=0)
    # 1024 speculative tokens: vLLM's 512-token cap is below one decode step of 1025 tokens, which is captured
    assert capture_ceiling(Limits(max_num_seqs=4, max_num_batched_tokens=8192, num_speculative_tokens=1024)) == (
        1025, "one decode step of 1 + 1024 tokens, above max_cudagraph_capture_size: vLLM's default "
              "min(2 x max_num_seqs x (1 + 1024), 512)")


def test_default_plan_captures_what_vllm_captures():
    """32 sequences, 2048 tokens per step: decode 1..32 and mixed 1..64 (vLLM's 2 x max_num_seqs); a 65-token
    step runs uncaptured. Setting the limit to max_num_batched_tokens captures every mixed size up to 2048."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")])
    cg = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=32, max_num_batched_tokens=2048),
                      Budget.kv_bytes("1GiB")).cudagraph
    assert cg.capture_sizes.decode == (1, 2, 4, 8, 16, 24, 32)
    assert cg.capture_sizes.mixed == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert (cg.max_capture_size, cg.max_capture_size_reason) == (
        64, "max_cudagraph_capture_size: vLLM's default min(2 x max_num_seqs, 512)")
    every = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=32, max_num_batched_tokens=2048,
                                       max_cudagraph_capture_size=2048), Budget.kv_bytes("1GiB")).cudagraph
    assert every.capture_sizes.decode == cg.capture_sizes.decode
    assert every.capture_sizes.mixed == (*GRID_512, *range(528, 2048, 16), 2048)
    assert every.max_capture_size == 2048


def test_capture_size_below_max_num_seqs_stops_decode_graphs_with_a_note():
    """max_cudagraph_capture_size=16 with 32 sequences: decode graphs stop at 16 requests and say why."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")])
    cg = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=32, max_cudagraph_capture_size=16),
                      Budget.kv_bytes("1GiB")).cudagraph
    assert cg.capture_sizes.decode == (1, 2, 4, 8, 16)
    assert cg.capture_sizes.mixed == (1, 2, 4, 8, 16)
    assert cg.downgrades == ("decode graphs stop at 16 requests (16 tokens): steps above 16 tokens are not captured "
                             "(max_cudagraph_capture_size=16); larger decode steps run uncaptured",)


def test_decode_sizes_stay_on_the_grid_when_the_ceiling_ends_them():
    """A limit of 300 tokens with 1024 sequences: decode and mixed graphs both stop at 288, vLLM's last grid size
    below 300 (300 is neither max_num_seqs nor the step budget, so it is no capture size)."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")])
    cg = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=1024, max_cudagraph_capture_size=300),
                      Budget.kv_bytes("1GiB")).cudagraph
    assert cg.capture_sizes.decode[-3:] == (256, 272, 288) and cg.capture_sizes.mixed[-1] == 288
    assert cg.max_capture_size == 288
    assert cg.downgrades[0].startswith("decode graphs stop at 288 requests (288 tokens): steps above 300 tokens")


def test_a_thousand_speculative_tokens_still_capture_one_decode_step():
    """k=1024: vLLM's 512-token cap is below one request's 1025-token decode step; the plan captures that step (a
    regression: the planner indexed an empty decode ladder and raised IndexError)."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")])
    cg = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=4, max_num_batched_tokens=8192,
                                    num_speculative_tokens=1024), Budget.kv_bytes("1GiB")).cudagraph
    assert cg.capture_sizes.decode == (1025,) and cg.max_capture_size == 1025
    assert cg.downgrades[0].startswith("decode graphs stop at 1 request (1025 tokens): steps above 1025 tokens")


def test_a_capture_size_below_one_decode_step_is_refused():
    """max_cudagraph_capture_size=2 with 3 speculative tokens could capture no decode step: SpecError naming both."""
    with pytest.raises(SpecError, match="max_cudagraph_capture_size") as info:
        Limits(max_cudagraph_capture_size=2, num_speculative_tokens=3)
    assert "must be >= 1 + num_speculative_tokens=4" in str(info.value)
    assert "raise max_cudagraph_capture_size to >= 4" in str(info.value)


def test_a_capture_ceiling_above_2_to_the_20_tokens_is_refused_and_2_to_the_20_is_planned():
    """Every 16th size up to 2**31 tokens (134 million graphs) never finished planning: a ceiling above 1,048,576
    tokens (after the max_num_batched_tokens cap) is refused naming both limits; 1,048,576 itself has 65,555 sizes,
    and a huge max_cudagraph_capture_size under a small token budget is still just capped by it."""
    with pytest.raises(SpecError, match=r"max_cudagraph_capture_size=2147483647: must be <= 1048576 tokens "
                                        r"\(max_num_batched_tokens=2147483647\)") as info:
        Limits(max_cudagraph_capture_size=2**31 - 1, max_num_batched_tokens=2**31 - 1)
    assert "lower max_cudagraph_capture_size to <= 1048576" in str(info.value)
    with pytest.raises(SpecError, match="must be <= 1048576 tokens"):
        Limits(max_cudagraph_capture_size=2**20 + 1, max_num_batched_tokens=2**20 + 1)
    sizes = engine_capture_sizes(2**20, 2**20)
    assert len(sizes) == 65555 and sizes[-1] == 2**20
    Limits(max_cudagraph_capture_size=2**20, max_num_batched_tokens=2**20)
    assert Limits(max_cudagraph_capture_size=2**31 - 1).max_cudagraph_capture_size == 2**31 - 1  # capped by 8192


def test_a_capture_size_under_mode_none_is_said_to_have_no_effect():
    """cudagraph_mode NONE captures nothing: a max_cudagraph_capture_size given with it is noted, not silently kept."""
    model = ModelKV.from_specs("m", [(FullAttentionSpec(num_kv_heads=8, head_size=128), "flash_attn")] * 2)
    cg = compile_plan(model, Limits(cudagraph_mode=CudaGraphMode.NONE, max_cudagraph_capture_size=16),
                      Budget.kv_bytes("1GiB")).cudagraph
    assert cg.downgrades == ("max_cudagraph_capture_size=16 has no effect: cudagraph_mode NONE captures no graph",)
    assert cg.capture_sizes.decode == cg.capture_sizes.mixed == ()
    quiet = compile_plan(model, Limits(cudagraph_mode=CudaGraphMode.NONE), Budget.kv_bytes("1GiB"))
    assert quiet.cudagraph.downgrades == ()


def test_support_is_the_minimum_and_names_the_backend():
    """flash_attn (ALWAYS) + flashinfer (UNIFORM_SINGLE_TOKEN_DECODE): support is the latter, from flashinfer."""
    cg = fa_plus_flashinfer().cudagraph
    assert cg.support is CudaGraphSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert cg.limited_by == "group 1 (flashinfer)"
    assert cg.mode is CudaGraphMode.FULL_AND_PIECEWISE  # the default request; decode graphs are possible
    assert cg.downgrades == ()


def test_full_on_non_always_downgrades_with_a_note():
    """FULL requested with a non-ALWAYS backend becomes FULL_AND_PIECEWISE and says why."""
    cg = fa_plus_flashinfer(cudagraph_mode="FULL").cudagraph
    assert cg.requested_mode is CudaGraphMode.FULL
    assert cg.mode is CudaGraphMode.FULL_AND_PIECEWISE
    assert len(cg.downgrades) == 1
    assert cg.downgrades[0].startswith("FULL -> FULL_AND_PIECEWISE")
    assert "group 1 (flashinfer) supports UNIFORM_SINGLE_TOKEN_DECODE" in cg.downgrades[0]


def test_full_on_always_backends_is_kept():
    """FULL on ALWAYS backends only stays FULL and captures both decode and mixed sizes (vLLM's: 20 is no size)."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn"), (SLIDING, "triton_paged")])
    plan = compile_plan(model, Limits(max_model_len=4096, max_num_seqs=20, max_num_batched_tokens=2048,
                                      cudagraph_mode="FULL"), Budget.kv_bytes("1GiB"))
    cg = plan.cudagraph
    assert cg.support is CudaGraphSupport.ALWAYS
    assert cg.mode is CudaGraphMode.FULL
    assert cg.capture_sizes.decode == (1, 2, 4, 8, 16)  # 17..20 requests run on the mixed graph of 24, as in vLLM
    assert cg.capture_sizes.mixed == (1, 2, 4, 8, 16, 24, 32, 40)  # up to 2 x max_num_seqs, as vLLM


@pytest.mark.parametrize("mode, key, run_as, reason", [
    ("FULL_AND_PIECEWISE", 24, CudaGraphMode.PIECEWISE, None),
    ("FULL", 24, CudaGraphMode.FULL, None),
    ("FULL_DECODE_ONLY", None, CudaGraphMode.NONE, "uniform step above the largest decode capture size 16; "
                                                   "cudagraph mode FULL_DECODE_ONLY captures no mixed"),
])
def test_decode_steps_above_the_last_decode_size_run_on_a_mixed_graph_or_eagerly(mode, key, run_as, reason):
    """max_num_seqs=20 has decode graphs up to 16: a decode step of 17..20 requests takes the mixed graph of 24 tokens,
    as vLLM dispatches it, or runs eagerly saying why where no mixed graph is captured."""
    from graphkv.runtime.capture.keys import GraphKey, dispatch

    model = ModelKV.from_specs("m", [(FULL, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=1024, max_num_seqs=20, max_num_batched_tokens=8192,
                                      cudagraph_mode=mode), Budget.kv_bytes("1GiB"))
    assert plan.cudagraph.capture_sizes.decode == (1, 2, 4, 8, 16)
    for num_reqs in (17, 20):
        d = dispatch(plan.cudagraph, plan.limits, num_tokens=num_reqs, num_reqs=num_reqs, uniform=True)
        assert d.key == (None if key is None else GraphKey(num_tokens=key, num_reqs=None, uniform=False))
        assert d.mode is run_as
        assert (d.eager_reason is None) if reason is None else d.eager_reason.startswith(reason)


def test_speculative_tokens_with_single_token_decode_backend_fall_back_to_piecewise():
    """num_speculative_tokens=2 needs UNIFORM_BATCH: with flashinfer the mode becomes PIECEWISE."""
    cg = fa_plus_flashinfer(num_speculative_tokens=2, max_num_batched_tokens=2048).cudagraph
    assert cg.mode is CudaGraphMode.PIECEWISE
    assert cg.downgrades[0].startswith("FULL_AND_PIECEWISE -> PIECEWISE")
    assert "speculative decoding: queries of 1 + 2 tokens" in cg.downgrades[0]
    assert cg.capture_sizes.decode == ()
    # min(2 x 256 x 3, 512), plus vLLM's uniform decode steps 3 x (1, 2, 4, 8, 16, ..., 168) within it
    assert cg.capture_sizes.mixed == tuple(sorted({*GRID_512, 3, 6, 12, *range(24, 505, 24)}))


def test_full_decode_only_impossible_is_a_capture_error():
    """FULL_DECODE_ONLY with speculative tokens on flashinfer raises CaptureError naming cudagraph_mode."""
    with pytest.raises(CaptureError, match="full decode graphs need UNIFORM_BATCH") as info:
        fa_plus_flashinfer(num_speculative_tokens=1, cudagraph_mode="FULL_DECODE_ONLY")
    assert info.value.field == "cudagraph_mode"
    assert info.value.value == "FULL_DECODE_ONLY"


def test_full_decode_only_with_a_never_backend_is_a_capture_error():
    """A backend that never captures makes FULL_DECODE_ONLY impossible even without speculation."""
    never = Backend(name="eager_only", supported_kernel_block_sizes=(16,), cudagraph_support=CudaGraphSupport.NEVER,
                    kv_layout=KVLayout(order=CacheOrder.BLOCKS_FIRST))
    model = ModelKV.from_specs("m", [(FULL, never)])
    with pytest.raises(CaptureError, match=r"group 0 \(eager_only\) supports NEVER"):
        compile_plan(model, Limits(max_model_len=1024, cudagraph_mode="FULL_DECODE_ONLY"), Budget.kv_bytes("1GiB"))
    # PIECEWISE does not capture attention, so it stays possible.
    plan = compile_plan(model, Limits(max_model_len=1024, cudagraph_mode="PIECEWISE"), Budget.kv_bytes("1GiB"))
    assert plan.cudagraph.mode is CudaGraphMode.PIECEWISE


def test_decode_sizes_are_multiples_of_one_plus_k_and_include_the_maximum():
    """With k=2 and a UNIFORM_BATCH Mamba group, decode sizes are 3 x ladder(20), ending at 20 * 3 = 60."""
    attn = FullAttentionSpec(num_kv_heads=2, head_size=64)
    mamba = MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=("bfloat16", "float32"))
    model = ModelKV.from_specs("h", [(attn, "flash_attn"), (mamba, "mamba")])
    plan = compile_plan(model, Limits(max_model_len=2720, max_num_seqs=20, max_num_batched_tokens=512,
                                      num_speculative_tokens=2), Budget.kv_bytes("1GiB"))
    cg = plan.cudagraph
    assert cg.support is CudaGraphSupport.UNIFORM_BATCH
    assert cg.limited_by == "group 1 (mamba)"
    assert cg.mode is CudaGraphMode.FULL_AND_PIECEWISE
    # min(20, 512 // 3 = 170) = 20 requests; ladder(20) = 1, 2, 4, 8, 16, 20.
    assert cg.capture_sizes.decode == (3, 6, 12, 24, 48, 60)
    assert cg.capture_sizes.mixed[-1] == 120  # 2 x 20 x 3


def test_decode_sizes_stop_where_the_token_budget_is_full():
    """100 sequences x 3 tokens exceed 150 tokens per step: decode graphs stop at 50 requests (150 tokens)."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")])
    plan = compile_plan(model, Limits(max_model_len=1024, max_num_seqs=100, max_num_batched_tokens=150,
                                      num_speculative_tokens=2), Budget.kv_bytes("1GiB"))
    cg = plan.cudagraph
    assert cg.capture_sizes.decode[-1] == 150
    assert all(size % 3 == 0 for size in cg.capture_sizes.decode)
    assert "decode graphs stop at 50 requests" in cg.downgrades[0]
    assert cg.capture_sizes.mixed[-1] == 150


def test_mode_none_and_piecewise_capture_sizes():
    """NONE captures nothing; PIECEWISE only mixed sizes; FULL_DECODE_ONLY only decode sizes."""
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")])

    def sizes(mode):
        limits = Limits(max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=64, cudagraph_mode=mode)
        return compile_plan(model, limits, Budget.kv_bytes("1GiB")).cudagraph.capture_sizes

    assert (sizes("NONE").decode, sizes("NONE").mixed) == ((), ())
    assert (sizes("PIECEWISE").decode, sizes("PIECEWISE").mixed) == ((), (1, 2, 4, 8, 16))  # 2 x 8
    assert (sizes("FULL_DECODE_ONLY").decode, sizes("FULL_DECODE_ONLY").mixed) == ((1, 2, 4, 8), ())
