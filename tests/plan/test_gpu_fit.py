"""On a GPU the static buffers and the graph pool beside the KV pool must fit, or the plan is refused."""

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
    """With no --graph-reserve, the reserve is the plan's static buffers + graph pool; the pool gets the rest."""
    fitted = compile_for_gpu(llama, Limits(max_model_len=32768), Budget.for_gpu("H100", weights_bytes=LLAMA_WEIGHTS))
    reserve = fitted.budget.graph_reserve_bytes
    assert fitted.reserve_is_auto and reserve >= fitted.beside_bytes == beside_pool_bytes(fitted.plan) > 0
    assert fitted.plan.num_blocks == (H100_USABLE - LLAMA_WEIGHTS - reserve) // LLAMA_PAGE_INDEX
    # 32k context on one H100: 2048 pages per request, 14 of them at once
    assert fitted.plan.capacity.max_concurrency == 14
    assert fitted.plan.notes[-1].endswith("for full-length requests, max_num_seqs <= 14")


def test_a_billion_tokens_per_step_is_refused_naming_the_largest_that_fits(llama) -> None:
    """max_num_batched_tokens=1e9 needs TiB beside the pool; the error names the largest value that fits."""
    budget = Budget.for_gpu("H100", weights_bytes=LLAMA_WEIGHTS)
    with pytest.raises(CapacityError) as info:
        compile_for_gpu(llama, Limits(max_num_batched_tokens=10**9), budget)
    message = str(info.value)
    assert message.startswith("max_num_batched_tokens=1000000000: the plan needs")
    largest = int(re.search(r"lower max_num_batched_tokens to <= (\d+)", message).group(1))
    compile_for_gpu(llama, Limits(max_num_batched_tokens=largest), budget)  # fits
    with pytest.raises(CapacityError):
        compile_for_gpu(llama, Limits(max_num_batched_tokens=largest + 1), budget)


def test_explicit_reserve_too_small_is_refused(llama) -> None:
    """A --graph-reserve below the plan's static buffers + graph pool is refused with the size it needs."""
    budget = Budget.for_gpu("H100", weights_bytes=LLAMA_WEIGHTS, graph_reserve_bytes=1 << 20)
    with pytest.raises(CapacityError) as info:
        compile_for_gpu(llama, Limits(max_model_len=8192), budget)
    need = beside_pool_bytes(compile_for_gpu(llama, Limits(max_model_len=8192),
                                             attrs.evolve(budget, graph_reserve_bytes=1 << 30)).plan)
    assert info.value.field == "graph_reserve_bytes"
    assert f"raise graph_reserve_bytes to >= {need}" in str(info.value)
