"""Property: every step's shape keeps its units apart, on both table syncs.

Over random batches — decodes and mixed steps of random request counts, landing on every capture
key of the plan — a step prepared for a rehearsed captured forward has ``num_reqs <=
num_reqs_padded <= max_num_seqs`` and ``num_tokens <= num_tokens_padded``, and its padded rows and
tokens read only the null page (table rows of zeros, slot ``PAD_SLOT_ID``, token row -1), with the
host sync (``kernels="torch"``) and the staged sync with its Triton kernels (``kernels="triton"``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphkv
from graphkv.models.tiny_hybrid import TinyHybridConfig, model_kv
from graphkv.runtime import PAD_SLOT_ID, Batch, Step
from graphkv.runtime.capture.graphs import capture
from graphkv.runtime.capture.keys import capture_keys

MAX_SEQS, MAX_TOKENS = 6, 48


def _stepper(kernels: str, mode: graphkv.CudaGraphMode, pattern: str = "AA"):
    plan = graphkv.compile(model_kv(TinyHybridConfig(pattern=pattern)),
                           graphkv.Limits(max_model_len=64, max_num_seqs=MAX_SEQS, max_num_batched_tokens=MAX_TOKENS,
                                          num_blocks_override=64, cudagraph_mode=mode), None)
    step = Step(plan, kernels=kernels)
    fwd = capture(plan, static_inputs={"input_ids": step.input_ids})(lambda input_ids: input_ids)
    fwd.capture(progress=False, prepare=step.capture_context, rehearse=True)
    return plan, step, fwd


def _check(step: Step, shape) -> None:
    assert shape.num_reqs <= shape.num_reqs_padded <= MAX_SEQS
    assert shape.num_tokens <= shape.num_tokens_padded <= MAX_TOKENS
    if shape.key is not None:
        assert shape.num_tokens_padded == shape.key.num_tokens
    n, t = shape.num_reqs, shape.num_tokens
    for g, table in enumerate(step.tables.input_tables):
        assert int(table[n:shape.num_reqs_padded].abs().sum()) == 0, f"group {g}: padded rows must be the null page"
    assert (step.slot_mappings[:, t:shape.num_tokens_padded] == PAD_SLOT_ID).all()
    assert (step.token_row[t:shape.num_tokens_padded] == -1).all()
    assert int(step.row_valid[n:].sum()) == 0


def _pages(plan, first: int) -> tuple:
    """A joining request's pages from id ``first`` on: a state page per state group, two pages per attention group."""
    out, page = [], first
    for g in plan.groups:
        count = 1 if g.is_ssm else 2
        out.append(tuple(range(page, page + count)))
        page += count
    return tuple(out)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
@pytest.mark.parametrize("pattern, mode", [("AA", graphkv.CudaGraphMode.FULL),
                                           ("MAMA", graphkv.CudaGraphMode.FULL_DECODE_ONLY)], ids=["AA-FULL", "MAMA"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_steps_keep_request_and_token_padding_apart_on_both_syncs(kernels, pattern, mode, data) -> None:
    """Random decodes and mixed steps: padded counts stay in their units and padded rows read only the null page."""
    plan, step, fwd = _stepper(kernels, mode, pattern)
    per_request = sum(1 if g.is_ssm else 2 for g in plan.groups)
    seen_keys = set()
    next_page, live = 1, {}
    for _ in range(data.draw(st.integers(1, 5), label="steps")):
        n = data.draw(st.integers(1, MAX_SEQS), label="num_reqs")
        decode = bool(live) and data.draw(st.booleans(), label="decode")
        req_ids, qlens, slens, new = [], [], [], []
        if decode:
            ids = sorted(live)[:n]
            for r in ids:
                live[r] += 1
            req_ids, qlens, slens = ids, [1] * len(ids), [live[r] for r in ids]
            new = [None] * len(ids)
        else:
            for r in list(live):
                step.finish(r)
                del live[r]
            next_page = 1
            budget = MAX_TOKENS
            for i in range(n):
                q = data.draw(st.integers(1, min(16, budget - (n - 1 - i))), label="query_len")
                budget -= q
                req_ids.append(f"r{i}")
                qlens.append(q)
                slens.append(q)
                new.append(_pages(plan, next_page))
                next_page += per_request
                live[f"r{i}"] = q
        shape = step.prepare(Batch(req_ids=tuple(req_ids), query_lens=tuple(qlens), seq_lens=tuple(slens),
                                   new_pages=tuple(new) if any(x is not None for x in new) else ()), forward=fwd)
        _check(step, shape)
        seen_keys.add(shape.key)
    assert seen_keys <= set(capture_keys(plan.cudagraph, plan.limits)) | {None}


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_every_capture_key_pads_within_its_units(kernels) -> None:
    """A step landing on each capture key in turn (largest decode first, then mixed) keeps every invariant."""
    plan, step, fwd = _stepper(kernels, graphkv.CudaGraphMode.FULL)
    groups = len(plan.groups)
    keys = [k for k in capture_keys(plan.cudagraph, plan.limits) if k.uniform or k.num_tokens > 1]
    assert any(not k.uniform for k in keys)  # (a one-token step is always uniform: it lands on a decode key)
    for key in keys:
        for r in step.active_requests:
            step.finish(r)
        if key.uniform:  # key.num_reqs requests decode one token each
            n = key.num_reqs
            new = tuple(tuple((1 + i * groups + j,) for j in range(groups)) for i in range(n))
            step.prepare(Batch(req_ids=tuple(range(n)), query_lens=(2,) * n, seq_lens=(2,) * n, new_pages=new),
                         forward=fwd)
            shape = step.prepare(Batch(req_ids=tuple(range(n)), query_lens=(1,) * n, seq_lens=(3,) * n),
                                 forward=fwd)
        else:  # one request prefilling exactly key.num_tokens tokens
            pages = tuple(tuple(range(1 + j * 8, 1 + j * 8 + 4)) if not plan.groups[j].is_ssm else (40 + j,)
                          for j in range(groups))
            shape = step.prepare(Batch(req_ids=("p",), query_lens=(key.num_tokens,), seq_lens=(key.num_tokens,),
                                       new_pages=(pages,)), forward=fwd)
        assert shape.key == key
        _check(step, shape)
