"""On a GPU the static buffers, the allocator rounding and the graph pool beside the KV pool must fit, or the plan is
refused."""

from __future__ import annotations

import re

import attrs
import pytest

from graphkv import Budget, CapacityError, Limits
from graphkv.plan.gpu_fit import beside_pool_bytes, compile_for_gpu
from graphkv.presets import preset_model
from graphkv.presets.weights import PRESET_WEIGHT_BYTES

H100_USABLE = int(81559 * (1 << 20) * 0.9)  # H100 total as nvidia-smi reports it, x utilization 0.9
LLAMA_WEIGHTS = PRESET_WEIGHT_BYTES["llama-3.1-8b"]
LLAMA_PAGE_INDEX = 32 * 16 * 8 * 256 * 2  # 32 layers x 16 tokens x 8 kv heads x (128 + 128) x 2 B


@pytest.fixture(scope="module")
def llama():
    return preset_model("llama-3.1-8b")


def test_auto_reserve_holds_the_plans_own_buffers(llama) -> None:
    """With no --graph-reserve, the reserve holds the plan's static buffers, allocator rounding, cuBLAS workspaces and
    graph pool; the pool gets the rest."""
    fitted = compile_for_gpu(llama, Limits(max_model_len=32768), Budget.for_gpu("H100", weights_bytes=LLAMA_WEIGHTS))
    reserve = fitted.budget.graph_reserve_bytes
    assert fitted.reserve_is_auto and reserve >= fitted.beside_bytes == beside_pool_bytes(fitted.plan) > 0
    assert fitted.plan.num_blocks == (H100_USABLE - LLAMA_WEIGHTS - reserve) // LLAMA_PAGE_INDEX
    # 32k context on one H100: 2048 pages per request, 14 of them at once
    assert fitted.plan.capacity.max_concurrency == 14
    assert fitted.plan.notes[-1].endswith("for full-length requests, max_num_seqs <= 14")


def test_a_billion_tokens_per_step_is_refused_naming_the_largest_that_fits(llama) -> None:
    """max_num_batched_tokens=1e10 needs 400 GiB of step buffers beside the pool; the error names the largest value that
    fits."""
    budget = Budget.for_gpu("H100", weights_bytes=LLAMA_WEIGHTS)
    with pytest.raises(CapacityError) as info:
        compile_for_gpu(llama, Limits(max_num_batched_tokens=10**10), budget)
    message = str(info.value)
    assert message.startswith("max_num_batched_tokens=10000000000: the plan needs")
    largest = int(re.search(r"lower max_num_batched_tokens to <= (\d+)", message).group(1))
    compile_for_gpu(llama, Limits(max_num_batched_tokens=largest), budget)  # fits
    with pytest.raises(CapacityError):
        compile_for_gpu(llama, Limits(max_num_batched_tokens=largest + 1), budget)


def test_auto_reserve_counts_the_allocator_rounding(llama) -> None:
    """llama-3.1-8b on an H100: the pool stops at 28928 pages, whose 32 slots end on whole 2 MiB segments, because
    with more pages the slots' last segments would not fit beside the static buffers, their rounding, the cuBLAS
    workspaces and the graph pool."""
    budget = Budget.for_gpu("H100", weights_bytes=LLAMA_WEIGHTS)
    fitted = compile_for_gpu(llama, Limits(), budget)
    room = H100_USABLE - LLAMA_WEIGHTS  # 60,908,206,489 B for the pool and what sits beside it
    other = {e.name: e.nbytes for e in fitted.plan.ledger.other_entries}
    # tables.device (16 MiB) takes a segment of its own, the seven other buffers (372,756 B) one 2 MiB small
    # segment: 18 MiB reserved for 17,149,972 B of tensors, +1,724,396 B. cuBLAS + cuBLASLt on 2 streams: 2 x 34 MiB.
    assert other["static buffers"] == 17_149_972 and other["allocator rounding"] == 18 * (1 << 20) - 17_149_972
    assert other["lazy workspaces"] == 2 * 34 * (1 << 20) == 71_303_168
    # The graph pool: the shipped calibration over vLLM's capture sizes (decode 1..256, mixed 1..512).
    assert fitted.beside_bytes == 17_149_972 + 1_724_396 + 71_303_168 + other["graph pool"] == 227_655_680
    # At tensor bytes (room - beside) // 2 MiB = 28934 pages would fit; but a slot holds 65536 B per page, so 28934
    # pages (904 x 32 + 6) reserve 905 x 2 MiB per slot, as 28960 pages would: 32 x 905 x 2 MiB + beside > room.
    # 28928 = 904 x 32 pages fill 904 segments per slot exactly (pool rounding 0).
    assert (room - fitted.beside_bytes) // LLAMA_PAGE_INDEX == 28934
    assert 32 * 905 * 2 * (1 << 20) + fitted.beside_bytes > room >= 28928 * LLAMA_PAGE_INDEX + fitted.beside_bytes
    assert fitted.plan.num_blocks == 28928
    memory = fitted.plan.ledger.cuda_memory()
    assert memory.pool.reserved_bytes == memory.pool.tensor_bytes == 28928 * LLAMA_PAGE_INDEX
    # The reserve is the smallest that leaves 28928 pages: 28929 pages' bytes would leave room - 1 B of it.
    assert fitted.budget.graph_reserve_bytes == room - 28929 * LLAMA_PAGE_INDEX + 1 == 239_696_282
    with pytest.raises(CapacityError, match="graph_reserve_bytes=239696281: the plan needs"):
        compile_for_gpu(llama, Limits(), attrs.evolve(budget, graph_reserve_bytes=239_696_281))  # 28929 pages


def test_explicit_reserve_too_small_is_refused(llama) -> None:
    """A --graph-reserve below what the plan puts beside the pool is refused, naming the automatic reserve, which
    fits, as does any larger one."""
    budget = Budget.for_gpu("H100", weights_bytes=LLAMA_WEIGHTS, graph_reserve_bytes=1 << 20)
    with pytest.raises(CapacityError) as info:
        compile_for_gpu(llama, Limits(max_model_len=8192), budget)
    need = compile_for_gpu(llama, Limits(max_model_len=8192), attrs.evolve(budget, graph_reserve_bytes=0)
                           ).budget.graph_reserve_bytes
    assert info.value.field == "graph_reserve_bytes"
    assert ("of static buffers, allocator rounding, cuBLAS workspaces and estimated graph pool beside the KV pool"
            in str(info.value))
    assert f"set graph_reserve_bytes to {need} (what the automatic reserve picks when it is left unset" in str(info.value)
    for reserve in (need, need + 7 * LLAMA_PAGE_INDEX, 1 << 30):
        fitted = compile_for_gpu(llama, Limits(max_model_len=8192), attrs.evolve(budget, graph_reserve_bytes=reserve))
        assert fitted.plan.num_blocks * LLAMA_PAGE_INDEX + fitted.beside_bytes <= H100_USABLE - LLAMA_WEIGHTS
