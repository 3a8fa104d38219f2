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


def test_ten_billion_tokens_per_step_with_a_byte_budget_is_a_warning_naming_the_buffers(llama) -> None:
    """1e10 tokens per step in 1 GiB: 400.47 GiB of static buffers (3.03 MiB more in the allocator's segments),
    more than any GPU. The graph pool stays at vLLM's 512-token captures (131.11 MiB)."""
    plan = compile(llama, Limits(max_num_batched_tokens=10**10), Budget.kv_bytes("1GiB"))
    (note,) = _warnings(plan)
    assert note.startswith("WARNING: max_num_batched_tokens=10000000000 puts 400.67 GiB on the GPU beside the KV pool "
                           "(static buffers 400.47 GiB + allocator rounding 3.03 MiB + lazy workspaces 68.00 MiB + "
                           "graph pool 131.11 MiB), more than the 1.00 GiB pool itself, "
                           "more than any known GPU holds (H200: 140.40 GiB); the step buffers grow with it.")
    assert "Lower max_num_batched_tokens" in note and "plan with a GPU budget (--gpu NAME" in note
    assert plan.notes[-1].startswith("max_num_seqs=256 exceeds")  # the max_num_seqs note stays last


def test_the_same_limits_on_a_gpu_are_refused(llama) -> None:
    """With a GPU budget the buffers must fit beside the pool: refused, naming the largest step that fits."""
    with pytest.raises(CapacityError, match=r"lower max_num_batched_tokens to <= \d+"):
        compile_for_gpu(llama, Limits(max_num_batched_tokens=10**10), Budget.for_gpu("H100", weights_bytes=16 << 30))


def test_buffers_above_the_pool_but_below_a_gib_are_quiet(llama) -> None:
    """The default step budget (509 MiB beside the pool) gives no warning, in 16 GiB or beside a toy 16 MiB pool."""
    assert _warnings(compile(llama, Limits(), Budget.kv_bytes("16GiB"))) == []
    toy = compile(llama, Limits(max_model_len=64, num_blocks_override=8))
    assert toy.pool_bytes < toy.ledger.beside_pool_device_bytes < 1 << 30 and _warnings(toy) == []


def test_the_warning_follows_the_step_budget_and_the_captures(llama) -> None:
    """100k tokens per step, captured up to vLLM's 512 tokens: 223 MiB beside a 1 GiB pool, quiet. Captured up to
    100k tokens (6,304 keys on vLLM's grid of 16): a 2.33 TiB graph pool, warned, naming both limits to lower."""
    quiet = compile(llama, Limits(max_num_batched_tokens=100_000), Budget.kv_bytes("1GiB"))
    # 5,367,028 B of static buffers reserve 24 MiB: the 3,204,096 B staging.int64 (a large block under 10 MiB) takes a
    # 20 MiB segment, the seven small ones two 2 MiB segments; 25,165,824 - 5,367,028 = 19,798,796 B = 18.88 MiB.
    other = {e.name: e.nbytes for e in quiet.ledger.other_entries if e.on_device}
    assert (other["static buffers"], other["allocator rounding"]) == (5_367_028, 19_798_796)
    assert _warnings(quiet) == [] and quiet.cudagraph.max_capture_size == 512
    captured = compile(llama, Limits(max_num_batched_tokens=100_000, max_cudagraph_capture_size=100_000),
                       Budget.kv_bytes("1GiB"))
    (note,) = _warnings(captured)
    assert len(captured.ledger.graph_keys) == 6304
    assert "(static buffers 5.12 MiB + allocator rounding 18.88 MiB + lazy workspaces 68.00 MiB + graph pool 2.33 TiB)" \
        in note
    assert ("the step buffers grow with it, the graph pool with max_cudagraph_capture_size=100000. Lower "
            "max_num_batched_tokens (vLLM's defaults are 2048-8192) or max_cudagraph_capture_size") in note
    assert _warnings(compile(llama, Limits(max_num_batched_tokens=8192), Budget.kv_bytes("4GiB"))) == []


def test_graphkv_plan_prints_the_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """`graphkv plan --max-num-batched-tokens 2e9` (no --gpu) plans, and its Notes carry the warning."""
    assert main(["plan", "--max-num-batched-tokens", "2e9"]) == 0
    out = capsys.readouterr().out
    assert "  - WARNING: max_num_batched_tokens=2000000000 puts " in out
