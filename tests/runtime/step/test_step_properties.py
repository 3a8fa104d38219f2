"""Property: random schedules with random scheduler mistakes never change a live request's logits."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from step_harness import Harness

from graphkv import GraphkvError
from graphkv.runtime import Batch

MISTAKES = ("null_page", "foreign_page", "state_page_twice", "two_groups", "skip_ahead", "float_page", "bool_page",
            "nan_length", "duplicate_ids", "cached_context", "failing_forward", "too_many_pages")


def _join(pages: tuple, query_len: int = 3, seq_len: int = 3) -> tuple[Batch, list[int]]:
    return Batch(req_ids=("bad",), query_lens=(query_len,), seq_lens=(seq_len,), new_pages=(pages,)), [1] * query_len


def _mistake(h: Harness, kind: str, spare: list[int]) -> tuple[Batch, list[int]] | None:
    """A batch carrying the mistake ``kind`` and its token ids (``None`` when the plan or the live
    requests do not allow that mistake); ``spare``: two free pages."""
    live = list(h.step.active_requests)
    victim, other = live[0], live[-1]
    seq = h.computed[victim]
    if kind == "null_page":
        return _join(h.group_pages([0], spare[:1]))
    if kind == "float_page":
        return _join(h.group_pages([2.0], spare[:1]))
    if kind == "bool_page":
        return _join(h.group_pages([True], spare[:1]))
    if kind == "too_many_pages":
        return _join(h.group_pages([spare[0]] * (h.step.tables.max_pages[h.attention[0]] + 1), spare[1:]))
    if kind == "skip_ahead":
        return Batch(req_ids=(victim,), query_lens=(1,), seq_lens=(seq + 3,)), [1]
    if kind == "nan_length":
        return Batch(req_ids=(victim,), query_lens=(1,), seq_lens=(float("nan"),)), [1]
    if kind == "duplicate_ids":
        return Batch(req_ids=(victim, victim), query_lens=(1, 1), seq_lens=(seq + 1, seq + 1)), [1, 1]
    if kind == "failing_forward":
        return h.batch({r: 1 for r in live})[:2]
    if kind == "foreign_page" and victim != other:
        return Batch(req_ids=(victim,), query_lens=(1,), seq_lens=(seq + 1,),
                     new_pages=(h.group_pages([h.pages[other][h.attention[0]][0]]),)), [1]
    if not h.state:  # the rest need a state (Mamba) group
        return None
    if kind == "two_groups":
        return _join(h.group_pages(spare[:1], spare[:1]))
    if kind == "cached_context":
        return _join(h.group_pages(spare[:1], spare[1:]), query_len=1, seq_len=3)
    if kind == "state_page_twice":
        return _join(h.group_pages(spare[:1], [h.pages[victim][h.state[0]][0]]))
    return None


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), pattern=st.sampled_from(["MAMA", "AA"]))
def test_random_schedules_with_mistakes_keep_live_logits_and_page_accounting(data, pattern):
    """Joins, decodes and finishes in random order, with refused mistakes in between: every valid step's
    logits equal the dense reference, every mistake leaves the state exactly as it was, and held pages
    plus free pages always equal the usable pages."""
    h = Harness(pattern, num_blocks=24, max_num_seqs=3, budget=48, max_model_len=64)
    h.add("r0", data.draw(st.integers(1, 30), label="first prompt"))
    h.run({"r0": len(h.tokens["r0"])})
    joined = 1
    for _ in range(data.draw(st.integers(4, 10), label="steps")):
        action = data.draw(st.sampled_from(["join", "decode", "finish", "mistake", "mistake", "mistake"]), label="action")
        live = list(h.step.active_requests)
        if action == "join" and len(live) < 3 and len(h.free) >= 8:
            req = f"r{joined}"
            joined += 1
            h.add(req, data.draw(st.integers(1, 30), label="prompt"))
            h.run({req: len(h.tokens[req]), **{r: 1 for r in live}})
        elif action == "decode" and live and all(sum(h.pages_needed(r, h.computed[r] + 1)) <= len(h.free) for r in live):
            h.decode_all()
        elif action == "finish" and live:
            h.finish(data.draw(st.sampled_from(live), label="finished"))
        elif action == "mistake" and live and len(h.free) >= 2:
            kind = data.draw(st.sampled_from(MISTAKES), label="mistake")
            made = _mistake(h, kind, h.free[-2:][::-1])
            if made is None:
                continue
            batch, ids = made
            if kind == "failing_forward":
                h.run_failing(batch, ids)
            else:
                before = h.snapshot()
                with pytest.raises(GraphkvError):
                    h.step.run(h.model, batch, input_ids=ids)
                h.assert_unchanged(before)
        h.check_accounting()
    if h.step.active_requests and all(sum(h.pages_needed(r, h.computed[r] + 1)) <= len(h.free)
                                      for r in h.step.active_requests):
        h.decode_all()  # the survivors still decode exactly as the dense reference
