"""The repeated step (same requests and query lengths, no new pages): same buffers, same checks as the full path."""

from __future__ import annotations

import attrs
import pytest
import torch
from step_harness import Harness

from graphkv import CapacityError, SpecError
from graphkv.runtime import Batch
from graphkv.runtime.step.repeat import PYTHON_TOKENS


def _buffers(step) -> dict[str, torch.Tensor]:
    ctx = step.context
    out = {f.name: getattr(ctx, f.name).clone() for f in attrs.fields(type(ctx))
           if isinstance(getattr(ctx, f.name), torch.Tensor)}
    out.update({f"table{i}": t.clone() for i, t in enumerate(step.tables.input_tables)})
    return out


def _live(n: int, pattern: str = "AA") -> Harness:
    h = Harness(pattern, num_blocks=4 * n + 8, max_num_seqs=n, budget=32 * n, max_model_len=64)
    for i in range(n):
        h.add(f"r{i}", 5 + i % 6)  # at most 10 tokens: five decodes stay inside the first 16-token page
    h.run({f"r{i}": 5 + i % 6 for i in range(n)})
    return h


@pytest.mark.parametrize("n", [3, PYTHON_TOKENS + 4])
def test_repeated_decodes_equal_the_dense_reference_and_the_full_path(n):
    """Decode steps on the repeat path (Python and numpy) give dense logits and the full path's buffers."""
    h = _live(n)
    h.decode_all()  # a full step: the next decodes repeat it
    assert h.step._repeat is None
    for _ in range(3):
        h.decode_all()
        assert h.step._repeat is not None  # this step went the repeat path
    repeated = _buffers(h.step)
    h.step._forget_last()  # the same step once more, the full way
    h.step.ownership.written[h.step._requests.last_rows] -= 1
    batch = Batch(req_ids=tuple(h.step.active_requests), query_lens=(1,) * n,
                  seq_lens=tuple(h.computed[r] for r in h.step.active_requests))
    h.step.prepare(batch)
    full = _buffers(h.step)
    assert all(torch.equal(repeated[k], full[k]) for k in full)


@pytest.mark.parametrize("n", [3, PYTHON_TOKENS + 4])
def test_a_repeated_step_refuses_what_the_full_path_refuses(n):
    """Skipping ahead, running past the pages held, and a NaN length are refused on a repeat with nothing changed."""
    h = _live(n)
    h.decode_all()
    h.decode_all()
    ids = tuple(h.step.active_requests)
    seq = [h.computed[r] + 1 for r in ids]
    cases = [(2, seq[2] + 2, SpecError, "has had .* tokens written"),
             (1, h.plan.max_model_len + 1, SpecError, "seq_len <= max_model_len"),
             (0, float("nan"), SpecError, "sequence lengths must be integers")]
    for i, value, error, text in cases:
        lengths = list(seq)
        lengths[i] = value
        before = h.snapshot()
        with pytest.raises(error, match=text):
            h.step.prepare(Batch(req_ids=ids, query_lens=(1,) * n, seq_lens=tuple(lengths)))
        h.assert_unchanged(before)
    h.decode_all()  # still exact


@pytest.mark.parametrize("n", [3, PYTHON_TOKENS + 4])
def test_a_repeated_step_with_a_length_list_of_another_size_or_float_lengths_is_refused(n):
    """Too few or too many seq_lens (the repeat's zip paired what there was: a request left out kept the last step's
    position and slot and overwrote its written K/V), or a query length of 1.0, are refused as on the full path,
    nothing changed; the next decodes are exact."""
    h = _live(n)
    h.decode_all()
    h.decode_all()
    ids = tuple(h.step.active_requests)
    seq = tuple(h.computed[r] + 1 for r in ids)
    for query_lens, seq_lens, text in (((1,) * n, seq[:-1], "need one entry per request"),
                                       ((1,) * n, (), "need one entry per request"),
                                       ((1,) * n, seq + (5,), "need one entry per request"),
                                       ((1.0,) + (1,) * (n - 1), seq, "query lengths must be integers")):
        before = h.snapshot()
        with pytest.raises(SpecError, match=text):
            h.step.prepare(Batch(req_ids=ids, query_lens=query_lens, seq_lens=seq_lens))
        h.assert_unchanged(before)
    h.decode_all()
    h.decode_all()


@pytest.mark.parametrize("n", [3, PYTHON_TOKENS + 4])
def test_a_repeated_step_past_the_pages_held_is_refused(n):
    """Requests whose page is full repeating a decode without new pages: CapacityError, nothing changed."""
    h = Harness("AA", num_blocks=4 * n + 8, max_num_seqs=n, budget=32 * n, max_model_len=64)
    for i in range(n):
        h.add(f"r{i}", 15)
    h.run({f"r{i}": 15 for i in range(n)})
    h.decode_all()  # 16 tokens: the first page is full
    ids = tuple(h.step.active_requests)
    before = h.snapshot()
    with pytest.raises(CapacityError, match=r"needs 2 page\(s\) for seq_len=17"):
        h.step.prepare(Batch(req_ids=ids, query_lens=(1,) * n, seq_lens=(17,) * n))
    h.assert_unchanged(before)
    h.decode_all()  # with the new pages it is exact


def test_a_repeated_step_is_undone_when_its_forward_raises():
    """A repeat whose forward raises leaves the written tokens as they were; the next decode is exact."""
    h = _live(3, "MAMA")
    h.decode_all()
    h.decode_all()
    batch, ids, _ = h.batch({r: 1 for r in h.step.active_requests})
    h.run_failing(batch, ids, "device lost")
    h.decode_all()


def test_a_repeated_long_chunk_takes_the_numpy_path_and_equals_the_full_path():
    """One request repeating a 20-token chunk (more than PYTHON_TOKENS tokens) is updated by numpy, like the full path."""
    h = Harness("AA", num_blocks=8, max_num_seqs=2, budget=32, max_model_len=64)
    chunk = 2 * PYTHON_TOKENS + 4
    pages = h.group_pages(attention=(1, 2, 3))  # 48 tokens: both chunks fit without new pages
    h.step.prepare(Batch(req_ids=("r",), query_lens=(chunk,), seq_lens=(chunk,), new_pages=(pages,)))
    h.step.prepare(Batch(req_ids=("r",), query_lens=(chunk,), seq_lens=(2 * chunk,)))
    assert h.step._repeat is not None and h.step._repeat.python is False
    repeated = _buffers(h.step)
    assert h.step.positions[:chunk].tolist() == list(range(chunk, 2 * chunk))
    h.step._forget_last()  # the same step once more, the full way
    h.step.ownership.written[h.step._requests.last_rows] -= chunk
    h.step.prepare(Batch(req_ids=("r",), query_lens=(chunk,), seq_lens=(2 * chunk,)))
    assert h.step._repeat is None
    full = _buffers(h.step)
    assert all(torch.equal(repeated[k], full[k]) for k in full)
