"""Step.truncate drops a live request's trailing pages from its tables and its page ownership; tables edited behind
the Step's back send the next step to the full path, which refuses what the pages no longer cover."""

from __future__ import annotations

import re
from typing import Hashable

import pytest
from step_harness import TOLERANCE, Harness

from graphkv import CapacityError, SpecError
from graphkv.models.tiny_hybrid import dense_forward
from graphkv.runtime import Batch


def _truncate(h: Harness, req: Hashable, keep: list[int], **kw) -> None:
    """``Step.truncate`` and the harness's books: the dropped pages nobody holds go back to the free list (handed
    out next), and with ``kept_tokens`` the request's written tokens roll back."""
    h.step.truncate(req, keep, **kw)
    holders = h.step.ownership.holders
    for g, n in enumerate(keep):
        dropped = h.pages[req][g][n:]
        del h.pages[req][g][n:]
        h.free.extend(p for p in dropped if holders[p] == 0)
    if "kept_tokens" in kw:
        h.computed[req] = kw["kept_tokens"]


def _drafts(h: Harness, req: Hashable, first: int) -> None:
    """Four draft tokens ``first .. first + 3`` after ``req``'s written tokens (the next query)."""
    h.tokens[req][h.computed[req]:] = list(range(first, first + 4))


def _rejected_drafts() -> Harness:
    """Attention only, 16-token pages: a prefills 16 tokens (page 1); a speculative step of 4 drafts (context 16,
    page 2); every draft rejected, the same 4 positions again with other drafts (a repeated step): a has had 20
    tokens written, in pages 1 and 2."""
    h = Harness("AA")
    h.add("a", 16)
    h.run({"a": 16})
    _drafts(h, "a", 50)
    h.run({"a": 4})
    h.computed["a"] = 16
    _drafts(h, "a", 60)
    h.run({"a": 4})
    assert h.step._repeat is not None  # that step went the repeat path
    assert h.pages["a"] == [[1, 2]] and h.step.ownership.written[h.step.row_of("a")] == 20
    return h


def test_truncate_frees_a_rejected_drafts_page_and_the_next_steps_are_exact():
    """The drafts rejected, truncate(a, [1], kept_tokens=16) drops page 2: free in the ownership (no holder, group,
    writer or cached tokens), the row back to page 1, 16 tokens written; the next speculative steps get page 2
    again and equal the dense reference (a repeated one too); a's finish frees every page."""
    h = _rejected_drafts()
    step, own, row = h.step, h.step.ownership, h.step.row_of("a")
    _truncate(h, "a", [1], kept_tokens=16)
    assert step.tables.pages_np[0][row, :3].tolist() == [1, 0, 0] and step.tables.num_pages_np[0, row] == 1
    assert (own.holders[2], own.group_of[2], own.writer_row[2], own.filled[2], own.filled_at[2]) == (0, -1, -1, 0, -1)
    assert (own.holders[1], own.writer_row[1], own.written[row]) == (1, row, 16)
    assert step.shape is None  # the last step is forgotten: the next one takes the full path
    with pytest.raises(SpecError, match="no prepared step to take back"):
        step.undo()
    h.check_accounting()
    _drafts(h, "a", 70)
    h.run({"a": 4})  # needs a second page again: the free list hands out page 2
    assert h.pages["a"] == [[1, 2]] and step.slot_mappings[0, :4].tolist() == [32, 33, 34, 35]
    h.computed["a"] = 16
    _drafts(h, "a", 80)
    h.run({"a": 4})
    assert step._repeat is not None
    for _ in range(3):
        h.decode_all()
    h.check_accounting()
    h.finish("a")
    assert not own.holders.any() and (own.group_of == -1).all()
    h.check_accounting()


def test_truncating_the_tables_behind_the_step_s_back_sends_the_repeat_to_the_full_path():
    """step.tables.truncate drops page 2 (not the supported way): the next step, the same as the last (a repeat),
    is refused by the full path with CapacityError instead of writing K/V into the null page 0."""
    h = _rejected_drafts()
    step = h.step
    step.tables.truncate(step.row_of("a"), [1])
    slots = step.slot_mappings[0, :4].tolist()
    assert slots == [32, 33, 34, 35]
    batch = Batch(req_ids=("a",), query_lens=(4,), seq_lens=(20,))
    with pytest.raises(CapacityError, match=re.escape("batch.new_pages[0][0] ('a')='1 page(s) held': group 0 needs "
                                                      "2 page(s) for seq_len=20 (block_size 16); give the request its "
                                                      "new pages in this step's Batch.new_pages")):
        step.run(h.model, batch, input_ids=[1, 2, 3, 4])
    assert step.slot_mappings[0, :4].tolist() == slots  # nothing staged for the null page
    with pytest.raises(CapacityError, match="group 0 needs 2 page"):  # every time, not only once
        step.prepare(batch)


def test_truncate_refuses_fewer_pages_than_the_written_tokens_need_and_changes_nothing():
    """a has had 20 tokens written (2 pages): truncate(a, [1]) is a CapacityError naming the request, group, pages
    held and needed; nothing changes, and the next step equals the dense reference."""
    h = _rejected_drafts()
    before = h.snapshot()
    with pytest.raises(CapacityError, match=re.escape(
            "num_pages_per_group[0] ('a')=1: request 'a' holds 2 page(s) in group 0, and its 20 written tokens need "
            "2 (block_size 16); keep at least 2 page(s) in group 0, or roll its tokens back first with kept_tokens <= "
            "16 (the tokens 1 page(s) hold; at least the 0 cached tokens it joined with)")):
        h.step.truncate("a", [1])
    with pytest.raises(CapacityError, match=r"request 'a' holds 2 page\(s\) in group 0, and its 17 written tokens "
                                            r"need 2"):
        h.step.truncate("a", [1], kept_tokens=17)
    h.assert_unchanged(before)
    h.computed["a"] = 16
    _drafts(h, "a", 90)
    h.run({"a": 4})
    h.check_accounting()


@pytest.mark.parametrize("args, kw, error, match", [
    (("a", [3]), {}, SpecError, r"num_pages_per_group=\[3\]: needs one count per group \(1\), each in 0..the pages "
                                r"request 'a' holds \(\[2\]\); pass how many"),
    (("a", [-1]), {}, SpecError, r"num_pages_per_group=\[-1\]: needs one count per group"),
    (("a", [1, 1]), {}, SpecError, r"num_pages_per_group=\[1, 1\]: needs one count per group \(1\)"),
    (("a", [True]), {}, SpecError, r"num_pages_per_group"),
    (("a", [1.0]), {}, SpecError, r"num_pages_per_group"),
    (("a", [1]), {"kept_tokens": 21}, SpecError, r"kept_tokens=21: must be in \[0, 20\]: request 'a' has had 20 "
                                                 r"tokens written and joined with 0 cached tokens .*; pass a count "
                                                 r"from 0 to 20"),
    (("a", [1]), {"kept_tokens": 16.0}, SpecError, r"kept_tokens=16.0: must be an integer >= 0"),
    (("a", [1]), {"kept_tokens": True}, SpecError, r"kept_tokens=True: must be an integer >= 0"),
    (("zz", [1]), {}, SpecError, r"req_id='zz': is not an active request"),
], ids=["above-held", "negative", "groups", "bool", "float", "tokens-above-written", "float-tokens", "bool-tokens",
        "unknown"])
def test_truncate_refuses_bad_arguments_and_changes_nothing(args, kw, error, match):
    """Counts above the pages held, negative, of another length, bools and floats; kept_tokens above the written
    tokens, a float or a bool; an unknown request: refused naming the field, and nothing changes."""
    h = _rejected_drafts()
    before = h.snapshot()
    with pytest.raises(error, match=match):
        h.step.truncate(*args, **kw)
    h.assert_unchanged(before)
    assert h.step.shape is not None  # the last step is remembered: nothing happened
    h.check_accounting()


def test_truncate_drops_pages_given_ahead_without_a_rollback():
    """a holds pages 1, 2 but has 10 tokens written: truncate(a, [1]) frees page 2, and a's decodes (crossing into a
    second page, page 2 again) equal the dense reference."""
    h = Harness("AA")
    h.add("a", 10)
    h.run({"a": 10})
    step, own, row = h.step, h.step.ownership, h.step.row_of("a")
    page = h.free.pop()  # page 2, given in a decode step ahead of need
    batch = Batch(req_ids=("a",), query_lens=(1,), seq_lens=(11,), new_pages=(((page,),),))
    logits = step.run(h.model, batch, input_ids=h.tokens["a"][10:11])
    assert (logits - dense_forward(h.weights, h.tokens["a"][:11])[10:]).abs().max().item() < TOLERANCE
    h.pages["a"][0].append(page)
    h.computed["a"] = 11
    h.tokens["a"].append(int(logits[0].argmax()))
    assert h.pages["a"] == [[1, 2]] and own.holders[2] == 1 and own.writer_row[2] == row
    _truncate(h, "a", [1])
    assert (own.holders[2], own.group_of[2], own.writer_row[2], own.written[row]) == (0, -1, -1, 11)
    assert step.tables.num_pages_np[0, row] == 1
    h.check_accounting()
    for _ in range(7):  # to 18 tokens: the second page is page 2 again
        h.decode_all()
    assert h.pages["a"] == [[1, 2]]
    h.check_accounting()


def test_truncate_of_a_page_another_request_holds_leaves_it_to_that_request():
    """a wrote 48 tokens (pages 1, 2, 3); b joins claiming all 48; a rolls back to 32 tokens and drops page 3: b
    still holds it (no live writer, no cached tokens, one shared page less), and both decode as the dense reference;
    b's finish frees it."""
    h = Harness("AA")
    h.add("a", 48)
    h.run({"a": 48})
    h.add("b", 0, prompt=h.tokens["a"][:48] + [3, 1, 4], cached_pages=[[1, 2, 3]], cached_tokens=48)
    h.run({"b": 3})
    own = h.step.ownership
    assert own.holders[[1, 2, 3]].tolist() == [2, 2, 2] and own.num_shared == 3
    _truncate(h, "a", [2], kept_tokens=32)
    del h.tokens["a"][32:]
    h.tokens["a"] += [7, 7, 7]
    assert (own.holders[3], own.group_of[3], own.writer_row[3], own.filled[3], own.filled_at[3]) == (1, 0, -1, 0, -1)
    assert own.num_shared == 2 and h.pages["a"] == [[1, 2]]
    h.check_accounting()
    h.run({"a": 3, "b": 1})  # a writes positions 32.. into a page of its own
    assert 3 not in h.pages["a"][0]
    h.decode_all()
    h.finish("b")
    assert own.holders[3] == 0 and own.group_of[3] == -1
    h.decode_all()
    h.check_accounting()


def test_truncate_in_a_plan_with_state_layers_keeps_the_state_and_the_written_tokens():
    """Mamba + attention: the written tokens cannot roll back (kept_tokens other than them is refused), the state
    page cannot go (CapacityError naming it), nor attention pages the written tokens need."""
    h = Harness("MAMA")
    h.add("a", 20)
    h.run({"a": 20})
    before = h.snapshot()
    with pytest.raises(SpecError, match=r"kept_tokens=16: request 'a' has had 20 tokens written, and the model's "
                                        r"state \(Mamba / gated-delta\) layers .* cannot be rolled back; leave "
                                        r"kept_tokens unset \(or 20\)"):
        h.step.truncate("a", [1, 1], kept_tokens=16)
    with pytest.raises(CapacityError, match=re.escape("num_pages_per_group[0] ('a')=0: request 'a' holds 1 page(s) "
                                                      "in group 0, and its 20 written tokens need 1 (its state "
                                                      "page); keep at least 1 page(s) in group 0")):
        h.step.truncate("a", [0, 2])
    with pytest.raises(CapacityError, match=r"num_pages_per_group\[1\] \('a'\)=1: .*need 2 \(block_size 16\); keep "
                                            r"at least 2 page\(s\) in group 1$"):
        h.step.truncate("a", [1, 1], kept_tokens=20)
    h.assert_unchanged(before)
    _truncate(h, "a", [1, 2])  # all it holds: nothing dropped
    h.assert_unchanged(before)
    h.decode_all()
    h.check_accounting()
