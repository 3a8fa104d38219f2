"""Page ownership: every refusal names request, group and page, changes nothing, and live requests stay correct."""

from __future__ import annotations

import pytest
import torch
from step_harness import Harness

from graphkv import CapacityError, GraphkvError, SpecError
from graphkv.runtime import Batch
from graphkv.runtime.step.ownership import STATE_FILLED_AT
from graphkv.runtime.tables import block_tables


def _live(pattern: str = "MAMA", **kw) -> Harness:
    """Requests a (20 tokens: attention pages 1, 2 and a state page) and b (5 tokens), prefilled and decoded once."""
    h = Harness(pattern, **kw)
    h.add("a", 20)
    h.add("b", 5)
    h.run({"a": 20, "b": 5})
    h.decode_all()
    return h


def _refused(h: Harness, batch: Batch, error: type, match: str, ids: list[int] | None = None) -> None:
    """``batch`` raises ``error`` matching ``match``; the state is unchanged; a valid decode still equals dense."""
    before = h.snapshot()
    with pytest.raises(error, match=match):
        h.step.run(h.model, batch, input_ids=ids if ids is not None else [1] * sum(batch.query_lens))
    h.assert_unchanged(before)
    h.check_accounting()
    h.decode_all()


def test_a_running_request_may_not_receive_a_page_another_request_holds():
    """b continuing into a's attention page is refused (it would write into it), naming request, group and page."""
    h = _live()
    page = h.pages["a"][h.attention[0]][1]
    seq = h.computed["b"] + 1
    batch = Batch(req_ids=("b",), query_lens=(1,), seq_lens=(seq,), new_pages=(h.group_pages([page]),))
    _refused(h, batch, SpecError, rf"request 'b', group {h.attention[0]}, page {page}: 1 live request\(s\) hold it")


def test_a_token_written_into_a_shared_page_is_refused():
    """A new request claiming a's partly filled page as context would write its next token into it: refused."""
    h = _live("AA")
    a_pages = h.pages["a"][0]  # 21 tokens: page 1 full, page 2 holds 5
    h.add("c", 0, prompt=h.tokens["a"][:21] + [5, 6])
    batch = Batch(req_ids=("c",), query_lens=(2,), seq_lens=(23,), new_pages=((tuple(a_pages),),))
    _refused(h, batch, SpecError, rf"batch\[0\] \('c'\)='page {a_pages[1]}': a token of this step would be written "
                                  rf"into page {a_pages[1]} of group 0, which 2 live requests hold")


def test_page_zero_and_out_of_pool_pages_are_refused():
    """Page 0 (the null page) and ids outside the pool are never handed out."""
    h = _live()
    for page, text in ((0, "page 0 is the null page"), (h.plan.num_blocks, "page ids must be in 1..num_blocks - 1 = 39"),
                       (-3, "page ids must be in 1..num_blocks - 1 = 39")):
        h.add("x", 3)
        batch = Batch(req_ids=("x",), query_lens=(3,), seq_lens=(3,), new_pages=(h.group_pages([page], [30]),))
        _refused(h, batch, SpecError, rf"request 'x', group \d, page {page}: {text}")


def test_a_state_page_held_twice_is_refused():
    """A new request given a's state page is refused: a state page has one holder."""
    h = _live()
    state = h.pages["a"][h.state[0]][0]
    h.add("x", 3)
    batch = Batch(req_ids=("x",), query_lens=(3,), seq_lens=(3,), new_pages=(h.group_pages([30], [state]),))
    _refused(h, batch, SpecError, rf"group {h.state[0]}, page {state}: .*a state page has one holder")


def test_the_same_page_in_two_groups_is_refused():
    """A page given in two groups (they share page indices) is refused."""
    h = _live()
    h.add("x", 3)
    batch = Batch(req_ids=("x",), query_lens=(3,), seq_lens=(3,), new_pages=(h.group_pages([30], [30]),))
    _refused(h, batch, SpecError, "page 30: the step also gives it in group")
    state = h.pages["b"][h.state[0]][0]
    batch = Batch(req_ids=("x",), query_lens=(3,), seq_lens=(3,), new_pages=(h.group_pages([state], [31]),))
    _refused(h, batch, SpecError, rf"page {state}: live requests hold it in group {h.state[0]}")


def test_context_beyond_the_written_tokens_is_refused_and_a_rollback_is_allowed():
    """A running request may not skip ahead of its written tokens; rolling back to fewer (rejected drafts) works."""
    h = _live("AA")
    written = h.computed["a"]
    batch = Batch(req_ids=("a",), query_lens=(1,), seq_lens=(written + 5,))
    _refused(h, batch, SpecError, rf"batch\[0\] \('a'\)='seq_len - query_len = {written + 4}': the request has had "
                                  rf"{h.computed['a']} tokens written")
    # Roll back 3 drafts: the context shrinks to 19 tokens and the next 2 tokens are written again.
    h.computed["a"] -= 3
    del h.tokens["a"][h.computed["a"] + 2:]
    h.run({"a": 2})
    h.decode_all()


@pytest.mark.parametrize("decodes", [0, 2])
def test_a_rollback_with_state_layers_is_refused(decodes: int):
    """With Mamba groups the request's one state has absorbed every written token: rolling its context back (accepted
    before: the state applied the rolled-back tokens twice, logits off by 0.04 on qwen3_next) is refused naming the
    request, nothing changed, on the full path and on the repeat path (after decodes); the exact context still runs."""
    h = _live("MAMA")
    for _ in range(decodes):
        h.decode_all()
    written = h.computed["a"]
    batch = Batch(req_ids=tuple(h.step.active_requests), query_lens=(1,) * len(h.step.active_requests),
                  seq_lens=tuple(h.computed[r] + (0 if r == "a" else 1) for r in h.step.active_requests))
    _refused(h, batch, SpecError, rf"\('a'\)='seq_len - query_len = {written - 1}': the request has had {written} "
                                  r"tokens written, and the model's state \(Mamba / gated-delta\) layers keep one state")
    h.decode_all()


def test_cached_context_where_the_plan_cannot_hold_a_prefix_is_refused():
    """mamba_cache_mode none: a joining request claiming cached tokens is refused (its state would be empty)."""
    h = _live("MAMA")
    h.add("x", 20)
    batch = Batch(req_ids=("x",), query_lens=(4,), seq_lens=(20,), new_pages=(h.group_pages([30, 31], [32]),))
    _refused(h, batch, SpecError, r"batch\[0\] \('x'\)='seq_len - query_len = 16 cached tokens': a new request starts "
                                  r"with no cached context: mamba_cache_mode=none")


def test_cached_context_its_pages_do_not_hold_is_refused():
    """A joining request claiming tokens on a page never written (or at another page index) is refused."""
    h = _live("AA")
    h.add("x", 20)
    fresh = Batch(req_ids=("x",), query_lens=(4,), seq_lens=(20,), new_pages=(((30, 31),),))
    _refused(h, fresh, SpecError, "page 30: the request claims 16 cached token\\(s\\) in it at page index 0, but it "
                                  "holds 0 written token\\(s\\)")
    a_pages = h.pages["a"][0]
    swapped = Batch(req_ids=("x",), query_lens=(4,), seq_lens=(20,), new_pages=(((a_pages[1], 31),),))
    _refused(h, swapped, SpecError, rf"page {a_pages[1]}: .* at page index 0, but it holds 6 written token\(s\) at "
                                    "page index 1")


@pytest.mark.parametrize("ids,text", [([True], "page ids must be integers"), ([2.0], "page ids must be integers"),
                                      (["7"], "page ids must be integers"), ([None], "page ids must be integers"),
                                      ([2**70], r"page ids must fit int64 \(-2\*\*63 <= v < 2\*\*63\)")])
def test_page_ids_that_are_not_integers_are_refused(ids, text):
    """Bools, floats, strings, None and huge ints as page ids are SpecErrors naming request and group."""
    h = _live()
    h.add("x", 3)
    pages = [()] * len(h.plan.groups)
    pages[h.attention[0]] = tuple(ids)
    pages[h.state[0]] = (30,)
    batch = Batch(req_ids=("x",), query_lens=(3,), seq_lens=(3,), new_pages=(tuple(pages),))
    _refused(h, batch, SpecError, rf"batch.new_pages\[0\]\[{h.attention[0]}\] \('x'\)=.*{text}")


@pytest.mark.parametrize("query_lens,seq_lens,text", [
    ((1,), (float("nan"),), "sequence lengths must be integers"),
    ((1,), (2**70,), r"sequence lengths must fit int64 \(-2\*\*63 <= v < 2\*\*63\); pass sequence lengths below"),
    ((1.0,), (22,), "query lengths must be integers"),
    (("1",), (22,), "query lengths must be integers"),
    ((1,), (None,), "sequence lengths must be integers"),
])
def test_lengths_that_are_not_integers_are_refused(query_lens, seq_lens, text):
    """NaN, huge, float, str and None lengths are SpecErrors, not raw numpy or torch exceptions."""
    h = _live()
    _refused(h, Batch(req_ids=("a",), query_lens=query_lens, seq_lens=seq_lens), SpecError, text, ids=[1])


def test_unhashable_request_ids_and_wrong_batches_are_refused():
    """An unhashable request id, a non-Batch and non-sequence fields are SpecErrors."""
    h = _live()
    _refused(h, Batch(req_ids=(["a"],), query_lens=(1,), seq_lens=(22,)), SpecError,
             r"batch.req_ids\[0\]=\['a'\]: request ids must be hashable")
    before = h.snapshot()
    with pytest.raises(SpecError, match="must be a graphkv Batch"):
        h.step.prepare({"req_ids": ("a",)})
    with pytest.raises(SpecError, match="Batch.query_lens=5: must be a sequence"):
        Batch(req_ids=("a",), query_lens=5, seq_lens=(22,))
    h.assert_unchanged(before)


@pytest.mark.parametrize("ids,text", [(torch.ones(1), r"input_ids='torch.float32': token ids must be an integer"),
                                      (torch.ones(1, dtype=torch.bool), "token ids must be an integer"),
                                      (torch.ones(1, 1, dtype=torch.int64), r"input_ids=\(1, 1\): must be \[1\]"),
                                      ([1.5], "token ids must be integers"), ([[1]], "token ids must be integers")])
def test_wrong_input_ids_are_refused_before_anything_changes(ids, text):
    """input_ids of a float / bool dtype, another shape or non-integer values raise SpecError; nothing changes."""
    h = _live()
    _refused(h, Batch(req_ids=("a",), query_lens=(1,), seq_lens=(h.computed["a"] + 1,)), SpecError, text, ids=ids)


def test_input_ids_on_another_device_are_refused():
    """input_ids on a device that is neither the CPU nor the step's device raise SpecError."""
    h = _live()
    meta = torch.ones(1, dtype=torch.int64, device="meta")
    _refused(h, Batch(req_ids=("a",), query_lens=(1,), seq_lens=(h.computed["a"] + 1,)), SpecError,
             "input_ids='meta': must be on the CPU or on the step's device cpu", ids=meta)


def test_a_forward_that_raises_leaves_the_step_as_it_was():
    """A forward raising after prepare undoes the step: a new request's row, its pages, a's appended page, written."""
    h = _live()
    h.add("x", 3)
    batch, ids, _ = h.batch({"a": 1, "x": 3})
    assert batch.new_pages  # x gets pages; a may get one
    h.run_failing(batch, ids, "out of memory", recover=False)
    with pytest.raises(SpecError, match="no prepared step to take back"):
        h.step.undo()
    h.check_accounting()
    assert h.step.unsure_requests == ("a",)  # its state may have advanced: prefilled again, then it goes on
    h.prefill_again("a")
    h.decode_all()
    h.run({"x": 3})  # the same step now succeeds
    h.decode_all()


def test_capacity_and_missing_pages_are_refused():
    """More pages than a request can hold, or too few for its length, raise CapacityError naming the request."""
    h = _live()
    h.add("x", 3)
    too_many = Batch(req_ids=("x",), query_lens=(3,), seq_lens=(3,), new_pages=(h.group_pages(range(20, 30), [30]),))
    _refused(h, too_many, CapacityError, r"batch.new_pages\[0\]\[\d\] \('x'\)=10: group \d .* its capacity is 8 pages")
    too_few = Batch(req_ids=("x",), query_lens=(20,), seq_lens=(20,), new_pages=(h.group_pages([30], [31]),))
    _refused(h, too_few, CapacityError, r"needs 2 page\(s\) for seq_len=20")


def test_every_refusal_is_a_graphkv_error():
    """The hierarchy: each refusal above derives from GraphkvError (one except clause catches them all)."""
    assert issubclass(SpecError, GraphkvError) and issubclass(CapacityError, GraphkvError)


@pytest.fixture(params=["python", "numpy"])
def release_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Finished requests released item by item or by the numpy path (FEW_PAGES moved past or below every request's
    page count)."""
    monkeypatch.setattr(block_tables, "FEW_PAGES", 10**6 if request.param == "python" else 0)
    return request.param


def test_a_finished_writer_leaves_its_pages_filled_and_free(release_path: str):
    """a (40 tokens, 16-token pages) and b (5 tokens) finish: their pages lose their one holder and group, keep the
    tokens written in them at their page index (16, 16, 8 for a; 5 for b) for prefix reuse, and have no writer."""
    h = Harness("AA")
    h.add("a", 40)
    h.add("b", 5)
    h.run({"a": 40, "b": 5})
    own = h.step.ownership
    pages_a, pages_b = h.pages["a"][0], h.pages["b"][0]
    assert own.writer_row[pages_a].tolist() == [h.step.row_of("a")] * 3
    h.finish("a")
    assert own.holders[pages_a].tolist() == [0, 0, 0] and own.group_of[pages_a].tolist() == [-1, -1, -1]
    assert own.filled[pages_a].tolist() == [16, 16, 8] and own.filled_at[pages_a].tolist() == [0, 1, 2]
    assert own.writer_row[pages_a].tolist() == [-1, -1, -1]
    h.finish("b")
    assert own.filled[pages_b].tolist() == [5] and own.filled_at[pages_b].tolist() == [0]
    assert own.holders[pages_b].tolist() == [0] and own.written.tolist().count(0) == len(own.written)
    h.check_accounting()


def test_the_shared_page_count_follows_three_holders_a_refused_join_and_leaves(release_path: str):
    """num_shared, kept step by step (never counted over the pool): two requests joining a's two full pages in one
    step make them 3-held (2 shared pages, not 4); a refused join leaves the count as it was; it falls to 0 only when
    a single holder is left."""
    h = Harness("AA")
    h.add("a", 40)
    h.run({"a": 40})
    own, shared, prefix = h.step.ownership, h.pages["a"][0][:2], h.tokens["a"][:32]
    h.add("c", 0, prompt=prefix + [3, 1, 4], cached_pages=[shared], cached_tokens=32)
    h.add("d", 0, prompt=prefix + [2, 7], cached_pages=[shared], cached_tokens=32)
    batch, ids, _ = h.batch({"c": 3, "d": 2})
    h.run_failing(batch, ids)
    assert own.num_shared == 0 and own.holders[shared].tolist() == [1, 1]
    h.run({"c": 3, "d": 2})
    assert own.holders[shared].tolist() == [3, 3] and own.num_shared == 2
    h.check_accounting()
    h.finish("a")
    assert own.holders[shared].tolist() == [2, 2] and own.num_shared == 2
    h.finish("c")
    assert own.holders[shared].tolist() == [1, 1] and own.num_shared == 0
    h.decode_all()
    h.check_accounting()


def test_a_rollback_below_the_cached_tokens_a_request_joined_with_is_refused():
    """c joins with 32 cached tokens of a's pages; rolling c back below them would rewrite pages it did not write
    (accepted before, while the prefix cache still said they held a's tokens: a later claim read c's), so it is
    refused on the full path and the repeat path, nothing changed; rolling back to them is exact."""
    h = Harness("AA")
    h.add("a", 40)
    h.run({"a": 40})
    shared, prefix = h.pages["a"][0][:2], h.tokens["a"][:32]
    h.add("c", 0, prompt=prefix + [3, 1, 4, 1, 5], cached_pages=[shared], cached_tokens=32)
    h.run({"c": 5, "a": 1})
    h.decode_all()
    h.decode_all()  # the repeat path holds c's claim too
    ids = tuple(h.step.active_requests)
    lens = {r: (h.computed[r] + 1) for r in ids}
    lens["c"] = 31 + 1  # context 31: below the 32 cached tokens
    batch = Batch(req_ids=ids, query_lens=(1,) * len(ids), seq_lens=tuple(lens[r] for r in ids))
    _refused(h, batch, SpecError, r"\('c'\)='seq_len - query_len = 31': the request joined with 32 cached tokens, "
                                  r"which it did not write .* set seq_len - query_len to at least 32")
    h.computed["c"] = 32  # back to exactly the cached tokens: c writes its own tokens again
    del h.tokens["c"][34:]
    h.run({"c": 2})
    h.decode_all()
    h.check_accounting()


def test_two_requests_reading_the_same_full_pages_equal_the_dense_reference():
    """Prefix caching: c joins with a's first two full pages as cached context; both decode exactly as dense."""
    h = Harness("AA")
    h.add("a", 40)
    h.run({"a": 40})  # pages 1, 2 full (32 tokens), page 3 holds 8
    shared, prefix = h.pages["a"][0][:2], h.tokens["a"][:32]
    h.add("c", 0, prompt=prefix + [3, 1, 4, 1, 5], cached_pages=[shared], cached_tokens=32)
    h.run({"c": 5, "a": 1})
    own = h.step.ownership
    assert own.holders[shared].tolist() == [2, 2] and own.num_shared == 2
    for _ in range(3):
        h.decode_all()
        h.check_accounting()
    h.finish("a")  # c keeps reading a's pages; they stay held
    assert own.holders[shared].tolist() == [1, 1] and own.num_shared == 0
    h.decode_all()
    h.check_accounting()
    h.finish("c")  # nobody holds them now, but they keep what a wrote: a new request may claim them
    h.add("d", 0, prompt=prefix + [2, 7], cached_pages=[shared], cached_tokens=32)
    h.run({"d": 2})
    h.decode_all()
    h.check_accounting()


def test_a_state_page_claimed_with_exactly_its_tokens_joins_and_equals_the_dense_reference():
    """mamba_cache_mode align: a finishes after 16 tokens, its state page recording the state after 16 tokens; c joins
    claiming them with a's state page and first attention page: accepted, c's logits equal the dense reference (the
    state held exactly a's 16 tokens), c writes the state page from then on, and leaves it after its own 20."""
    h = Harness("MAMA", mamba_cache_mode="align")
    h.add("a", 16)
    h.run({"a": 16})
    pages, prefix = h.pages["a"], h.tokens["a"][:16]
    state_page = pages[h.state[0]][0]
    h.finish("a")
    own = h.step.ownership
    assert own.filled[state_page] == 16 and own.filled_at[state_page] == STATE_FILLED_AT
    cached = [list(p[:1]) for p in pages]
    h.free.sort(key=lambda p: p not in sum(cached, []))  # (the free list hands out other pages first)
    h.add("c", 0, prompt=prefix + [3, 1, 4], cached_pages=cached, cached_tokens=16)
    h.run({"c": 3})
    h.decode_all()
    assert own.writer_row[state_page] == h.step.row_of("c")
    h.finish("c")
    assert own.filled[state_page] == 20 and own.filled_at[state_page] == STATE_FILLED_AT
    h.check_accounting()


def test_a_state_page_not_holding_the_claimed_tokens_state_is_refused():
    """c claims 16 cached tokens with a's state page, which holds the state after a's 20 tokens, or with a state page
    nobody wrote: refused, naming the tokens the page's state absorbed (its layers would start from another state:
    logits off by 0.06 before), nothing changed."""
    h = Harness("MAMA", mamba_cache_mode="align")
    h.add("a", 20)
    h.add("b", 5)
    h.run({"a": 20, "b": 5})
    pages, prefix = h.pages["a"], h.tokens["a"][:16]
    h.finish("a")
    h.free.sort(key=lambda p: p not in sum(pages, []))  # (the free list hands out other pages first)
    for state_page, holds in ((pages[h.state[0]][0], "the state after 20 tokens"),
                              (next(p for p in h.free if h.step.ownership.filled_at[p] == -1),
                               "no finished request's state")):
        cached = [[state_page] if g in h.state else list(pages[g][:1]) for g in range(len(pages))]
        h.add("c", 0, prompt=prefix + [3], cached_pages=cached, cached_tokens=16)
        batch, ids, _ = h.batch({"c": 1})
        _refused(h, batch, SpecError, rf"\('c'\)={state_page}: .* the request claims 16 cached tokens, so its state "
                                      rf"page must hold the state after exactly that many, and it holds {holds}")


def test_a_claim_ending_inside_a_page_a_finished_request_wrote_further_is_refused():
    """a wrote 30 tokens (its second page holds 14) and finished; c claiming 20 of them would write its own tokens over
    a's 20..29 while the page still said it held them (a later claim of a's 30 read c's): refused, nothing changed.
    Claiming a page up to where its writer stopped is exact: d claims e's 21 tokens (5 in e's second page) and writes
    on."""
    h = Harness("AA")
    h.add("a", 30)
    h.add("e", 20)
    h.run({"a": 30, "e": 20})
    pages, prefix = h.pages["a"][0], h.tokens["a"][:20]
    h.finish("a")
    h.free.sort(key=lambda p: p not in pages)  # (the free list hands out other pages first)
    h.add("c", 0, prompt=prefix + [3] * 10, cached_pages=[pages], cached_tokens=20)
    batch, ids, _ = h.batch({"c": 10})
    _refused(h, batch, SpecError, rf"\('c'\)={pages[1]}: .* claims 4 of the 14 cached token\(s\) a finished request "
                                  r"wrote in it, and would write its own tokens from position 20 over the rest .* claim "
                                  r"whole pages \(seq_len - query_len a multiple of block_size 16\)")
    del h.tokens["c"], h.computed["c"], h.pages["c"]
    written = h.computed["e"]  # 21: e decoded once more (in the refusal's check)
    pages_e, prefix_e = h.pages["e"][0], h.tokens["e"][:written]
    h.finish("e")
    h.free.sort(key=lambda p: p not in pages_e)
    h.add("d", 0, prompt=prefix_e + [2, 7, 1, 8, 2], cached_pages=[pages_e], cached_tokens=written)
    h.run({"d": 5})  # checked against the dense reference
    h.decode_all()
    h.check_accounting()


def test_a_page_given_twice_in_one_step_names_both_places():
    """The same page twice in one request's list, or to two requests: the message says where it appears."""
    h = _live("AA")
    page = h.free[-1]
    batch = Batch(req_ids=("x",), query_lens=(17,), seq_lens=(17,), new_pages=(((page, page),),))
    _refused(h, batch, SpecError, rf"the step gives it 2 times \(batch.new_pages\[0\]\[0\]\[0\], "
                                  rf"batch.new_pages\[0\]\[0\]\[1\]\)")
    batch = Batch(req_ids=("x", "y"), query_lens=(1, 1), seq_lens=(1, 1), new_pages=(((page,),), ((page,),)))
    _refused(h, batch, SpecError, r"the step gives it 2 times \(batch.new_pages\[0\]\[0\]\[0\], "
                                  r"batch.new_pages\[1\]\[0\]\[0\]\); .*; give each page once")


@pytest.mark.parametrize("failed", ["join", "decode"])
def test_a_state_page_a_taken_back_forward_ran_on_vouches_for_nothing(failed):
    """A forward that raised after its state layers ran has advanced the state pages in place, which an undo cannot
    take back: the claimed state page of a failed join, or the state page of a running request whose failed decode
    was undone (finished afterwards, as Step.run advises), no longer vouch for a finished request's state (a retry of
    the claim was accepted, logits off by 0.18-0.28)."""
    h = Harness("MAMA", mamba_cache_mode="align")
    h.add("a", 16)
    h.run({"a": 16})
    pages, prefix = h.pages["a"], h.tokens["a"][:16]
    state_page = pages[h.state[0]][0]

    def failing(input_ids):
        h.model(input_ids=input_ids)  # the layers ran (the state updated in place) ...
        raise RuntimeError("failed after the layers ran")  # ... then something failed

    if failed == "decode":
        batch, ids, _ = h.batch({"a": 1})
        with pytest.raises(RuntimeError, match="failed after the layers ran"):
            h.step.run(failing, batch, input_ids=ids)
    h.finish("a")
    own = h.step.ownership
    cached = [list(p[:1]) for p in pages]
    h.free.sort(key=lambda p: p not in sum(cached, []))  # (the free list hands out other pages first)
    h.add("c", 0, prompt=prefix + [3, 1, 4], cached_pages=cached, cached_tokens=16)
    batch, ids, _ = h.batch({"c": 3})
    if failed == "join":
        assert own.filled[state_page] == 16 and own.filled_at[state_page] == STATE_FILLED_AT
        with pytest.raises(RuntimeError, match="failed after the layers ran"):
            h.step.run(failing, batch, input_ids=ids)
    assert own.filled_at[state_page] == -1
    with pytest.raises(SpecError, match=rf"\('c'\)={state_page}: .* and it holds no finished request's state"):
        h.step.prepare(batch)
