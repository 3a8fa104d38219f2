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
