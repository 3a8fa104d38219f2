"""DemoEngine's overlapped decode: a decode step launched from the last step's tokens on the device, before the
host reads them, serves the same tokens as the synchronous loop, drops the extra token of a request that stopped,
and hands the pages of finished requests to waiting ones as before."""

from __future__ import annotations

import pytest
import torch

import graphkv
from graphkv.errors import SpecError
from graphkv.models.demo_engine import DemoEngine, DemoRequest
from graphkv.models.paged_tiny_hybrid import PagedTinyHybrid
from graphkv.models.tiny_hybrid import TinyHybridConfig, dense_forward, init_weights, model_kv
from graphkv.runtime.pool.allocate import allocate
from graphkv.runtime.step.step import Step

PROMPTS = (1, 54, 97, 5, 33, 17)
NEW_TOKENS = (6, 3, 4, 8, 2, 5)


def _engine(pattern: str, *, overlap: bool, kernels: str = "auto", device: str = "cpu") -> tuple[DemoEngine, object]:
    config = TinyHybridConfig(pattern=pattern)
    plan = graphkv.compile(model_kv(config), graphkv.Limits(max_model_len=128, max_num_seqs=3,
                                                            max_num_batched_tokens=64, num_blocks_override=24), None)
    weights = init_weights(config, seed=0)
    model = PagedTinyHybrid(weights.to(device), allocate(plan, device), kernels=kernels)
    return DemoEngine(plan, Step(plan, device, kernels=kernels), model, overlap=overlap), weights


def _requests(stop: dict[str, int] | None = None) -> list[DemoRequest]:
    gen = torch.Generator().manual_seed(1)
    stop = stop or {}
    return [DemoRequest(req_id=f"r{i}", prompt=torch.randint(0, 97, (n,), generator=gen).tolist(), max_new_tokens=m,
                        stop_token_ids={stop[f"r{i}"]} if f"r{i}" in stop else ())
            for i, (n, m) in enumerate(zip(PROMPTS, NEW_TOKENS))]


def _serve(engine: DemoEngine, requests: list[DemoRequest], max_steps: int = 100_000):
    # at most 3 running, a 64-token budget (the 97-token prompt is chunked), a pool too small for all six at once
    return engine.run(requests[:2], arrivals={2: requests[2:4], 5: requests[4:]}, max_steps=max_steps)


@pytest.mark.parametrize("pattern", ["MAMA", "AAA"])
def test_overlapped_decode_serves_the_synchronous_loops_tokens(pattern: str, device: str) -> None:
    """Six requests joining, chunked and reusing pages: overlap on and off give the same tokens, which follow the
    dense reference; the overlapped run launched decode steps from device tokens, the synchronous one none, and
    both computed the same tokens (no request stopped early) and sampled the same 28. On a GPU the overlapped
    steps really run ahead: pinned copies, events and the two token buffers."""
    sync_engine, weights = _engine(pattern, overlap=False, device=device)
    sync_stats = _serve(sync_engine, _requests())
    engine, _ = _engine(pattern, overlap=True, device=device)
    stats = _serve(engine, _requests())
    assert engine.finished == sync_engine.finished
    assert stats.overlapped > 0 and sync_stats.overlapped == 0
    assert stats.generated == sync_stats.generated == sum(NEW_TOKENS)
    assert stats.tokens == sync_stats.tokens == sum(PROMPTS) + sum(NEW_TOKENS) - len(PROMPTS)
    assert stats.finished == 6 and stats.pages_reused == sync_stats.pages_reused > 0
    assert engine._promised == sync_engine._promised == 0  # every lifetime page promised was taken or given back
    for r in _requests():
        tokens = engine.finished[r.req_id]
        dense = dense_forward(weights, tokens)
        assert tokens[len(r.prompt):] == dense[len(r.prompt) - 1:-1].argmax(-1).tolist()


def test_a_request_that_stops_in_an_overlapped_step_drops_its_extra_token() -> None:
    """r3 greedily generates 56 55 55 55 55 55 12 8; with 12 as its stop token it ends at its 7th token in both
    loops. The overlapped loop had already launched its 8th position when it read the 12, so it computed exactly one
    token more (229 against 228) and kept the same tokens."""
    sync_engine, _ = _engine("AAA", overlap=False)
    _serve(sync_engine, _requests())
    r3 = _requests()[3]
    assert sync_engine.finished["r3"][len(r3.prompt):] == [56, 55, 55, 55, 55, 55, 12, 8]
    sync_engine, _ = _engine("AAA", overlap=False)
    sync_stats = _serve(sync_engine, _requests({"r3": 12}))
    engine, _ = _engine("AAA", overlap=True)
    stats = _serve(engine, _requests({"r3": 12}))
    assert engine.finished == sync_engine.finished
    assert engine.finished["r3"][len(r3.prompt):] == [56, 55, 55, 55, 55, 55, 12]
    assert stats.generated == sync_stats.generated == sum(NEW_TOKENS) - 1
    assert (stats.tokens, sync_stats.tokens) == (229, 228)


def test_overlapped_decode_on_the_gpu_path_on_a_cpu() -> None:
    """The GPU path on a CPU (Triton kernels interpreted, staged tables and metadata): the overlapped loop gives
    the synchronous loop's tokens."""
    sync_engine, _ = _engine("MAMA", overlap=False, kernels="triton")
    _serve(sync_engine, _requests())
    engine, _ = _engine("MAMA", overlap=True, kernels="triton")
    stats = _serve(engine, _requests())
    assert engine.finished == sync_engine.finished and stats.overlapped > 0


def test_max_steps_counts_the_same_steps_with_the_overlap() -> None:
    """The synchronous run takes N steps; with the overlap, max_steps=N still finishes (the last tokens are read
    without a step) and N-1 raises CapacityError naming max_steps."""
    sync_engine, _ = _engine("AAA", overlap=False)
    steps = _serve(sync_engine, _requests()).steps
    engine, _ = _engine("AAA", overlap=True)
    stats = _serve(engine, _requests(), max_steps=steps)
    assert steps == 12 and stats.steps == steps and engine.done and engine.finished == sync_engine.finished
    engine, _ = _engine("AAA", overlap=True)
    with pytest.raises(graphkv.CapacityError, match="max_steps"):
        _serve(engine, _requests(), max_steps=steps - 1)


def test_a_forward_that_raises_in_an_overlapped_step_loses_no_token_and_no_page() -> None:
    """The forward raises once, in the third overlapped step: the error reaches the caller, the pages that step
    took are back on the free list as they were, the unread tokens stay; running on gives the synchronous loop's
    tokens and every page is free at the end."""
    sync_engine, _ = _engine("AAA", overlap=False)
    _serve(sync_engine, _requests())
    engine, _ = _engine("AAA", overlap=True)
    forward, launch = engine.forward, engine._launch_decode
    seen = {"launches": 0, "free": None, "raise": False}

    def launching(sampled):
        seen["launches"] += 1
        seen["free"], seen["raise"] = list(engine._free), seen["launches"] == 3
        try:
            return launch(sampled)
        finally:
            seen["raise"] = False

    def flaky(*args, **kwargs):
        if seen["raise"]:
            raise RuntimeError("device lost")
        return forward(*args, **kwargs)

    engine._launch_decode, engine.forward = launching, flaky
    requests = _requests()
    with pytest.raises(RuntimeError, match="device lost"):
        _serve(engine, requests)
    assert seen["launches"] == 3 and engine.stats.overlapped == 2
    assert engine._free == seen["free"] and engine._sampled is not None
    assert engine.stats.steps == 5 and [r.req_id for r in engine._waiting] == ["r4", "r5"]  # every arrival added
    engine.run()
    assert engine.finished == sync_engine.finished
    assert sorted(engine._free) == list(range(1, engine.plan.num_blocks))


@pytest.mark.parametrize("pattern", ["AAA", "MAMA"])  # one KV group; an attention and a state group (pages of two)
@pytest.mark.parametrize("failing_call", [1, 3, 4])
def test_a_forward_that_raises_in_a_scheduled_step_loses_no_page_and_no_request(failing_call: int, pattern: str) -> None:
    """The synchronous loop's forward raises once, in a step that admits requests and hands out pages: the first
    (r0 and r1 admitted), the third or the fourth (the arrivals). The engine kept the pages it had handed out and the admitted
    requests as running, so run() failed for good ("0 page(s) held"); now the step is undone — its pages back on the
    free list as they were, its admitted requests at the head of the queue, the pages promised as before — and
    running on gives the uninterrupted loop's tokens, with every page free at the end. (The forward raises before it
    runs, so no state layer has advanced a request's state.)"""
    sync_engine, _ = _engine(pattern, overlap=False)
    _serve(sync_engine, _requests())
    engine, _ = _engine(pattern, overlap=False)
    forward, schedule, calls, snapshot = engine.forward, engine._schedule, [0], {}

    def state() -> dict:
        return dict(free=list(engine._free), promised=engine._promised, waiting=[r.req_id for r in engine._waiting],
                    running={k: (list(map(list, r.pages)), r.computed) for k, r in engine._running.items()},
                    allocated=engine.stats.pages_allocated, tokens=engine.stats.tokens)

    def scheduling():
        snapshot.update(state())  # the engine just before this step's schedule
        return schedule()

    def flaky(*args, **kwargs):
        calls[0] += 1
        if calls[0] == failing_call:
            raise RuntimeError("out of memory")
        return forward(*args, **kwargs)

    engine._schedule, engine.forward = scheduling, flaky
    requests = _fail(engine, state, snapshot)
    if failing_call == 1:
        assert snapshot["running"] == {} and snapshot["waiting"] == ["r0", "r1"]
    _go_on(engine, sync_engine, requests)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("failing_call", [3, 8])
def test_a_forward_that_raises_after_its_state_layers_ran_is_recomputed(failing_call: int, overlap: bool) -> None:
    """The forward runs every layer (a state layer advances its requests' states in place), then raises, as an
    out-of-memory in the head would: run() again gave other tokens (the step's token applied to the state twice).
    The Step marks the step's running requests unsure and the engine queues them again to prefill their tokens so
    far: the tokens equal the uninterrupted loop's, and every page is free at the end."""
    sync_engine, _ = _engine("MAMA", overlap=False)
    _serve(sync_engine, _requests())
    engine, _ = _engine("MAMA", overlap=overlap)
    forward, calls, unsure = engine.forward, [0], []

    def late_failure(*args, **kwargs):
        out = forward(*args, **kwargs)
        calls[0] += 1
        if calls[0] == failing_call:
            raise RuntimeError("out of memory")
        return out

    engine.forward = late_failure
    requests = _requests()
    with pytest.raises(RuntimeError, match="out of memory"):
        _serve(engine, requests)
    unsure.extend(engine.step_api.unsure_requests)
    assert unsure and set(unsure) <= set(engine._running)  # running requests of the failed step
    _go_on(engine, sync_engine, requests)
    assert engine.step_api.unsure_requests == ()


def _fail(engine, state, snapshot) -> list[DemoRequest]:
    """Serve until the planted error; the engine is as it was before the failing step (``snapshot``)."""
    requests = _requests()
    with pytest.raises(RuntimeError, match="out of memory"):
        _serve(engine, requests)
    assert state() == snapshot
    return requests


def _go_on(engine, sync_engine, requests) -> None:
    """Run on (the arrivals not added before the failure), then compare with the uninterrupted loop."""
    known = engine._waiting_ids | set(engine._running)
    engine.run(arrivals={s: [r for r in rs if r.req_id not in known]
                         for s, rs in {2: requests[2:4], 5: requests[4:]}.items() if s >= engine.stats.steps})
    assert engine.finished == sync_engine.finished
    assert sorted(engine._free) == list(range(1, engine.plan.num_blocks)) and engine._promised == 0


def test_a_sampling_that_raises_undoes_the_step_and_its_schedule() -> None:
    """The forward ran but sampling its logits raised (e.g. out of memory reading them): the Step had advanced while the
    engine had not, and a retry ran the same tokens again. The Step is taken back with the schedule: the state is as
    before the step (the step's rows and written tokens too), and running on gives the uninterrupted loop's tokens."""
    sync_engine, _ = _engine("MAMA", overlap=False)
    _serve(sync_engine, _requests())
    engine, _ = _engine("MAMA", overlap=False)
    schedule, sample, calls, snapshot = engine._schedule, engine._sampler.sample, [0], {}

    def state() -> dict:
        return dict(free=list(engine._free), promised=engine._promised, waiting=[r.req_id for r in engine._waiting],
                    running={k: (list(map(list, r.pages)), r.computed) for k, r in engine._running.items()},
                    active=engine.step_api.active_requests, written=engine.step_api.ownership.written.tolist())

    def scheduling():
        snapshot.update(state())
        return schedule()

    def failing_sample(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("out of memory")
        return sample(*args, **kwargs)

    engine._schedule, engine._sampler.sample = scheduling, failing_sample
    _go_on(engine, sync_engine, _fail(engine, state, snapshot))


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_stops_a_running_and_a_waiting_request_and_the_others_go_on(overlap: bool) -> None:
    """engine.abort(id) mid-run: a running request (r1, after 2 steps) leaves with the tokens it had, a prefix of its
    uninterrupted ones, and a waiting one (r5) returns its prompt; the others' tokens equal the uninterrupted loop's
    and every page is free at the end. A finished or unknown id is refused naming it (finish() behind the engine's
    back left it holding the pages: every later step failed)."""
    sync_engine, _ = _engine("MAMA", overlap=False)
    _serve(sync_engine, _requests())
    engine, _ = _engine("MAMA", overlap=overlap)
    requests = _requests()
    for r in requests:
        engine.add(r)
    engine.step()
    engine.step()  # r1 (3 new tokens) has 1 or 2 of them
    assert engine.holds("r1") and engine.holds("r5") and not engine.holds("r9") and not engine.holds(["x"])
    tokens = engine.abort("r1")
    assert len(tokens) > len(requests[1].prompt) and sync_engine.finished["r1"][:len(tokens)] == tokens
    assert engine.abort("r5") == list(requests[5].prompt) and not engine.holds("r5")
    for bad, message in (("r9", "'r9': is neither waiting nor running"), (["x"], "neither waiting nor running")):
        with pytest.raises(SpecError, match=message):
            engine.abort(bad)
    engine.run()
    assert engine.finished == {k: v for k, v in sync_engine.finished.items() if k not in ("r1", "r5")}
    with pytest.raises(SpecError, match=r"'r0': is neither waiting nor running in this engine \(it finished"):
        engine.abort("r0")
    assert sorted(engine._free) == list(range(1, engine.plan.num_blocks)) and engine._promised == 0
