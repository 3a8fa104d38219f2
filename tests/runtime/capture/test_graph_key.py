"""Graph keys: the smallest captured key that holds a step, or None (eager), for every batch size."""

import pytest

from capture_toys import backend_with, make_plan, with_mode
from graphkv import CaptureError, CudaGraphMode, CudaGraphSupport
from graphkv.runtime.capture.keys import GraphKey, capture_keys, dispatch, select_key

FULL_MODES = (CudaGraphMode.FULL, CudaGraphMode.FULL_DECODE_ONLY, CudaGraphMode.FULL_AND_PIECEWISE)
MIXED_MODES = (CudaGraphMode.FULL, CudaGraphMode.PIECEWISE, CudaGraphMode.FULL_AND_PIECEWISE)

PLANS = {
    "always_full": make_plan("flash_attn", max_num_seqs=64, max_num_batched_tokens=600, cudagraph_mode="FULL"),
    "uniform_batch_spec3": make_plan(backend_with(CudaGraphSupport.UNIFORM_BATCH), max_num_seqs=100,
                                     max_num_batched_tokens=256, num_speculative_tokens=3),
    "full_decode_only": make_plan("flashinfer", max_num_seqs=48, max_num_batched_tokens=300,
                                  cudagraph_mode="FULL_DECODE_ONLY"),
    "piecewise": make_plan("flash_attn", max_num_seqs=32, max_num_batched_tokens=520, cudagraph_mode="PIECEWISE"),
    "none": make_plan("flash_attn", max_num_seqs=16, max_num_batched_tokens=64, cudagraph_mode="NONE"),
    "full_forced_on_uniform_batch": with_mode(make_plan(backend_with(CudaGraphSupport.UNIFORM_BATCH), max_num_seqs=24,
                                                        max_num_batched_tokens=128), CudaGraphMode.FULL),
}


def oracle(plan, num_tokens, num_reqs, uniform):
    """Reference: the smallest allowed capture size >= num_tokens, decode ladder first for uniform steps."""
    cg, limits = plan.cudagraph, plan.limits
    q = 1 + limits.num_speculative_tokens
    if cg.mode is CudaGraphMode.NONE or num_reqs > limits.max_num_seqs:
        return None
    needs = CudaGraphSupport.UNIFORM_BATCH if q > 1 else CudaGraphSupport.UNIFORM_SINGLE_TOKEN_DECODE
    if uniform and cg.mode in FULL_MODES and cg.support >= needs:
        fits = [s for s in cg.capture_sizes.decode if s >= num_tokens]
        if fits:
            return GraphKey(num_tokens=min(fits), num_reqs=min(fits) // q, uniform=True)
    if cg.mode in MIXED_MODES and (cg.mode is not CudaGraphMode.FULL or cg.support is CudaGraphSupport.ALWAYS):
        fits = [s for s in cg.capture_sizes.mixed if s >= num_tokens]
        if fits:
            return GraphKey(num_tokens=min(fits), num_reqs=None, uniform=False)
    return None


@pytest.mark.parametrize("name", sorted(PLANS))
def test_uniform_steps_for_every_request_count(name):
    """Every uniform decode step up to past max_num_seqs gets the oracle's key, padded minimally, or None."""
    plan = PLANS[name]
    q = 1 + plan.limits.num_speculative_tokens
    keys = set(capture_keys(plan.cudagraph, plan.limits))
    for num_reqs in range(1, plan.limits.max_num_seqs + 8):
        n = num_reqs * q
        if n > plan.limits.max_num_batched_tokens + 8 * q:
            break
        key = select_key(plan.cudagraph, plan.limits, num_tokens=n, num_reqs=num_reqs, uniform=True)
        assert key == oracle(plan, n, num_reqs, True), (name, num_reqs)
        if key is not None:
            assert key in keys and key.num_tokens >= n
            if key.uniform:
                assert key.num_reqs * q == key.num_tokens and key.num_reqs >= num_reqs


@pytest.mark.parametrize("name", sorted(PLANS))
def test_mixed_steps_for_every_token_count(name):
    """Every mixed step up to past max_num_batched_tokens gets the oracle's key (num_reqs=None) or None."""
    plan = PLANS[name]
    keys = set(capture_keys(plan.cudagraph, plan.limits))
    for n in range(1, plan.limits.max_num_batched_tokens + 40):
        for num_reqs in {1, min(n, plan.limits.max_num_seqs)}:
            key = select_key(plan.cudagraph, plan.limits, num_tokens=n, num_reqs=num_reqs, uniform=False)
            assert key == oracle(plan, n, num_reqs, False), (name, n, num_reqs)
            if key is not None:
                assert key in keys and not key.uniform and key.num_reqs is None and key.num_tokens >= n


@pytest.mark.parametrize("name", sorted(PLANS))
def test_capture_keys_are_largest_first_and_all_reachable(name):
    """capture_keys lists keys largest first, and each is the key of a step of exactly its size."""
    plan = PLANS[name]
    keys = capture_keys(plan.cudagraph, plan.limits)
    assert [k.num_tokens for k in keys] == sorted((k.num_tokens for k in keys), reverse=True)
    for key in keys:
        num_reqs = key.num_reqs if key.uniform else 1
        assert select_key(plan.cudagraph, plan.limits, num_tokens=key.num_tokens, num_reqs=num_reqs,
                          uniform=key.uniform) == key


def test_always_full_explicit_numbers():
    """FULL on ALWAYS: decode 3 -> 4 requests, mixed 9 -> 16 tokens, 257 -> 272, 600 fits, 601 is eager."""
    plan = PLANS["always_full"]
    cg, lim = plan.cudagraph, plan.limits
    assert select_key(cg, lim, num_tokens=3, num_reqs=3, uniform=True) == GraphKey(num_tokens=4, num_reqs=4,
                                                                                  uniform=True)
    assert select_key(cg, lim, num_tokens=9, num_reqs=2, uniform=False) == GraphKey(num_tokens=16, num_reqs=None,
                                                                                  uniform=False)
    assert select_key(cg, lim, num_tokens=257, num_reqs=5, uniform=False).num_tokens == 272
    assert select_key(cg, lim, num_tokens=600, num_reqs=5, uniform=False).num_tokens == 600
    step = dispatch(cg, lim, num_tokens=601, num_reqs=5, uniform=False)
    assert step.key is None and step.mode is CudaGraphMode.NONE
    assert step.eager_reason == "num_tokens above the largest mixed capture size 600"


def test_speculative_decode_pads_requests_in_query_lengths():
    """With 3 speculative tokens, 3 requests (12 tokens) pad to 4 requests (16); 5 to 8 (32); mixed runs piecewise."""
    plan = PLANS["uniform_batch_spec3"]
    cg, lim = plan.cudagraph, plan.limits
    assert cg.mode is CudaGraphMode.FULL_AND_PIECEWISE
    assert select_key(cg, lim, num_tokens=12, num_reqs=3, uniform=True) == GraphKey(num_tokens=16, num_reqs=4,
                                                                                   uniform=True)
    assert select_key(cg, lim, num_tokens=20, num_reqs=5, uniform=True) == GraphKey(num_tokens=32, num_reqs=8,
                                                                                   uniform=True)
    assert dispatch(cg, lim, num_tokens=13, num_reqs=3, uniform=False).mode is CudaGraphMode.PIECEWISE
    # decode graphs stop at 256 // 4 = 64 requests; 65 uniform requests (260 tokens) exceed every ladder
    assert select_key(cg, lim, num_tokens=256, num_reqs=64, uniform=True).num_reqs == 64
    assert select_key(cg, lim, num_tokens=260, num_reqs=65, uniform=True) is None


def test_full_decode_only_runs_mixed_steps_eagerly():
    """FULL_DECODE_ONLY captures uniform decode only; a mixed step says why it runs eagerly."""
    plan = PLANS["full_decode_only"]
    cg, lim = plan.cudagraph, plan.limits
    assert select_key(cg, lim, num_tokens=48, num_reqs=48, uniform=True) == GraphKey(num_tokens=48, num_reqs=48,
                                                                                    uniform=True)
    step = dispatch(cg, lim, num_tokens=5, num_reqs=2, uniform=False)
    assert step.key is None
    assert step.eager_reason == "cudagraph mode FULL_DECODE_ONLY captures no mixed (prefill + decode) graphs"


def test_piecewise_serves_uniform_steps_from_the_mixed_ladder():
    """PIECEWISE has no decode graphs: a uniform step of 5 requests runs on the piecewise mixed key of 8 tokens."""
    plan = PLANS["piecewise"]
    step = dispatch(plan.cudagraph, plan.limits, num_tokens=5, num_reqs=5, uniform=True)
    assert step.key == GraphKey(num_tokens=8, num_reqs=None, uniform=False)
    assert step.mode is CudaGraphMode.PIECEWISE


def test_none_mode_and_unsupported_keys_are_eager_with_a_reason():
    """Mode NONE, too many requests, and FULL mixed keys without ALWAYS support all run eagerly, with reasons."""
    none = PLANS["none"]
    assert dispatch(none.cudagraph, none.limits, num_tokens=1, num_reqs=1, uniform=True).eager_reason == \
        "cudagraph mode NONE captures no graphs"
    full = PLANS["always_full"]
    assert dispatch(full.cudagraph, full.limits, num_tokens=100, num_reqs=65, uniform=False).eager_reason == \
        "num_reqs above max_num_seqs=64"
    forced = PLANS["full_forced_on_uniform_batch"]
    step = dispatch(forced.cudagraph, forced.limits, num_tokens=7, num_reqs=2, uniform=False)
    assert step.key is None
    assert "full mixed graphs need cudagraph support ALWAYS" in step.eager_reason
    assert select_key(forced.cudagraph, forced.limits, num_tokens=7, num_reqs=7, uniform=True).num_tokens == 8


def test_impossible_steps_are_errors():
    """num_tokens < 1, num_reqs > num_tokens and a 'uniform' step of the wrong size raise CaptureError."""
    plan = PLANS["uniform_batch_spec3"]
    with pytest.raises(CaptureError, match="num_tokens=0: must be an int >= 1"):
        select_key(plan.cudagraph, plan.limits, num_tokens=0, num_reqs=1, uniform=False)
    with pytest.raises(CaptureError, match="num_reqs=5: exceeds num_tokens=4"):
        select_key(plan.cudagraph, plan.limits, num_tokens=4, num_reqs=5, uniform=False)
    with pytest.raises(CaptureError, match=r"uniform=True: a uniform step has num_tokens == num_reqs \* "):
        select_key(plan.cudagraph, plan.limits, num_tokens=5, num_reqs=2, uniform=True)
