"""A repeated step whose requests cross into new pages (the repeat path's few appends): the full path's buffers, tables
and page ownership, its refusals with nothing changed, and its undo."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from step_harness import Harness

from graphkv import CapacityError, SpecError
from graphkv.runtime import Batch, Step
from graphkv.runtime.step.appends import FEW_APPENDS
from graphkv.runtime.step.repeat import PYTHON_TOKENS


def _staggered(n: int, pattern: str, *, kernels: str = "auto", seed: int = 0) -> Harness:
    """``n`` live requests of 5 .. 16 tokens (so that their decodes cross into a second page on different steps),
    prefilled and decoded once (the next decode can repeat it)."""
    h = Harness(pattern, num_blocks=6 * n + 8, max_num_seqs=n, budget=32 * n, max_model_len=64, seed=seed)
    if kernels != "auto":
        h.step = Step(h.plan, kernels=kernels)
    lengths = {f"r{i}": 5 + (i * 11) // max(n - 1, 1) for i in range(n)}
    for req, length in lengths.items():
        h.add(req, length)
    h.run(lengths)
    h.decode_all()
    return h


def _state(h: Harness) -> dict[str, np.ndarray]:
    """Tables (host, persistent and per-step device rows), page ownership and the step's metadata buffers."""
    step, own = h.step, h.step.ownership
    out = {f"pages{g}": p.copy() for g, p in enumerate(step.tables.pages_np)}
    out["num_pages"] = step.tables.num_pages_np.copy()
    out.update({f"device{g}": t.clone().numpy() for g, t in enumerate(step.tables.tables)})
    out.update({f"input{g}": t.clone().numpy() for g, t in enumerate(step.tables.input_tables)})
    for name in ("holders", "group_of", "writer_row", "writer_col", "filled", "filled_at", "written"):
        out[name] = getattr(own, name).copy()
    ctx = step.context
    for name in ("query_start_loc", "seq_lens", "context_lens", "positions", "slot_mappings", "token_row"):
        out[name] = getattr(ctx, name).clone().numpy()
    return out


def _assert_equal_states(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name


@pytest.mark.parametrize("pattern", ["AA", "MAMA"])
@pytest.mark.parametrize("n", [3, PYTHON_TOKENS + 4])
def test_decodes_crossing_into_new_pages_repeat_and_equal_the_full_path(n, pattern):
    """Decodes in which some requests gain a page take the repeat path (Python and numpy), give the dense logits, and
    leave tables, ownership and buffers exactly as the full path leaves them, step by step."""
    fast, full = _staggered(n, pattern), _staggered(n, pattern)
    crossings = 0
    for _ in range(20):
        batch, _, _ = fast.batch({r: 1 for r in fast.step.active_requests})
        crossings += bool(batch.new_pages)
        full.step._forget_last()  # the full path every step
        fast.decode_all()
        full.run({r: 1 for r in full.step.active_requests}, check=False)  # (its buffers are compared below)
        assert fast.step._repeat is not None and full.step._repeat is None
        _assert_equal_states(_state(fast), _state(full))
    assert crossings >= 3  # steps with new pages were among them
    fast.check_accounting()


def test_the_staged_sync_of_a_repeat_with_new_pages_equals_the_host_sync():
    """With the GPU's staged table sync (Triton kernels, interpreted on a CPU) a repeated step's appended pages reach
    the device tables and the step's rows as the host sync writes them."""
    staged, host = _staggered(3, "MAMA", kernels="triton"), _staggered(3, "MAMA")
    for _ in range(8):
        staged.decode_all()
        host.decode_all()
        assert staged.step._repeat is not None
        for a, b in zip(staged.step.tables.input_tables, host.step.tables.input_tables):
            assert torch.equal(a, b)
    staged.step.tables.commit()
    for a, b in zip(staged.step.tables.tables, host.step.tables.tables):
        assert torch.equal(a, b)


def _cross_batch(h: Harness) -> tuple[Batch, list[int], int]:
    """The next decode of every live request, run after enough decodes that request ``i`` needs a new page in it."""
    for _ in range(16):
        batch, ids, _ = h.batch({r: 1 for r in h.step.active_requests})
        if batch.new_pages:
            i = next(k for k, p in enumerate(batch.new_pages) if p is not None)
            return batch, ids, i
        h.decode_all()
    raise AssertionError("no decode crossed into a new page")


def _with_pages(batch: Batch, i: int, h: Harness, pages: tuple) -> Batch:
    new_pages = list(batch.new_pages)
    new_pages[i] = h.group_pages(attention=pages)
    return Batch(req_ids=batch.req_ids, query_lens=batch.query_lens, seq_lens=batch.seq_lens,
                 new_pages=tuple(new_pages))


@pytest.mark.parametrize("n", [3, PYTHON_TOKENS + 4])
def test_a_repeat_given_bad_pages_refuses_as_the_full_path_and_changes_nothing(n):
    """Pages another request holds, the null page, a page past the pool, a page given twice, a bool, a state page for
    a running request and no new page where one is needed: the full path's error, nothing changed."""
    h = _staggered(n, "MAMA")
    batch, ids, i = _cross_batch(h)
    other = h.pages[h.step.active_requests[(i + 1) % n]][h.attention[0]][0]
    free = h.free[-1]
    state_pages = list(h.group_pages(attention=(free,)))
    state_pages[h.state[0]] = (h.free[-2],)
    no_page = list(batch.new_pages)
    no_page[i] = None
    twice = list(batch.new_pages)
    j = next(k for k in range(n) if k != i)
    twice[j] = h.group_pages(attention=(free,))
    cases = [_with_pages(batch, i, h, (other,)), _with_pages(batch, i, h, (0,)),
             _with_pages(batch, i, h, (h.plan.num_blocks,)), _with_pages(batch, i, h, (True,)),
             Batch(req_ids=batch.req_ids, query_lens=batch.query_lens, seq_lens=batch.seq_lens,
                   new_pages=tuple(twice[:i] + [h.group_pages(attention=(free,))] + twice[i + 1:])),
             Batch(req_ids=batch.req_ids, query_lens=batch.query_lens, seq_lens=batch.seq_lens,
                   new_pages=tuple(batch.new_pages[:i]) + (tuple(state_pages),) + tuple(batch.new_pages[i + 1:])),
             Batch(req_ids=batch.req_ids, query_lens=batch.query_lens, seq_lens=batch.seq_lens,
                   new_pages=tuple(no_page) if any(p is not None for p in no_page) else ())]
    for bad in cases:
        before = h.snapshot()
        with pytest.raises((SpecError, CapacityError)) as fast:
            h.step.prepare(bad)
        h.assert_unchanged(before)
        h.step._forget_last()  # the same batch on the full path
        with pytest.raises((SpecError, CapacityError)) as full:
            h.step.prepare(bad)
        h.assert_unchanged(before)
        assert type(fast.value) is type(full.value) and str(fast.value) == str(full.value)
        h.decode_all()  # repeat again from here
        batch, ids, i = _cross_batch(h)
    h.decode_all()
    h.check_accounting()


def test_a_repeat_with_a_numpy_page_id_takes_the_full_path():
    """A numpy int page id is the full path's to check: the step runs, the page appended once."""
    h = _staggered(3, "AA")
    batch, ids, i = _cross_batch(h)
    page = h.free[-1]
    logits = h.step.run(h.model, _with_pages(batch, i, h, (np.int64(page),)), input_ids=ids)
    assert h.step._repeat is None  # the full path ran it
    assert logits.shape[0] == 3
    assert h.step.tables.pages_np[h.attention[0]][h.step.row_of(batch.req_ids[i])].tolist().count(page) == 1


def test_more_than_few_appends_in_a_repeated_step_take_the_full_path():
    """A repeated chunked prefill gaining more than FEW_APPENDS pages is appended by the full path, exactly."""
    chunk = 16 * (FEW_APPENDS + 1)  # FEW_APPENDS + 1 pages of 16 tokens in each of two steps (one group)
    h = Harness("AA", num_blocks=2 * chunk // 16 + 8, max_num_seqs=1, budget=chunk, max_model_len=2 * chunk + 16)
    h.add("r", 2 * chunk + 1)
    h.run({"r": chunk}, check=False)
    batch, ids, _ = h.batch({"r": chunk})
    assert sum(len(p) for p in batch.new_pages[0]) > FEW_APPENDS
    h.run({"r": chunk}, check=False)
    assert h.step._repeat is None  # the full path appended them
    assert h.step.tables.num_pages_np[:, h.step.row_of("r")].tolist() == [2 * chunk // 16] * len(h.plan.groups)
    h.check_accounting()


def test_a_repeat_with_new_pages_is_undone_when_its_forward_raises():
    """The appended pages leave the tables and the holder counts, the written tokens are as they were; the next
    decode (with the pages again) is exact."""
    h = _staggered(PYTHON_TOKENS + 4, "MAMA")
    batch, ids, _ = _cross_batch(h)
    h.run_failing(batch, ids, "device lost")
    h.decode_all()
    assert h.step._repeat is None  # (undo forgets the last step: this one went the full way)
    batch, ids, _ = _cross_batch(h)
    h.run_failing(batch, ids, "device lost again")
    h.decode_all()
    h.check_accounting()


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_appends_of_pages_split_into_kernel_blocks_equal_the_full_path(kernels):
    """Pages of 2 kernel blocks (64-token pages, kernels of 32): a repeated decode's new pages reach the step rows as
    kernel blocks ``page * 2 + k``, as on the full path, with the host sync and the staged one (Triton, interpreted)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from runtime_plans import attention_plan

    plan = attention_plan(bpk=2, num_blocks=40, max_num_seqs=3, max_num_batched_tokens=256, max_model_len=512)
    assert plan.groups[0].bpk == 2 and plan.groups[0].block_size == 64
    fast, full = Step(plan, kernels=kernels), Step(plan, kernels=kernels)
    lens = [60, 62, 63]  # each crosses into its second page on a different decode (after the first)
    pages = iter(range(1, 40))
    owned = [[next(pages)] for _ in lens]
    first = Batch(req_ids=("a", "b", "c"), query_lens=tuple(lens), seq_lens=tuple(lens),
                  new_pages=tuple(((p[0],),) for p in owned))
    for step in (fast, full):
        step.prepare(first)
    crossed = 0
    for k in range(8):
        lens = [x + 1 for x in lens]
        new = [((next(pages),),) if x % 64 == 1 else None for x in lens]
        crossed += sum(p is not None for p in new)
        batch = Batch(req_ids=("a", "b", "c"), query_lens=(1, 1, 1), seq_lens=tuple(lens),
                      new_pages=tuple(new) if any(new) else ())
        full._forget_last()
        fast.prepare(batch)
        full.prepare(batch)
        assert (fast._repeat is not None) == (k > 0)  # (the first decode follows the prefill: the full path)
        for a, b in zip(fast.tables.input_tables, full.tables.input_tables):
            assert torch.equal(a[:3], b[:3])
        assert torch.equal(fast.slot_mappings[:, :3], full.slot_mappings[:, :3])
    assert crossed == 3
    row = fast.tables.input_tables[0][fast.row_of("c")]  # c crossed at 65: its second page, kernel blocks 2p, 2p + 1
    second = int(fast.tables.pages_np[0][fast.row_of("c"), 1])
    assert row[2:4].tolist() == [2 * second, 2 * second + 1]
    fast.tables.commit()
    full.tables.commit()
    for a, b in zip(fast.tables.tables, full.tables.tables):
        assert torch.equal(a, b)


@pytest.mark.parametrize("poke", ["sync", "show_null_rows"])
def test_a_repeat_after_the_tables_showed_other_rows_shows_its_own(poke):
    """BlockTables.sync (other rows) or show_null_rows called on a Step's tables between two decodes: the repeated
    step's rows show its own requests' pages again (they kept showing what the call left: another request's pages, or
    the null page)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from runtime_plans import attention_plan

    plan = attention_plan(num_blocks=8, max_num_seqs=2, max_model_len=64)
    step = Step(plan)
    step.prepare(Batch(req_ids=("a", "b"), query_lens=(3, 5), seq_lens=(3, 5), new_pages=(((1,),), ((2,),))))
    step.prepare(Batch(req_ids=("a", "b"), query_lens=(1, 1), seq_lens=(4, 6)))
    if poke == "sync":
        step.tables.sync(np.array([step.row_of("b"), step.row_of("a")]), 2)
    else:
        step.tables.show_null_rows(2)
    step.prepare(Batch(req_ids=("a", "b"), query_lens=(1, 1), seq_lens=(5, 7)))
    assert step._repeat is not None
    assert step.tables.input_tables[0][:2, :2].tolist() == [[1, 0], [2, 0]]
