"""compile_consensus over real gloo process groups of 2 and 4 CPU processes.

One process group per test runs several checks in order (spawning costs ~2 s a group here):
unequal budgets agree on the smallest pool and every rank returns the identical plan; a
mismatched spec or a rank that cannot plan raises the same error on every rank; a rank that dies
makes the others raise within the consensus timeout instead of hanging.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="compile_consensus runs over torch.distributed (the runtime extra)")

import torch.distributed as dist  # noqa: E402

from gloo_workers import CONSENSUS_TIMEOUT_S, four_ranks, launch, two_ranks  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="this torch build has no torch.distributed gloo backend")

SLACK_S = 5.0  # process scheduling on a busy 2-core runner


def test_four_ranks_agree_refuse_mismatches_and_survive_a_dead_rank(tmp_path):
    """tp 2 x pp 2 with 10-13 GiB: one plan with rank 0's 3212 pages; fp8 on rank 1, a 1 MiB rank 2 and a dead
    rank 3 each end in a ConsensusError on every (surviving) rank."""
    seen = launch(four_ranks, 4, tmp_path)
    plans = [s["agree"]["plan"] for s in seen]
    assert all(plan == plans[0] for plan in plans)
    assert plans[0]["num_blocks"] == 3212 and [r["num_blocks"] for r in plans[0]["ranks"]] == [3212, 3533, 3855, 4176]
    assert [len(stage["layers"]) for stage in plans[0]["stages"]] == [24, 24]
    assert {stage["num_blocks"] for stage in plans[0]["stages"]} == {3212}
    for s in seen:
        assert s["mismatch"]["error"] == "ConsensusError" and s["mismatch"]["fields"] == ["model.layers[layers.3]"]
        assert "rank(s) [1]" in s["mismatch"]["message"] and "float8_e4m3fn" in s["mismatch"]["message"]
        assert s["own_failure"]["error"] == "ConsensusError"
        assert "rank 2 (tp 0, pp 1) could not plan its own cache: CapacityError" in s["own_failure"]["message"]
    for s in seen[:3]:
        assert s["dead"]["error"] == "ConsensusError" and s["dead"]["fields"] == ["timeout"]
        assert s["dead"]["seconds"] < CONSENSUS_TIMEOUT_S + SLACK_S
    messages = [s["dead"].get("message", s["dead"]) for s in seen[:3]]
    # "did not reach the consensus", or "had not reached" where rank 0 left first (os._exit closes the store)
    assert all("rank(s) [3] " in str(m) and "reach" in str(m) for m in messages), messages


def test_two_ranks_agree_refuse_other_limits_and_survive_a_dead_rank_zero(tmp_path):
    """tp 2 with 8 and 6 GiB (1 MiB per page index): both plan rank 1's 6144 pages and 6143 x 16 tokens;
    max_model_len 4096 on rank 1 only is named; an explicit cpu:gloo group (not plain gloo, like nccl) agrees on 4096
    pages of 4 GiB; rank 0 calling two timeouts late makes both raise within about the timeout (rank 1 waited on the
    group's own 20 s before); when rank 0 (the store's host) dies, rank 1 raises within the timeout."""
    seen = launch(two_ranks, 2, tmp_path)
    assert seen[0]["agree"]["plan"] == seen[1]["agree"]["plan"]
    plan = seen[0]["agree"]["plan"]
    assert [r["num_blocks"] for r in plan["ranks"]] == [8192, 6144] and plan["num_blocks"] == 6144
    assert plan["max_model_len"] == 6143 * 16 and plan["stages"][0]["max_model_len"] == 98288
    for s in seen:
        assert s["mismatch"]["fields"] == ["limits.max_model_len"] and "rank(s) [1]" in s["mismatch"]["message"]
        assert s["composite_backend"] == "cpu:gloo" and s["composite"]["plan"]["num_blocks"] == 4096
    # rank 0 two timeouts late: rank 1 gives up within the timeout (not the group's own 20 s), then rank 0 does too
    assert seen[1]["late_zero"]["error"] == "ConsensusError" and seen[1]["late_zero"]["fields"] == ["timeout"]
    assert seen[1]["late_zero"]["seconds"] < CONSENSUS_TIMEOUT_S + SLACK_S
    late_zero = seen[0]["late_zero"]
    assert late_zero["error"] == "ConsensusError" and late_zero["seconds"] < 2 * CONSENSUS_TIMEOUT_S + SLACK_S  # slept
    assert "rank(s) [0] did not reach" in seen[1]["late_zero"]["message"]
    assert "rank 1 gave up waiting before this rank arrived" in seen[0]["late_zero"]["message"]
    assert seen[1]["dead"]["error"] == "ConsensusError" and seen[1]["dead"]["seconds"] < CONSENSUS_TIMEOUT_S + SLACK_S
