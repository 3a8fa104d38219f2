"""Bools among a batch's lengths and token ids outside the vocabulary: refused naming the request, nothing changes."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from step_harness import Harness

from graphkv import SpecError
from graphkv.runtime import Batch

VOCAB = 97  # TinyHybridConfig().vocab_size


def _live(**kw) -> Harness:
    """Requests a (20 tokens) and b (5 tokens), prefilled and decoded once (the next decode repeats that step)."""
    h = Harness("MAMA", **kw)
    h.add("a", 20)
    h.add("b", 5)
    h.run({"a": 20, "b": 5})
    h.decode_all()
    return h


def _refused(h: Harness, batch: Batch, match: str, ids, **run) -> None:
    """``batch`` with ``ids`` raises SpecError matching ``match``; the state is unchanged; a valid decode still
    equals the dense reference."""
    before = h.snapshot()
    with pytest.raises(SpecError, match=match):
        h.step.run(h.model, batch, input_ids=ids, **run)
    h.assert_unchanged(before)
    h.check_accounting()
    h.decode_all()


def _decode(h: Harness, **overrides) -> Batch:
    """The next decode step of a and b (it repeats the last step), with ``overrides`` of its fields."""
    fields = dict(req_ids=("a", "b"), query_lens=(1, 1), seq_lens=(h.computed["a"] + 1, h.computed["b"] + 1))
    return Batch(**{**fields, **overrides})


def test_a_bool_query_length_in_a_repeated_step_is_refused():
    """(True, 1) equals the last step's (1, 1), but the repeat path hands it to the full check, which refuses it."""
    h = _live()
    _refused(h, _decode(h, query_lens=(True, 1)),
             r"batch.query_lens\[0\] \('a'\)=True: query lengths must be integers \(not bool, float, str or None\); "
             r"pass query lengths as Python or numpy ints, e.g. 1", ids=[1, 2])


def test_bool_lengths_of_a_joining_request_are_refused():
    """A request joining with query_len=True, seq_len=True (one token) is refused on the full path."""
    h = _live()
    h.add("x", 1)
    batch = Batch(req_ids=("x",), query_lens=(True,), seq_lens=(True,), new_pages=(h.group_pages([30], [31]),))
    _refused(h, batch, r"batch.query_lens\[0\] \('x'\)=True: query lengths must be integers", ids=[3])
    batch = Batch(req_ids=("x",), query_lens=(1,), seq_lens=(True,), new_pages=(h.group_pages([30], [31]),))
    _refused(h, batch, r"batch.seq_lens\[0\] \('x'\)=True: sequence lengths must be integers", ids=[3])


def test_a_bool_sequence_length_in_a_repeated_step_of_many_tokens_is_refused():
    """Nine one-token requests repeat their step (the numpy path, above 8 tokens): a seq_len True is refused."""
    h = Harness("MAMA", num_blocks=40, max_num_seqs=9, budget=64)
    names = [f"r{i}" for i in range(9)]
    for name in names:
        h.add(name, 1)
    h.run({name: 1 for name in names})
    batch = Batch(req_ids=tuple(names), query_lens=(1,) * 9, seq_lens=(True,) + (1,) * 8)
    before = h.snapshot()
    with pytest.raises(SpecError, match=r"batch.seq_lens\[0\] \('r0'\)=True: sequence lengths must be integers"):
        h.step.run(h.model, batch, input_ids=[1] * 9)
    h.assert_unchanged(before)


def test_a_bool_token_id_in_a_list_is_refused():
    """[True, 2]: struct would pack True as token 1; refused like a bool page id."""
    h = _live()
    _refused(h, _decode(h), r"input_ids=True: token ids must be integers \(not bool, float, str or None\)",
             ids=[True, 2])


@pytest.mark.parametrize("bad, text", [(-1, "-1 would read another token's embedding"),
                                       (VOCAB, f"{VOCAB} is past the embedding table")])
@pytest.mark.parametrize("kind", ["list", "numpy", "tensor"])
def test_token_ids_outside_the_vocabulary_are_refused_naming_request_and_position(bad, text, kind):
    """With vocab_size, input_ids[1] (request b at position 6) of -1 or 97 is refused, whatever holds the ids."""
    h = _live()
    ids = {"list": [5, bad], "numpy": np.array([5, bad]), "tensor": torch.tensor([5, bad])}[kind]
    position = h.computed["b"]
    _refused(h, _decode(h), rf"input_ids\[1\] \(batch row 1, request 'b', position {position}\)={bad}: token ids "
                            rf"must be in \[0, vocab_size={VOCAB}\); {text}; pass token ids of this model's vocabulary",
             ids=ids, vocab_size=VOCAB)


def test_token_ids_of_a_prefill_name_their_position_in_the_prompt():
    """A joining request's third prompt token 500 is input_ids[2], position 2 of request 'x'."""
    h = _live()
    h.add("x", 4, prompt=[1, 2, 500, 4])
    batch, ids, _ = h.batch({"x": 4})
    _refused(h, batch, r"input_ids\[2\] \(batch row 0, request 'x', position 2\)=500", ids=ids, vocab_size=VOCAB)


def test_token_ids_in_the_vocabulary_run():
    """The vocabulary check passes ids 0 and vocab_size - 1, and the step runs."""
    h = _live()
    logits = h.step.run(h.model, _decode(h), input_ids=[0, VOCAB - 1], vocab_size=VOCAB)
    assert logits.shape == (2, VOCAB)


@pytest.mark.parametrize("query_lens", [(np.True_, 1), (torch.tensor(True), 1), torch.tensor([True, True]),
                                        np.array([True, True])], ids=["numpy-bool", "0-d-tensor", "bool-tensor",
                                                                      "bool-array"])
def test_bools_of_every_kind_as_query_lengths_of_a_repeated_step_are_refused(query_lens):
    """A numpy bool, a 0-d bool tensor, a bool tensor or a bool array equals the last step's (1, 1); the repeat path
    hands it to the full check, which refuses it, and nothing changes."""
    h = _live()
    _refused(h, _decode(h, query_lens=query_lens), r"batch.query_lens.*query lengths must be integers \(not bool",
             ids=[1, 2])


@pytest.mark.parametrize("query_lens", [torch.tensor([True]), (torch.tensor(True),), (np.True_,)],
                         ids=["bool-tensor", "0-d-tensor", "numpy-bool"])
def test_bools_of_every_kind_as_query_lengths_of_a_joining_request_are_refused(query_lens):
    """A joining request's query length as a bool tensor or numpy bool is refused on the full path (struct would
    pack a 0-d bool tensor as 1)."""
    h = _live()
    h.add("x", 1)
    batch = Batch(req_ids=("x",), query_lens=query_lens, seq_lens=(1,), new_pages=(h.group_pages([30], [31]),))
    _refused(h, batch, r"batch.query_lens.*query lengths must be integers \(not bool", ids=[3])


def test_a_repeated_step_with_numpy_int_query_lengths_runs():
    """numpy ints equal to the last step's lengths repeat it (compared by value), and the logits are the dense ones."""
    h = _live()
    batch = _decode(h, query_lens=(np.int64(1), np.int32(1)))
    logits = h.step.run(h.model, batch, input_ids=[1, 2])
    assert logits.shape == (2, VOCAB) and h.step._repeat is not None


@pytest.mark.parametrize("ids", [{5: 0, 6: 1}, {5, 6}, frozenset({5, 6}), {5: 0, 6: 1}.keys()],
                         ids=["dict", "set", "frozenset", "keys"])
def test_unordered_token_ids_are_refused(ids):
    """A dict or a set as input_ids (its order silently taken as the token order) is refused naming input_ids."""
    h = _live()
    _refused(h, _decode(h), r"^input_ids='\w+': is unordered \(\w+\), so its order is no order of token ids; pass "
                            r"token ids as a list or tuple, in order$", ids=ids)


@pytest.mark.parametrize("ids", [[np.True_, 2], [torch.tensor(True), 2]], ids=["numpy-bool", "0-d-tensor"])
def test_bool_token_ids_of_every_kind_are_refused(ids):
    """A numpy bool or a 0-d bool tensor among a list's token ids is refused like a Python bool."""
    h = _live()
    _refused(h, _decode(h), r"^input_ids=.*True.*: token ids must be integers \(not bool", ids=ids)


@pytest.mark.parametrize("vocab", ["97", 0, -1, 1.5, True], ids=["str", "zero", "negative", "float", "bool"])
def test_a_vocab_size_that_is_not_a_count_is_refused(vocab):
    """vocab_size "97" raised a TypeError from the comparison; 0, -1, 1.5 and True checked nothing sensible."""
    h = _live()
    _refused(h, _decode(h), r"^vocab_size=.*: must be an integer >= 1.*pass the model's vocabulary size",
             ids=[1, 2], vocab_size=vocab)


def test_the_forward_s_vocab_size_checks_ids_when_none_is_given():
    """Without vocab_size, the forward's own (the paged model's 97 rows) refuses an id past the table."""
    h = _live()
    assert h.model.vocab_size == VOCAB
    _refused(h, _decode(h), rf"^input_ids\[1\] \(batch row 1, request 'b', position \d+\)={VOCAB}: token ids must be "
                            rf"in \[0, vocab_size={VOCAB}\)", ids=[5, VOCAB])


def test_plain_ints_tells_a_bool_from_one():
    """The one-pass check the repeat path relies on: plain ints within int32 pass; a bool, a numpy int, a larger int
    or a float anywhere does not, and has_bool then finds the bools of every kind."""
    from graphkv.runtime.tables.page_ids import has_bool, plain_ints

    assert plain_ints((1,) * 300) and plain_ints([105, -5, 2**31 - 1]) and plain_ints(())
    for values in ((1, True), (True,), (1, np.int64(1)), (1, 2**31), (1, 1.0), (1, torch.tensor(1))):
        assert not plain_ints(values)
    assert has_bool((1, True)) and has_bool((np.False_, 1)) and has_bool((1, torch.tensor(True)))
    assert not has_bool((1, np.int64(1), 2**40))


@pytest.mark.parametrize("ids, vocab, bad", [
    (torch.tensor([1, 2, -3], dtype=torch.int8), None, "input_ids[2]=-3"),  # the 2**63 bound wrapped in int8
    (torch.tensor([5, 32767, -3], dtype=torch.int16), 40000, "input_ids[2]=-3"),  # 40000 wrapped in int16
    (torch.tensor([5, 97, 3], dtype=torch.int16), 97, "input_ids[1]=97"),
    (torch.tensor([3, -1]), None, "input_ids[1]=-1"),  # 2**63 does not fit int64 either
])
def test_narrow_integer_token_ids_name_the_id_that_is_out_of_range(ids, vocab, bad):
    """int8 / int16 tensors compared with a bound they cannot hold wrapped it and named the wrong token (index 0),
    and so did int64 without a vocabulary (bound 2**63); the comparison is made in int64, against the vocabulary
    only when there is one."""
    from graphkv.runtime.vocab import check_token_ids

    with pytest.raises(SpecError, match=re.escape(bad) + ": token ids"):
        check_token_ids(ids, vocab, lambda i: f"input_ids[{i}]")


def test_numpy_arrays_as_a_requests_new_pages_are_read_as_page_ids():
    """new_pages=(np.array([[1, 2]]),) (one request, one group, two pages) raised "truth value of an array is
    ambiguous"; it gives the same entries as the nested tuple, and an array entry beside None works too."""
    from graphkv.runtime.tables.page_ids import flatten_new_pages

    for given in [(np.array([[1, 2]]),), np.array([[[1, 2]]]), (None, np.array([[1, 2]]))]:
        req_ids = ("a",) * len(given)
        entries = flatten_new_pages(given, 1, req_ids)
        expected = flatten_new_pages(tuple(None if p is None else ((1, 2),) for p in given), 1, req_ids)
        assert entries.ids.tolist() == expected.ids.tolist() == [1, 2]
        assert entries.count.tolist() == expected.count.tolist()
        assert entries.request_of_segment().tolist() == expected.request_of_segment().tolist()


@pytest.mark.parametrize("pages, text", [
    ({30, 45}, r"='set': is unordered \(set\), so its order is no order of page ids"),
    ({30: 0, 45: 1}, r"='dict': is unordered \(dict\), so its order is no order of page ids"),
    (b"\x1e\x2d", r"=b'\\x1e-': must be a sequence of page ids"),
    ("30", r"='30': must be a sequence of page ids"),
], ids=["set", "dict", "bytes", "str"])
def test_a_page_list_that_is_no_sequence_of_ids_is_refused_naming_the_request_and_group(pages, text):
    """A set as one group's page list was accepted in its own order ({6, 17} became table row [17 6]), a dict as its
    keys and bytes as their byte values; each is refused naming the request and the group, nothing changed."""
    from graphkv.runtime.tables.page_ids import flatten_new_pages

    h = _live()
    h.add("x", 20)
    new = list(h.group_pages([30, 31], [32]))
    g = h.attention[0]
    new[g] = pages
    batch = Batch(req_ids=("x",), query_lens=(20,), seq_lens=(20,), new_pages=(tuple(new),))
    _refused(h, batch, rf"^batch.new_pages\[0\]\[{g}\] \('x'\){text}", ids=[1] * 20)
    # an ordered iterable of another type (a generator, a range) is read in its order
    entries = flatten_new_pages((((p for p in (6, 17)),), (range(3, 5),)), 1, ("a", "b"))
    assert entries.ids.tolist() == [6, 17, 3, 4] and entries.count.tolist() == [2, 2]


@pytest.mark.parametrize("forward", [None, "model"], ids=["None", "str"])
def test_a_forward_that_cannot_be_called_is_refused_before_the_step_changes(forward):
    """Step.run(None, ...) prepared the step, then failed with a raw TypeError ("not callable"); it is a SpecError
    naming the argument now, raised before anything changes."""
    h = _live()
    before = h.snapshot()
    with pytest.raises(SpecError, match=r"^forward='(NoneType|str)': must be a graphkv CapturedForward or a callable "
                                        r"taking input_ids"):
        h.step.run(forward, _decode(h), input_ids=[1, 2])
    h.assert_unchanged(before)
    with pytest.raises(SpecError, match=r"^key='NoneType': must be a GraphKey of the plan"):
        with h.step.capture_context(None):
            pass
    h.decode_all()


def test_lengths_given_as_objects_with_an_index_are_read_as_ints():
    """Lengths whose __index__ gives an int (struct converts them) but that do not compare with ints raised a raw
    TypeError in the small-batch check; they are checked through their int values."""

    class Index:
        def __init__(self, value: int) -> None:
            self.value = value

        def __index__(self) -> int:
            return self.value

    h = _live()
    before = h.snapshot(inputs=False)
    batch = _decode(h, query_lens=(Index(1), Index(1)), seq_lens=tuple(Index(h.computed[r] + 1) for r in "ab"))
    shape = h.step.prepare(batch)
    assert (shape.num_tokens, shape.num_reqs) == (2, 2)
    h.step.undo(forward_ran=False)  # a prepare taken back before any forward ran: the states are as they were
    h.assert_unchanged(before)
    h.decode_all()


_UNORDERED = {"set": lambda v: set(v), "frozenset": lambda v: frozenset(v), "dict": lambda v: dict.fromkeys(v),
              "keys": lambda v: dict.fromkeys(v).keys(), "values": lambda v: {i: x for i, x in enumerate(v)}.values(),
              "items": lambda v: dict.fromkeys(v).items()}


@pytest.mark.parametrize("kind", list(_UNORDERED))
@pytest.mark.parametrize("field", ["req_ids", "query_lens", "seq_lens", "new_pages"])
def test_a_batch_field_given_as_an_unordered_container_is_refused(field, kind):
    """A set, a frozenset, a dict or a view of one as a Batch field is refused naming the field (its hash order
    would pair requests with other requests' lengths and pages)."""
    fields = dict(req_ids=("long", "short"), query_lens=(20, 3), seq_lens=(21, 4), new_pages=(((1, 2),), ((3,),)))
    fields[field] = _UNORDERED[kind](fields[field])
    name = type(fields[field]).__name__
    with pytest.raises(SpecError, match=re.escape(
            f"Batch.{field}='a {name} of 2': must be a sequence in batch-row order (one entry per request); this is "
            "an unordered container: its order is no order of requests; pass a tuple or list, in batch-row order "
            "(req_ids, query_lens, seq_lens and new_pages in the same order)")):
        Batch(**fields)


def test_a_batch_takes_ordered_sequences_in_their_order_and_refuses_a_set():
    """Lists, tuples, arrays, generators and ranges are taken in their order (as tuples); the same ids in a set
    are refused."""
    for make in (list, tuple, np.array, lambda v: (x for x in v), lambda v: range(v[0], v[-1] + 1)):
        batch = Batch(req_ids=make([7, 8]), query_lens=make([3, 4]), seq_lens=make([5, 6]))
        assert (batch.req_ids, batch.query_lens, batch.seq_lens, batch.new_pages) == ((7, 8), (3, 4), (5, 6), ())
    with pytest.raises(SpecError, match=r"^Batch.req_ids='a set of 2': must be a sequence in batch-row order"):
        Batch(req_ids={7, 8}, query_lens=[3, 4], seq_lens=[5, 6])


def test_a_batch_of_ids_in_a_set_no_longer_reaches_the_step():
    """The scheduler that kept its running requests in a set gets a SpecError, and the step is unchanged."""
    h = _live()
    before = h.snapshot()
    with pytest.raises(SpecError, match=r"Batch.req_ids='a set of 2'"):
        h.step.run(h.model, Batch(req_ids={"a", "b"}, query_lens=(1, 1),
                                   seq_lens=(h.computed["a"] + 1, h.computed["b"] + 1)), input_ids=[1, 2])
    h.assert_unchanged(before)
    h.decode_all()


def test_a_request_outgrowing_a_sliding_window_table_is_told_what_can_be_done():
    """A sliding group's table holds the pages a window needs in the worst case (6 here: 96 tokens), and graphkv keeps
    a request's pages to its end: at 97 tokens the refusal no longer says "free pages that left the window" (no call
    does that) or "give the request its new pages" (none fits), but how many tokens the table holds and which
    max_concurrent_batches plans it for whole requests."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from runtime_plans import hybrid_plan

    from graphkv import CapacityError
    from graphkv.runtime import Step

    plan = hybrid_plan(num_blocks=60, max_num_seqs=3, sliding_window=8)
    step = Step(plan)
    step.prepare(Batch(req_ids=("a",), query_lens=(32,), seq_lens=(32,), new_pages=(((1, 2), (3,), (4, 5)),)))
    step.prepare(Batch(req_ids=("a",), query_lens=(32,), seq_lens=(64,), new_pages=(((6, 7), (), (8, 9)),)))
    step.prepare(Batch(req_ids=("a",), query_lens=(32,), seq_lens=(96,), new_pages=(((10, 11), (), (12, 13)),)))
    steps = -(-plan.max_model_len // 32)
    for new_pages, text in ((((14,), (), (15,)),), r"holds 6 pages and cannot take 1 more"), \
                           ((((14,), (), ()),), r"needs 7 page\(s\) for seq_len=97 .* more than its table's 6 pages"):
        with pytest.raises(CapacityError, match=text + r".*graphkv keeps every page of a request to its end \(pages "
                           r"that left the window are not freed\), so this table holds 96 tokens of a request: keep "
                           rf"requests within that, or plan the sliding tables for whole requests with "
                           rf"Limits\(max_concurrent_batches={steps}\)"):
            step.prepare(Batch(req_ids=("a",), query_lens=(1,), seq_lens=(97,), new_pages=new_pages))


def test_a_request_id_that_equals_nothing_is_refused():
    """A NaN id equals nothing, itself included: two NaNs joined as two requests that no later step or finish could
    name again (each lookup of nan missed). Refused when it joins, naming it; nothing changed."""
    h = Harness("AA", num_blocks=12, max_num_seqs=2)
    before = h.snapshot()
    with pytest.raises(SpecError, match=r"^batch.req_ids\[0\]=nan: a request id must equal itself"):
        h.step.prepare(Batch(req_ids=(float("nan"),), query_lens=(3,), seq_lens=(3,),
                             new_pages=(h.group_pages(attention=(1,)),)))
    h.assert_unchanged(before)
    assert h.step.active_requests == ()


def test_request_ids_that_compare_unlike_numbers_join_and_finish():
    """The NaN check looks at floats only: an id whose != is not a bool (a tensor) or raises joins and finishes as
    before (the check raised a raw RuntimeError / TypeError)."""
    class Weird:
        def __ne__(self, other):
            raise TypeError("no comparing")

        def __hash__(self):
            return 7

    h = Harness("AA", num_blocks=12, max_num_seqs=2)
    ids = (torch.tensor([1, 2]), Weird())
    h.step.prepare(Batch(req_ids=ids, query_lens=(3, 2), seq_lens=(3, 2),
                         new_pages=(h.group_pages(attention=(1,)), h.group_pages(attention=(2,)))))
    assert h.step.active_requests == ids
    for r in ids:
        h.step.finish(r)
    assert h.step.active_requests == ()


def test_an_empty_batch_is_refused_asking_for_a_request():
    """A batch of no request is refused naming batch.req_ids; the fix asks for at least one (it said "fewer")."""
    h = _live()
    before = h.snapshot(inputs=False)
    with pytest.raises(SpecError, match=r"batch.req_ids=0: 1..max_num_seqs=4 requests per step; schedule at least "
                                        r"one request"):
        h.step.prepare(Batch(req_ids=(), query_lens=(), seq_lens=()))
    h.assert_unchanged(before)
