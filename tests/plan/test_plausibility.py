"""A plan whose buffers beside the pool exceed the pool (and 1 GiB) says so in a WARNING note; a GPU budget refuses."""

from __future__ import annotations

import pytest

from graphkv import Budget, CapacityError, Limits, compile
from graphkv.cli import main
from graphkv.plan.gpu_fit import compile_for_gpu
from graphkv.presets import preset_model


@pytest.fixture(scope="module")
def llama():
    return preset_model("llama-3.1-8b")


def _warnings(plan) -> list[str]:
    return [note for note in plan.notes if note.startswith("WARNING: max_num_batched_tokens=")]


def test_a_billion_tokens_per_step_with_a_byte_budget_is_a_warning_naming_both_buffers(llama) -> None:
    """1e9 tokens per step in 1 GiB: 40.05 GiB of static buffers (2.99 MiB more in the allocator's segments) and a
    45.25 TiB graph pool, more than any GPU."""
    plan = compile(llama, Limits(max_num_batched_tokens=10**9), Budget.kv_bytes("1GiB"))
    (note,) = _warnings(plan)
    assert note.startswith("WARNING: max_num_batched_tokens=1000000000 puts 45.29 TiB on the GPU beside the KV pool "
                           "(static buffers 40.05 GiB + allocator rounding 2.99 MiB + lazy workspaces 68.00 MiB + graph "
                           "pool 45.25 TiB), more than "
                           "the 1.00 GiB pool itself, "
                           "more than any known GPU holds (H200: 140.40 GiB)")
    assert "Lower max_num_batched_tokens" in note and "plan with a GPU budget (--gpu NAME" in note
    assert plan.notes[-1].startswith("max_num_seqs=256 exceeds")  # the max_num_seqs note stays last


def test_the_same_limits_on_a_gpu_are_refused(llama) -> None:
    """With a GPU budget the buffers must fit beside the pool: refused, naming the largest step that fits."""
    with pytest.raises(CapacityError, match=r"lower max_num_batched_tokens to <= \d+"):
        compile_for_gpu(llama, Limits(max_num_batched_tokens=10**9), Budget.for_gpu("H100", weights_bytes=16 << 30))


def test_buffers_above_the_pool_but_below_a_gib_are_quiet(llama) -> None:
    """The default step budget (509 MiB beside the pool) gives no warning, in 16 GiB or beside a toy 16 MiB pool."""
    assert _warnings(compile(llama, Limits(), Budget.kv_bytes("16GiB"))) == []
    toy = compile(llama, Limits(max_model_len=64, num_blocks_override=8))
    assert toy.pool_bytes < toy.ledger.beside_pool_device_bytes < 1 << 30 and _warnings(toy) == []


def test_the_warning_follows_the_step_budget(llama) -> None:
    """100k tokens per step put 5.01 GiB beside a 1 GiB pool, 4.92 GiB of it graph pool (warned); 8192 do not."""
    (note,) = _warnings(compile(llama, Limits(max_num_batched_tokens=100_000), Budget.kv_bytes("1GiB")))
    # 5,367,028 B of static buffers reserve 24 MiB: the 3,204,096 B staging.int64 (a large block under 10 MiB) takes a
    # 20 MiB segment, the seven small ones two 2 MiB segments; 25,165,824 - 5,367,028 = 19,798,796 B = 18.88 MiB.
    assert "puts 5.01 GiB on the GPU beside the KV pool" in note and "more than any known GPU" not in note
    assert "(static buffers 5.12 MiB + allocator rounding 18.88 MiB + lazy workspaces 68.00 MiB + graph pool 4.92 GiB)" \
        in note
    assert _warnings(compile(llama, Limits(max_num_batched_tokens=8192), Budget.kv_bytes("4GiB"))) == []


def test_graphkv_plan_prints_the_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """`graphkv plan --max-num-batched-tokens 1e9` (no --gpu) plans, and its Notes carry the warning."""
    assert main(["plan", "--max-num-batched-tokens", "1e9"]) == 0
    out = capsys.readouterr().out
    assert "  - WARNING: max_num_batched_tokens=1000000000 puts 22.69 TiB on the GPU beside the KV pool" in out
