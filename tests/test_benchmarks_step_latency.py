"""benchmarks/step_latency.py: its decode workload keeps to what a step accepts (the demo model has state layers, so
a request's context never goes back) and times the repeat path."""

from __future__ import annotations

from types import ModuleType

from benchmark_modules import benchmark_module


def _step_latency() -> ModuleType:
    """benchmarks/step_latency.py as a module."""
    return benchmark_module("step_latency")


def test_the_decode_workload_runs_many_rounds_on_the_repeat_path() -> None:
    """30 rounds of every contender, prefilled again between rounds before the page is outgrown: every graphkv step is
    accepted (the workload alternated two lengths, a rollback the demo's state layers now refuse) and repeats the
    last step; the lengths stay within one page."""
    from graphkv.runtime import Step

    bench = _step_latency()
    plan = bench.demo_plan(4)
    step = Step(plan)
    work = bench.DecodeWorkload(plan, step, 3)
    steps = work.steps()
    lengths = []
    for round_ in range(30):
        for name in ("graphkv_prepare", "graphkv_run", "list_to_tensor", "vllm_v1"):
            steps[name]()
            if name.startswith("graphkv"):
                assert step._repeat is not None, (round_, name)  # the repeat path ran
                lengths.append(work.length)
        work.after_round(round_)
    assert max(lengths) <= work.capacity and len(set(lengths)) > 2
    assert step.active_requests == ("req0", "req1", "req2")


def test_the_finish_workload_gives_every_contenders_pages_back_each_round() -> None:
    """Ten rounds of finishing a request of 64 attention pages (1,024 tokens) and one state page, joined again between
    rounds: graphkv's step holds no request and no page after each finish, with each page's written tokens kept (16
    each); the list engine frees all 65 pages; V1 links all 65 blocks onto its free queue and drops the request."""
    from graphkv.runtime import Step

    bench = _step_latency()
    plan = bench.finish_plan()
    step = Step(plan)
    work = bench.FinishWorkload(plan, step, 64)
    steps = work.steps()
    own = step.ownership
    for round_ in range(10):
        for name in ("graphkv_finish", "list_to_tensor", "vllm_v1"):
            steps[name]()
        attention = [p for group in work.pages if len(group) == 64 for p in group]
        assert step.active_requests == () and not own.holders.any() and own.num_shared == 0
        assert own.filled[attention].tolist() == [16] * 64 and (own.group_of == -1).all()
        assert sorted(work.lists.free_ids) == sorted(p for group in work.pages for p in group)
        assert work.v1.num_free == 65 and "r" not in work.v1.req_id_to_index
        work.join(round_)


def test_the_crossing_workload_gives_every_contender_the_same_pages_and_repeats_with_them() -> None:
    """120 rounds (a join again included) of 8 requests whose decodes cross into new pages on different steps: every
    graphkv step is accepted on the repeat path, and after each round graphkv's tables, nano-vllm's lists and V1's
    block table hold the same pages for every request, as many as its length needs."""
    from graphkv.runtime import Step

    bench = _step_latency()
    plan = bench.demo_plan(8)
    step = Step(plan)
    work = bench.CrossingWorkload(plan, step, 8)
    steps = work.steps()
    g = work.attention[0]
    crossings = joins = 0
    for round_ in range(120):
        for name in ("graphkv_prepare", "list_to_tensor", "vllm_v1"):
            steps[name]()
        assert step._repeat is not None, round_  # the repeat path ran, new pages or not
        crossings += len(work.cross)
        for i, length in enumerate(work.lens):
            pages = step.tables.pages_np[g][step.row_of(work.req_ids[i])]
            held = pages[:int(step.tables.num_pages_np[g, step.row_of(work.req_ids[i])])].tolist()
            assert held == work.seqs[i].block_tables[g] == work.own[i][g][:-(-length // work.block)], (round_, i)
            assert work.v1.tables[g].np[i, :len(held)].tolist() == held
        before = work.lens[0]
        work.advance(round_)
        joins += work.lens[0] < before
    assert crossings >= 50 and joins >= 1
