"""DemoRequest / DemoEngine / PagedTinyHybrid refuse bad prompts and counts naming the field, before anything runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphkv
from graphkv import SpecError
from graphkv.models.demo_engine import DemoEngine, DemoRequest
from graphkv.models.paged_tiny_hybrid import PagedTinyHybrid
from graphkv.models.tiny_hybrid import TinyHybridConfig, init_weights, model_kv
from graphkv.runtime.pool.allocate import allocate
from graphkv.runtime.step.step import Step


@pytest.fixture(scope="module")
def parts():
    """The tiny hybrid model (vocabulary 97) over a 24-page pool: plan, weights, paged model."""
    config = TinyHybridConfig()
    plan = graphkv.compile(model_kv(config), graphkv.Limits(max_model_len=128, max_num_seqs=3,
                                                            max_num_batched_tokens=64, num_blocks_override=24), None)
    weights = init_weights(config)
    return plan, weights, PagedTinyHybrid(weights, allocate(plan))


@pytest.mark.parametrize("count, text", [
    (0, r"DemoRequest.max_new_tokens=0: must be an integer >= 1; pass how many tokens to generate, e.g. 16"),
    (-1, r"DemoRequest.max_new_tokens=-1: must be an integer >= 1"),
    (1.5, r"DemoRequest.max_new_tokens=1.5: must be an integer >= 1 \(got float\)"),
    (True, r"DemoRequest.max_new_tokens=True: must be an integer >= 1 \(got a bool\)"),
])
def test_max_new_tokens_must_be_a_whole_count(count, text):
    """0 and -1 generated one token anyway and 1.5 two; all are refused now."""
    with pytest.raises(SpecError, match=text):
        DemoRequest(req_id="r", prompt=[1, 2], max_new_tokens=count)


@pytest.mark.parametrize("prompt, text", [
    ([], r"DemoRequest.prompt=\[\]: is empty; a prompt needs at least one token id"),
    ("hello", r"DemoRequest.prompt='hello': is text, not token ids; tokenize first"),
    (bytearray(b"ab"), r"DemoRequest.prompt=bytearray\(b'ab'\): is text, not token ids"),  # was served as ids 97, 98
    ([1.0, 2.5], r"DemoRequest.prompt=1.0: token ids must be integers \(not bool, float, str or None\)"),
    ([True, 5], r"DemoRequest.prompt=True: token ids must be integers"),
    (np.array([1.0, 2.0]), r"DemoRequest.prompt='array of dtype float64, shape \(2,\)': token ids must be a 1-D "
                           r"integer array"),
    (torch.tensor([[1, 2]]), r"DemoRequest.prompt='tensor of dtype torch.int64, shape \(1, 2\)': token ids must be a "
                             r"1-D integer tensor"),
])
def test_prompts_that_are_not_token_ids_are_refused(prompt, text):
    """An empty prompt, text, floats, bools and 2-D arrays are refused naming the prompt."""
    with pytest.raises(SpecError, match=text):
        DemoRequest(req_id="r", prompt=prompt, max_new_tokens=2)


def test_integer_arrays_become_python_ints():
    """A numpy or torch int prompt and a numpy max_new_tokens are kept as Python ints."""
    for prompt in (np.array([3, 4], dtype=np.int32), torch.tensor([3, 4]), [np.int64(3), 4]):
        request = DemoRequest(req_id="r", prompt=prompt, max_new_tokens=np.int64(2))
        assert request.prompt == (3, 4) and all(type(t) is int for t in request.prompt)
        assert type(request.max_new_tokens) is int


def test_an_unhashable_request_id_is_refused():
    """A list as req_id raised a bare TypeError when the engine keyed its rows."""
    with pytest.raises(SpecError, match=r"DemoRequest.req_id=\[0\]: must be hashable"):
        DemoRequest(req_id=[0], prompt=[1], max_new_tokens=1)


@pytest.mark.parametrize("token, text", [(-2, "-2 would read another token's embedding"),
                                         (97, "97 is past the embedding table")])
def test_prompt_ids_outside_the_vocabulary_are_refused_when_added(parts, token, text):
    """-2 gave the logits of token 95 (silently); 97 an IndexError mid-run. Both are refused by add, nothing queued."""
    plan, _, model = parts
    engine = DemoEngine(plan, Step(plan), model)
    assert engine.vocab_size == 97  # read from the paged model
    with pytest.raises(SpecError, match=rf"request 'r'.prompt\[1\]={token}: token ids must be in \[0, "
                                        rf"vocab_size=97\); {text}; pass token ids of this model's vocabulary"):
        engine.add(DemoRequest(req_id="r", prompt=[1, token, 3], max_new_tokens=2))
    assert engine.done
    engine.run([DemoRequest(req_id="ok", prompt=[1, 96, 3], max_new_tokens=2)])
    assert len(engine.finished["ok"]) == 5


def test_a_negative_id_is_refused_even_without_a_vocabulary(parts):
    """An engine over a forward with no vocab_size still refuses negative ids (never a token)."""
    plan, _, model = parts
    engine = DemoEngine(plan, Step(plan), lambda input_ids: model(input_ids))
    assert engine.vocab_size is None
    with pytest.raises(SpecError, match=r"request 7.prompt\[0\]=-1: token ids must not be negative; -1 would read"):
        engine.add(DemoRequest(req_id=7, prompt=[-1], max_new_tokens=1))


def test_something_else_than_a_request_is_refused(parts):
    """A bare prompt list given to run() raised AttributeError; it names DemoRequest now."""
    plan, _, model = parts
    with pytest.raises(SpecError, match=r"requests\[0\]='list': must be a DemoRequest; wrap it: "
                                        r"DemoRequest\(req_id=\.\.\."):
        DemoEngine(plan, Step(plan), model).run([[1, 2, 3]])


def test_a_paged_model_needs_a_pool(parts):
    """A string as pool raised AttributeError; the model's vocabulary is its embedding's rows."""
    _, weights, model = parts
    with pytest.raises(SpecError, match=r"pool='str': must be a graphkv KVPool; allocate it from the model's plan"):
        PagedTinyHybrid(weights, "pool")
    assert model.vocab_size == 97


def test_a_request_id_in_use_is_refused(parts):
    """A second request with a waiting, running or finished request's id replaced the first one's row, tokens or
    result silently; it is refused now, naming where the id is, and nothing is queued."""
    plan, _, model = parts
    engine = DemoEngine(plan, Step(plan), model)
    engine.add(DemoRequest(req_id="a", prompt=[1, 2], max_new_tokens=3))
    with pytest.raises(SpecError, match=r"request.req_id='a': is waiting in this engine already; give every request"):
        engine.add(DemoRequest(req_id="a", prompt=[3], max_new_tokens=1))
    engine.step()  # "a" prefills: running
    with pytest.raises(SpecError, match=r"request.req_id='a': is running in this engine already"):
        engine.add(DemoRequest(req_id="a", prompt=[3], max_new_tokens=1))
    engine.run()
    assert len(engine.finished["a"]) == 5
    with pytest.raises(SpecError, match=r"request.req_id='a': is finished in this engine already; .*del "
                                        r"engine.finished\[id\]"):
        engine.run([DemoRequest(req_id="a", prompt=[3], max_new_tokens=1)])
    del engine.finished["a"]
    engine.run([DemoRequest(req_id="a", prompt=[3], max_new_tokens=1)])
    assert len(engine.finished["a"]) == 2


def test_run_adds_nothing_when_one_request_or_arrival_is_refused(parts):
    """run([ok, too_long]) raised but left "ok" queued (a later run generated it, and resubmitting it was refused as
    finished), and an arrival refused at its step dropped the good arrivals after it; now every request and arrival
    is checked first, an id given twice among them too, and a refused run leaves the engine empty."""
    from graphkv import CapacityError

    plan, _, model = parts
    engine = DemoEngine(plan, Step(plan), model)
    ok, too_long = DemoRequest(req_id="ok", prompt=[1, 2], max_new_tokens=2), \
        DemoRequest(req_id="big", prompt=[1] * 120, max_new_tokens=9)
    with pytest.raises(CapacityError, match=r"request 'big'=\(120, 9\): needs 1 <= prompt \+ max_new_tokens <= "
                                            r"max_model_len=128"):
        engine.run([ok, too_long])
    with pytest.raises(CapacityError, match="request 'big'"):
        engine.run([ok], arrivals={2: [too_long], 4: [DemoRequest(req_id="later", prompt=[3], max_new_tokens=1)]})
    with pytest.raises(SpecError, match=r"request.req_id='ok': is given twice in this run"):
        engine.run([ok], arrivals={1: [DemoRequest(req_id="ok", prompt=[3], max_new_tokens=1)]})
    assert engine.done and engine.stats.steps == 0 and not engine.finished
    engine.run([ok])
    assert list(engine.finished) == ["ok"] and len(engine.finished["ok"]) == 4


def test_arrivals_before_the_current_step_are_refused(parts):
    """An arrival keyed by a step already past was never added, and run() stepped on empty until max_steps; it is
    refused before anything is added."""
    plan, _, model = parts
    engine = DemoEngine(plan, Step(plan), model)
    engine.run([DemoRequest(req_id="a", prompt=[1, 2], max_new_tokens=2)])
    assert engine.stats.steps == 2
    late = DemoRequest(req_id="b", prompt=[1], max_new_tokens=1)
    with pytest.raises(SpecError, match=r"arrivals=\[1, '3'\]: keys must be step numbers \(ints\) in \[current "
                                        r"step 2, max_steps=100000\)"):
        engine.run([DemoRequest(req_id="c", prompt=[1], max_new_tokens=1)], arrivals={1: [late], "3": [late], 4: []})
    assert engine.done and "c" not in engine.finished


@pytest.mark.parametrize("kwargs, text", [
    (dict(requests=DemoRequest(req_id="x", prompt=[1], max_new_tokens=1)),
     r"requests='DemoRequest': must be a list of DemoRequest; pass a list, e.g. \[request\]"),
    (dict(requests=[1]), r"requests\[0\]='int': must be a DemoRequest"),
    (dict(max_steps=None), r"max_steps=None: must be an int >= 0"),
    (dict(max_steps="5"), r"max_steps='5': must be an int >= 0"),
    (dict(max_steps=1.5), r"max_steps=1.5: must be an int >= 0"),
    (dict(max_steps=-1), r"max_steps=-1: must be an int >= 0"),
    (dict(on_step=5), r"on_step='int': must be callable or None"),
    (dict(arrivals=[DemoRequest(req_id="x", prompt=[1], max_new_tokens=1)]),
     r"arrivals='list': must be a dict of step -> requests"),
    (dict(arrivals={0: DemoRequest(req_id="x", prompt=[1], max_new_tokens=1)}),
     r"arrivals\[0\]='DemoRequest': must be a list of DemoRequest"),
    (dict(arrivals={0: [None]}), r"arrivals\[0\]\[0\]='NoneType': must be a DemoRequest"),
    (dict(arrivals={10**9: []}), r"arrivals=\[1000000000\]: keys must be step numbers \(ints\) in \[current step 0, "
                                 r"max_steps=100000\)"),
    (dict(arrivals={5: []}, max_steps=5), r"arrivals=\[5\]: .*max_steps=5\)"),
])
def test_run_arguments_are_checked_before_anything_runs(parts, kwargs, text):
    """A lone request, None in the arrivals or a string max_steps raised a bare TypeError (on_step=5 only after the
    first step had run), max_steps=-1 and 1.5 were taken, and an arrival at step 10**9 spun through empty steps
    until max_steps: each is refused naming the argument, with nothing added or run."""
    plan, _, model = parts
    engine = DemoEngine(plan, Step(plan), model)
    with pytest.raises(SpecError, match=text):
        engine.run(**kwargs)
    assert engine.done and engine.stats.steps == 0
    stats = engine.run(None, arrivals={1: (DemoRequest(req_id="late", prompt=[1, 2], max_new_tokens=2),)},
                       max_steps=np.int64(10))
    assert stats.steps == 3 and len(engine.finished["late"]) == 4


def test_a_new_engine_over_a_step_with_live_requests_is_refused(parts):
    """An engine stopped by max_steps leaves its requests live in the step; a second engine over that step handed
    their pages out again and failed with "1 live request(s) hold it". It is refused naming the live requests; the
    first engine goes on, and once the step is empty a new engine works."""
    plan, _, model = parts
    step = Step(plan)
    first = DemoEngine(plan, step, model)
    with pytest.raises(graphkv.CapacityError, match="max_steps"):
        first.run([DemoRequest(req_id=0, prompt=[1, 2, 3], max_new_tokens=4)], max_steps=2)
    with pytest.raises(SpecError, match=r"step='1 live request\(s\): 0': a new engine starts from an empty step .*"
                                        r"keep using the engine that admitted them, or finish them first"):
        DemoEngine(plan, step, model)
    first.run()
    assert len(first.finished[0]) == 7
    second = DemoEngine(plan, step, model)
    second.run([DemoRequest(req_id=5, prompt=[4], max_new_tokens=2)])
    assert len(second.finished[5]) == 3


@pytest.mark.parametrize("stop, expected", [
    (None, frozenset()), (5, {5}), (np.int64(96), {96}), (torch.tensor(96), {96}), (torch.tensor([96, 23]), {96, 23}),
    ((3,), {3}), ({4, 5}, {4, 5}), (np.array([7, 8], dtype=np.int32), {7, 8}),
])
def test_stop_token_ids_take_any_integer_form(stop, expected):
    """None raised a TypeError; a tensor of ids was kept as tensors and never matched a token (the request never
    stopped). Every integer form becomes a frozenset of Python ints."""
    request = DemoRequest(req_id="r", prompt=[1], max_new_tokens=2, stop_token_ids=stop)
    assert request.stop_token_ids == frozenset(expected) and all(type(t) is int for t in request.stop_token_ids)


@pytest.mark.parametrize("stop, text", [
    (["98"], r"DemoRequest.stop_token_ids\[0\]='98': must be token ids >= 0"),
    ([98.0], r"DemoRequest.stop_token_ids\[0\]=98.0: must be token ids >= 0"),
    ([[5]], r"DemoRequest.stop_token_ids\[0\]=\[5\]: must be token ids >= 0"),
    ([2, -1], r"DemoRequest.stop_token_ids\[1\]=-1: must be token ids >= 0"),
    (True, r"DemoRequest.stop_token_ids=True: must be token ids >= 0"),
    ("2", r"DemoRequest.stop_token_ids='2': must be token ids >= 0: an int, or a list of ints; pass the "
          r"end-of-sequence ids of this model's tokenizer"),
])
def test_stop_token_ids_that_could_never_match_are_refused(stop, text):
    """A string id or a float was kept and silently never stopped the request; a nested list raised a TypeError."""
    with pytest.raises(SpecError, match=text):
        DemoRequest(req_id="r", prompt=[1], max_new_tokens=2, stop_token_ids=stop)
