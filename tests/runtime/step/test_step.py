"""The Step API: metadata it writes, persistent buffers, padding, errors, the capture dummy."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

import graphkv
from graphkv.errors import CapacityError, SpecError
from graphkv.models.tiny_hybrid import TinyHybridConfig, model_kv
from graphkv.runtime.capture.graphs import capture
from graphkv.runtime.capture.keys import GraphKey
from graphkv.runtime.step.batch import Batch
from graphkv.runtime.step.step import Step


def _plan(pattern="MAMA", **limits):
    kw = dict(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, num_blocks_override=40)
    kw.update(limits)
    return graphkv.compile(model_kv(TinyHybridConfig(pattern=pattern)), graphkv.Limits(**kw), None)


def _groups(plan):
    attn = next(g.index for g in plan.groups if not g.is_ssm)
    ssm = next((g.index for g in plan.groups if g.is_ssm), None)
    return attn, ssm


def _rehearsed(plan, step):
    """A captured forward rehearsed on the CPU: its graph keys decide every step's padding."""
    fwd = capture(plan, static_inputs={"input_ids": step.input_ids})(lambda input_ids: input_ids * 2)
    report = fwd.capture(progress=False, prepare=step.capture_context, rehearse=True)
    assert report.rehearsed and report.keys
    return fwd


def _pages(plan, attn_pages, state_page):
    out = [()] * len(plan.groups)
    attn, ssm = _groups(plan)
    out[attn] = tuple(attn_pages)
    if ssm is not None and state_page is not None:
        out[ssm] = (state_page,)
    return tuple(out)


def test_metadata_of_a_mixed_step():
    """Query starts, lengths, positions, token rows/offsets, state pages and slots of a prefill + continuation step."""
    plan = _plan()
    step = Step(plan)
    attn, ssm = _groups(plan)
    bs = plan.groups[attn].block_size
    # request "b": a 30-token prefill (2 pages of 16), then "a": 20-token prefill and "b": 3 more tokens
    step.prepare(Batch(req_ids=("b",), query_lens=(30,), seq_lens=(30,), new_pages=(_pages(plan, [11, 12], 14),)))
    batch = Batch(req_ids=("a", "b"), query_lens=(20, 3), seq_lens=(20, 33),
                  new_pages=(_pages(plan, [5, 6], 9), _pages(plan, [13], None)))
    prep = step.prepare(batch)
    assert (prep.num_tokens, prep.num_reqs, prep.num_tokens_padded, prep.num_reqs_padded, prep.uniform) == \
        (23, 2, 23, 2, False)
    assert prep.key is None and "plain callable" in prep.eager_reason  # no forward: nothing padded
    assert step.query_start_loc.tolist()[:3] == [0, 20, 23] and set(step.query_start_loc.tolist()[3:]) == {23}
    assert step.seq_lens.tolist() == [20, 33, 0, 0]
    assert step.context_lens.tolist() == [0, 30, 0, 0]
    assert step.row_valid.tolist() == [1, 1, 0, 0]
    assert step.positions[:23].tolist() == list(range(20)) + [30, 31, 32]
    assert step.token_row[:23].tolist() == [0] * 20 + [1] * 3
    assert step.token_offset[:23].tolist() == list(range(20)) + [0, 1, 2]
    assert step.state_indices[ssm].tolist() == [9, 14, 0, 0]
    # whole-page slots: page * block_size + position % block_size
    expect = [[5, 6][p // bs] * bs + p % bs for p in range(20)] + [[11, 12, 13][p // bs] * bs + p % bs
                                                                   for p in (30, 31, 32)]
    assert step.slot_mappings[attn, :23].tolist() == expect
    assert step.slot_mappings[ssm].tolist() == [-1] * 64
    assert step.context.slot_mappings is step.slot_mappings


def test_persistent_buffers_keep_their_addresses_across_steps():
    """Every tensor a forward or a graph reads keeps its data_ptr() through joins, leaves and decode steps."""
    plan = _plan()
    step = Step(plan)
    ctx = step.context
    named = {f.name: getattr(ctx, f.name) for f in attrs.fields(type(ctx)) if isinstance(getattr(ctx, f.name),
                                                                                           torch.Tensor)}
    named["input_ids"] = step.input_ids
    named.update({f"state_indices.{g}": t for g, t in step.state_indices.items()})
    named.update({f"tables.{i}": t for i, t in enumerate(step.tables.tables + step.tables.input_tables)})
    for g, b in step.mask_builders.items():
        named.update({f"mask{g}.{n}": t for n, t in b.named_buffers().items()})
    before = {n: t.data_ptr() for n, t in named.items()}
    step.prepare(Batch(req_ids=("a",), query_lens=(7,), seq_lens=(7,), new_pages=(_pages(plan, [3], 4),)))
    step.prepare(Batch(req_ids=("a", "b"), query_lens=(1, 30), seq_lens=(8, 30),
                       new_pages=(None, _pages(plan, [5, 6], 7))))
    step.finish("a")
    step.prepare(Batch(req_ids=("b",), query_lens=(1,), seq_lens=(31,)))
    assert {n: t.data_ptr() for n, t in named.items()} == before
    assert len(before) > 30


def test_rows_are_reused_after_finish_and_tables_follow_the_request():
    """A finished request's row goes to the next new request; batch rows gather the right persistent rows."""
    plan = _plan()
    attn, _ = _groups(plan)
    bpk = plan.groups[attn].bpk
    step = Step(plan)
    step.prepare(Batch(req_ids=("a", "b"), query_lens=(3, 3), seq_lens=(3, 3),
                       new_pages=(_pages(plan, [3], 4), _pages(plan, [5], 6))))
    assert (step.row_of("a"), step.row_of("b")) == (0, 1)
    step.finish("a")
    step.prepare(Batch(req_ids=("b", "c"), query_lens=(1, 2), seq_lens=(4, 2),
                       new_pages=(None, _pages(plan, [8], 9))))
    assert step.row_of("c") == 0 and step.active_requests == ("b", "c")
    # batch row 0 is "b" (persistent row 1), batch row 1 is "c" (persistent row 0)
    assert step.tables.input_tables[attn][0, :bpk].tolist() == [5 * bpk + k for k in range(bpk)]
    assert step.tables.input_tables[attn][1, :bpk].tolist() == [8 * bpk + k for k in range(bpk)]


def test_empty_page_lists_for_every_request_are_no_new_pages():
    """Every request given an empty page list in every group (no request gains a page) is a step
    like ``(None, None)``: same tables and slots, no error (it raised numpy's ValueError)."""
    plan = _plan()
    attn, _ = _groups(plan)
    prefill = Batch(req_ids=("a", "b"), query_lens=(3, 3), seq_lens=(3, 3),
                    new_pages=(_pages(plan, [3], 4), _pages(plan, [5], 6)))
    empty = tuple(() for _ in plan.groups)
    seen = []
    for new_pages in ((None, None), (empty, empty)):
        step = Step(plan)
        step.prepare(prefill)
        step.prepare(Batch(req_ids=("a", "b"), query_lens=(1, 1), seq_lens=(4, 4), new_pages=new_pages))
        seen.append((step.slot_mappings[attn, :2].tolist(), step.tables.input_tables[attn][:2].tolist()))
    bs = plan.groups[attn].block_size
    assert seen[0] == seen[1] and seen[0][0] == [3 * bs + 3, 5 * bs + 3]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_uniform_decode_keys_and_padding_for_every_batch_size(n):
    """Decode batches of 1..max_num_seqs get the smallest decode key; padding tokens get row -1;
    masks are built for the padded size."""
    plan = _plan()
    step = Step(plan)
    step.prepare(Batch(req_ids=tuple(range(n)), query_lens=(5,) * n, seq_lens=(5,) * n,
                       new_pages=tuple(_pages(plan, [1 + 2 * i], 2 + 2 * i) for i in range(n))))
    sizes = plan.cudagraph.capture_sizes.decode
    padded = min(s for s in sizes if s >= n)
    prep = step.prepare(Batch(req_ids=tuple(range(n)), query_lens=(1,) * n, seq_lens=(6,) * n),
                        forward=_rehearsed(plan, step))
    assert prep.uniform and prep.key == GraphKey(num_tokens=padded, num_reqs=padded, uniform=True)
    assert (prep.num_tokens, prep.num_reqs, prep.num_tokens_padded, prep.num_reqs_padded) == (n, n, padded, padded)
    assert step.tables.input_tables[0][n:padded].abs().sum() == 0  # padded rows: the null page
    assert step.token_row[:padded].tolist() == list(range(n)) + [-1] * (padded - n)
    assert step.positions[:n].tolist() == [5] * n
    for g, mask in step.context.build_masks(padded).items():
        assert mask.shape[-2] == padded  # built for the graph's token count


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="checks a CPU machine's fallback (no graphs, 'torch.cuda.is_available() is False'); with "
                           "a GPU, tests/models/test_paged_tiny_hybrid_gpu.py captures and replays a Step's forward")
def test_cpu_captured_forward_runs_the_step_eagerly_and_says_why():
    """On CPU the captured forward runs the step eagerly on exactly num_tokens and the report says why."""
    plan = _plan("AAA")
    step = Step(plan)
    calls = []

    def forward(input_ids):
        calls.append(input_ids.shape[0])
        return input_ids * 2

    fwd = capture(plan, static_inputs={"input_ids": step.input_ids})(forward)
    report = fwd.capture(progress=False, prepare=step.capture_context)
    assert "torch.cuda.is_available() is False" in str(report)
    pages = tuple((1,) for _ in plan.groups)
    out = step.run(fwd, Batch(req_ids=("a",), query_lens=(3,), seq_lens=(3,), new_pages=(pages,)),
                   input_ids=[4, 5, 6])
    assert out.tolist() == [8, 10, 12] and calls == [3]


def test_a_prefill_on_a_mixed_key_pads_tokens_and_requests_each_in_its_own_unit():
    """A 5-request prefill on a mixed key pads its tokens to the key and its requests to max_num_seqs,
    never to the token count (the sync refuses a token count passed as a request count)."""
    plan = _plan("AAA", max_num_seqs=8, max_num_batched_tokens=256, cudagraph_mode=graphkv.CudaGraphMode.FULL,
                 max_cudagraph_capture_size=256)  # mixed steps captured up to 256 tokens, not vLLM's 16
    assert plan.cudagraph.mode is graphkv.CudaGraphMode.FULL  # mixed steps replay FULL graphs
    step = Step(plan)
    fwd = _rehearsed(plan, step)
    n = 5
    batch = Batch(req_ids=tuple(range(n)), query_lens=(7,) * n, seq_lens=(7,) * n,
                  new_pages=tuple(tuple((1 + i,) for _ in plan.groups) for i in range(n)))
    shape = step.prepare(batch, forward=fwd)
    key = min(k for k in plan.cudagraph.capture_sizes.mixed if k >= 35)
    assert (shape.num_tokens, shape.num_tokens_padded, shape.num_reqs, shape.num_reqs_padded) == (35, key, 5, 8)
    assert shape.key == GraphKey(num_tokens=key, num_reqs=None, uniform=False)
    with pytest.raises(SpecError, match=f"num_reqs_padded={key}"):
        step.tables.sync(np.arange(n), key)  # the GPU bug: a padded token count handed to the table sync


def test_bad_batches_raise_and_change_nothing():
    """Each inconsistent batch raises a GraphkvError naming the problem and leaves no row or page behind."""
    plan = _plan()
    step = Step(plan)
    ok = Batch(req_ids=("a",), query_lens=(3,), seq_lens=(3,), new_pages=(_pages(plan, [3], 4),))
    step.prepare(ok)
    cases = [
        (Batch(req_ids=("x", "x"), query_lens=(1, 1), seq_lens=(1, 1)), SpecError, "unique"),
        (Batch(req_ids=("x",), query_lens=(4,), seq_lens=(3,)), SpecError, "query_len <= seq_len"),
        (Batch(req_ids=("x",), query_lens=(1,), seq_lens=(129,)), SpecError, "max_model_len=128"),
        (Batch(req_ids=("x",), query_lens=(0,), seq_lens=(1,)), SpecError, "1 <= query_len"),
        (Batch(req_ids=("x",), query_lens=(65,), seq_lens=(65,)), SpecError, "max_num_batched_tokens=64"),
        (Batch(req_ids=tuple("vwxyz"), query_lens=(1,) * 5, seq_lens=(1,) * 5), SpecError, "max_num_seqs=4"),
        (Batch(req_ids=("x", "y"), query_lens=(1,), seq_lens=(1, 1)), SpecError, "one entry per request"),
        (Batch(req_ids=("x",), query_lens=(1,), seq_lens=(1,), new_pages=(_pages(plan, [99], 4),)), SpecError,
         "page ids must be in 1..num_blocks - 1 = 39"),
        (Batch(req_ids=("x",), query_lens=(1,), seq_lens=(1,), new_pages=(_pages(plan, range(10, 19), 20),)),
         CapacityError, "pages per request"),
    ]
    for batch, error, text in cases:
        with pytest.raises(error, match=text):
            step.prepare(batch)
        assert step.active_requests == ("a",)  # a failed join leaves no row behind
    with pytest.raises(SpecError, match="not an active request"):
        step.finish("zzz")


def test_a_batch_refused_for_its_second_request_changes_nothing_for_the_first():
    """A batch whose second request's pages are refused leaves the first request's table as it was."""
    plan = _plan()
    attn, _ = _groups(plan)
    step = Step(plan)
    step.prepare(Batch(req_ids=("a",), query_lens=(3,), seq_lens=(3,), new_pages=(_pages(plan, [3], 4),)))
    held, host = step.tables.num_pages_np.copy(), [t.copy() for t in step.tables.pages_np]
    device = [t.clone() for t in step.tables.tables]
    more_a = tuple((5,) if g == attn else () for g in range(len(plan.groups)))  # "a" gets a 2nd attention page
    for pages_x, error in ((_pages(plan, [99], 6), SpecError), (_pages(plan, range(10, 19), 6), CapacityError)):
        bad = Batch(req_ids=("a", "x"), query_lens=(1, 1), seq_lens=(4, 1), new_pages=(more_a, pages_x))
        with pytest.raises(error):
            step.prepare(bad)
        assert step.active_requests == ("a",) and np.array_equal(step.tables.num_pages_np, held)
        assert all(np.array_equal(a, b) for a, b in zip(host, step.tables.pages_np))
    step.prepare(Batch(req_ids=("a",), query_lens=(1,), seq_lens=(4,)))  # commits whatever was left staged
    assert all(torch.equal(a, b) for a, b in zip(device, step.tables.tables))


def test_run_checks_input_ids_before_changing_anything():
    """input_ids of the wrong length raise SpecError before a row is taken or a page appended."""
    plan = _plan()
    step = Step(plan)
    batch = Batch(req_ids=("a",), query_lens=(2,), seq_lens=(2,), new_pages=(_pages(plan, [3], 4),))
    for ids in ([1, 2, 3], torch.tensor([1, 2, 3])):
        with pytest.raises(SpecError, match=r"input_ids=\(3,\): must be \[2\]"):
            step.run(lambda input_ids: input_ids, batch, input_ids=ids)
        assert step.active_requests == () and not step.tables.num_pages_np.any()
    assert step.run(lambda input_ids: input_ids + 1, batch, input_ids=[1, 2]).tolist() == [2, 3]

def test_capture_dummy_writes_nothing_and_keeps_live_rows():
    """Capture's dummy steps write no slot, read only the null page and leave live requests' tables untouched."""
    plan = _plan()
    attn, _ = _groups(plan)
    step = Step(plan)
    step.prepare(Batch(req_ids=("a",), query_lens=(3,), seq_lens=(3,), new_pages=(_pages(plan, [3], 4),)))
    live = step.tables.tables[attn].clone()
    bpk = plan.groups[attn].bpk
    for key in (GraphKey(num_tokens=4, num_reqs=4, uniform=True), GraphKey(num_tokens=24, num_reqs=None,
                                                                              uniform=False)):
        with step.capture_context(key) as ctx:
            assert (ctx.slot_mappings[:, :key.num_tokens] == -1).all()  # no token writes anything
            assert int(ctx.row_valid.sum()) == (key.num_reqs or 4)
            assert all((t[:key.num_reqs or 4] == 0).all() for t in ctx.block_tables)  # every row: the null page
            assert all((s[:key.num_reqs or 4] == 0).all() for s in ctx.state_indices.values())
        assert torch.equal(step.tables.tables[attn], live)
    assert np.array_equal(step.tables.num_pages_np[attn][:1], [1])
    step.prepare(Batch(req_ids=("a",), query_lens=(1,), seq_lens=(4,)))  # serving resumes: a's rows are back
    assert step.tables.input_tables[attn][0, 0] == 3 * bpk


def test_missing_pages_and_bad_padding_are_refused_before_anything_changes():
    """A request without its state page or without enough attention pages for its length, a
    wrong group count, or a padded size outside [num_tokens, max_num_batched_tokens] is refused."""
    plan = _plan()
    attn, ssm = _groups(plan)
    bs = plan.groups[attn].block_size
    step = Step(plan)
    no_state = [()] * len(plan.groups)
    no_state[attn] = (3,)
    cases = [
        (Batch(req_ids=("x",), query_lens=(3,), seq_lens=(3,), new_pages=(tuple(no_state),)), CapacityError,
         "its state page"),
        (Batch(req_ids=("x",), query_lens=(bs + 1,), seq_lens=(bs + 1,), new_pages=(_pages(plan, [3], 4),)),
         CapacityError, f"needs 2 page\\(s\\) for seq_len={bs + 1}"),
        (Batch(req_ids=("x",), query_lens=(1,), seq_lens=(1,), new_pages=(((3,),),)), SpecError,
         "one page-ID list per KV-cache group"),
    ]
    for batch, error, text in cases:
        with pytest.raises(error, match=text):
            step.prepare(batch)
        assert step.active_requests == () and int(step.tables.num_pages_np.sum()) == 0
    ok = Batch(req_ids=("x",), query_lens=(3,), seq_lens=(3,), new_pages=(_pages(plan, [3], 4),))
    with pytest.raises(SpecError, match="forward"):
        step.prepare(ok, forward=lambda input_ids: input_ids)  # not a captured forward: it cannot decide padding
    assert step.active_requests == ()
