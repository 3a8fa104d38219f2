"""Concurrency targets: the longest length for N requests, the refusal when fewer fit, the max_num_seqs note."""

from __future__ import annotations

import pytest

import graphkv
from graphkv import Budget, CapacityError, Limits
from graphkv.presets import preset_model


@pytest.fixture(scope="module")
def qwen3_next():
    return preset_model("qwen3-next-80b-a3b")


@pytest.fixture(scope="module")
def llama():
    return preset_model("llama-3.1-8b")


def test_qwen3_next_64_users_at_20gib(qwen3_next) -> None:
    """64 requests fit at 11,968 tokens: 22 attention pages + 3 state pages each, 64 x 25 <= 1605 usable."""
    plan = graphkv.compile(qwen3_next, Limits(concurrency=64), Budget.kv_bytes("20GiB"))
    assert plan.max_model_len == 11968
    assert [g.pages_per_request for g in plan.groups] == [1, 1, 1, 22]
    assert plan.capacity.pages_per_request == 25
    assert plan.capacity.usable_pages == 1605
    assert plan.capacity.max_concurrency == 64 and 64 * 25 <= 1605
    # one more token needs a 23rd attention page: 64 x 26 = 1664 > 1605
    assert plan.pages_per_request_at(11969) == 26


def test_llama_16_users_at_16gib(llama) -> None:
    """Llama-3.1-8B at 16 GiB for 16 requests: 8191 usable 2 MiB pages // 16 = 511 pages = 8,176 tokens."""
    plan = graphkv.compile(llama, Limits(concurrency=16), Budget.kv_bytes("16GiB"))
    assert plan.max_model_len == 8176
    assert plan.capacity.usable_pages == 8191 and plan.capacity.pages_per_request == 511


def test_fixed_length_with_too_many_requests_names_both_answers(llama) -> None:
    """16 requests of 16,384 tokens do not fit: the error names 7 (the most that fit) and 8,176 (the longest for 16)."""
    with pytest.raises(CapacityError) as info:
        graphkv.compile(llama, Limits(concurrency=16, max_model_len=16384), Budget.kv_bytes("16GiB"))
    message = str(info.value)
    assert message.startswith("concurrency=16: only 7 request(s) of max_model_len=16384 (1024 pages each)")
    assert "lower concurrency to <= 7, or lower max_model_len to <= 8176 for 16 requests at once" in message


def test_fixed_length_that_fits_the_concurrency_plans(llama) -> None:
    """7 requests of 16,384 tokens fit 8191 pages (7 x 1024 = 7168)."""
    plan = graphkv.compile(llama, Limits(concurrency=7, max_model_len=16384), Budget.kv_bytes("16GiB"))
    assert plan.capacity.max_concurrency == 7 and plan.notes[-1].startswith("max_num_seqs=256 exceeds the 7 request(s)")


def test_concurrency_where_even_one_token_does_not_fit(qwen3_next) -> None:
    """Each request holds at least 4 pages (3 states + 1 attention): 402 of them exceed 1605 pages."""
    with pytest.raises(CapacityError) as info:
        graphkv.compile(qwen3_next, Limits(concurrency=402, max_num_seqs=256), Budget.kv_bytes("20GiB"))
    assert "lower concurrency to <= 401" in str(info.value)


def test_a_concurrency_no_pool_can_hold_says_more_memory_cannot_help(qwen3_next) -> None:
    """2**31 - 1 requests of 4 pages need 104,448 TiB: the fix said "raise the KV budget to >= 104448.00 TiB", above
    the 1 PiB any budget may be; now it says raising it cannot help."""
    with pytest.raises(CapacityError) as info:
        graphkv.compile(qwen3_next, Limits(concurrency=2**31 - 1), Budget.kv_bytes("20GiB"))
    assert str(info.value).endswith("lower concurrency to <= 401, or raise the KV budget (which cannot help: "
                                    "8589934588 pages take 104448.00 TiB, more than the 1024.00 TiB a pool may be)")


def test_max_num_seqs_above_full_length_concurrency_is_a_note(llama) -> None:
    """max_num_seqs=256 with 16 full-length requests fitting plans, with a note giving both numbers."""
    plan = graphkv.compile(llama, Limits(concurrency=16), Budget.kv_bytes("16GiB"))
    reader_note = plan.notes[0]
    assert reader_note.startswith("config reader: read LlamaForCausalLM as family llama")
    assert plan.notes[1:] == (
        "max_num_seqs=256 exceeds the 16 request(s) of max_model_len=8176 that fit at once (511 pages each, 8191 "
        "usable pages): beyond 16, requests run only while shorter, else the scheduler waits or preempts; for "
        "full-length requests, max_num_seqs <= 16",)
    quiet = graphkv.compile(llama, Limits(concurrency=16, max_num_seqs=16), Budget.kv_bytes("16GiB"))
    assert quiet.notes == (reader_note,)


def test_concurrency_above_max_num_seqs_is_a_note(llama) -> None:
    """concurrency=300 under max_num_seqs=256 plans the length for 300 requests, 44 of which can never run at once:
    the note says so and gives both fixes; concurrency == max_num_seqs says nothing."""
    plan = graphkv.compile(llama, Limits(concurrency=300, max_num_seqs=256), Budget.kv_bytes("16GiB"))
    assert plan.notes[1:] == (
        f"concurrency=300 exceeds max_num_seqs=256: at most 256 requests run at once, so max_model_len="
        f"{plan.max_model_len} is planned for 44 request(s) that never run; raise max_num_seqs to >= 300, or lower "
        "concurrency to <= 256 for a longer max_model_len",)
    assert len(graphkv.compile(llama, Limits(concurrency=256), Budget.kv_bytes("16GiB")).notes) == 1


def test_reverse_questions_from_the_plan(qwen3_next) -> None:
    """The plan answers the reverse questions: longest length for N requests and requests at a length."""
    plan = graphkv.compile(qwen3_next, Limits(), Budget.kv_bytes("20GiB"))
    assert plan.max_model_len == 262144 and plan.capacity.max_concurrency == 3
    assert plan.max_model_len_for(64) == 11968
    assert plan.max_model_len_for(3) == 262144
    assert plan.concurrency_at(11968) == 64
    assert plan.max_model_len_for(402) == 0


def test_json_tables_answer_both_ways(qwen3_next) -> None:
    """`max_concurrency`, `concurrency` and the pages-per-request table are in the JSON."""
    data = graphkv.compile(qwen3_next, Limits(concurrency=64), Budget.kv_bytes("20GiB")).to_dict()
    assert data["max_concurrency"] == 64 and data["concurrency"] == 64
    rows = {r["max_model_len"]: r for r in data["pages_per_request_table"]["by_length"]}
    assert rows[11968] == {"max_model_len": 11968, "pages_per_request": 25, "pages_by_group": [1, 1, 1, 22],
                           "max_concurrency": 64}
    assert rows[262144]["max_concurrency"] == 3 and rows[1024]["pages_per_request"] == 5
    by_n = {r["concurrency"]: r["max_model_len"] for r in data["pages_per_request_table"]["by_concurrency"]}
    assert by_n[64] == 11968 and by_n[1] == 262144 and by_n[256] == 1632
    assert sorted(by_n) == [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_concurrency_must_be_positive() -> None:
    """concurrency=0 is a SpecError naming the field."""
    with pytest.raises(graphkv.SpecError, match="Limits.concurrency=0: must be an integer > 0"):
        Limits(concurrency=0)


def test_speculative_tokens_with_state_layers_are_noted(qwen3_next, llama) -> None:
    """The runtime refuses the rollback a rejected draft needs when the plan has state layers: a plan with
    num_speculative_tokens and gated-delta groups says so up front; one with attention only says nothing."""
    plan = graphkv.compile(qwen3_next, Limits(num_speculative_tokens=2, max_num_seqs=64), Budget.kv_bytes("20GiB"))
    assert plan.notes[-1] == (
        "num_speculative_tokens=2 with state (Mamba / gated-delta) layers: the runtime keeps one state per request, "
        "which has absorbed every token written, so a running request's context cannot roll back: a step after "
        "rejected drafts is refused (write a draft's tokens only once verified)")
    assert not any("num_speculative_tokens" in note
                   for note in graphkv.compile(llama, Limits(num_speculative_tokens=2), Budget.kv_bytes("16GiB")).notes)
    assert not any("num_speculative_tokens" in note
                   for note in graphkv.compile(qwen3_next, Limits(), Budget.kv_bytes("20GiB")).notes)
