"""Every family graphkv.hf runs, served by continuous batching, equals transformers token for token.

Per family: 8 prompts of 3-70 tokens served 4 at a time under a 32-token step budget (the 70-token
prompt is prefilled in chunks, requests join while others decode, finished requests' pages are
handed out again). Every request's tokens equal ``model.generate(do_sample=False)`` for its prompt
alone, and the logits of every token of every step equal the model's own full-sequence forward.
"""

import pytest
import torch

from graphkv.hf.tiny import CORE_FAMILIES, TINY_CONFIGS, tiny_model
from graphkv.models.demo_engine import DemoEngine, DemoRequest

from transformers_types import skip_unless_known
from hf_harness import (NEW_TOKENS, PROMPT_LENGTHS, RecordingStep, prefill_chunks, generate_alone,
                        joined_while_others_decoded, own_logits, prompts, serving_loop)


LIGHT_LENGTHS = (5, 40, 70, 3, 33, 9)  # the families outside the core seven: 6 prompts, 4 new tokens each
LIGHT_NEW_TOKENS = 4


def serve(model, *, compile: bool | str = False, lengths=PROMPT_LENGTHS, new_tokens: int = NEW_TOKENS):  # noqa: A002
    """Serve the workload (``lengths``-token prompts, 4 first, the rest joining at steps 3 and 6) with logits of every
    token recorded; returns the engine and its batches."""
    loop = serving_loop(model, logits="all", compile=compile)
    step = RecordingStep(loop.step)
    engine = DemoEngine(loop.plan, step, loop.forward, record=True)
    requests = [DemoRequest(req_id=i, prompt=p, max_new_tokens=new_tokens) for i, p in enumerate(prompts(lengths))]
    engine.run(requests[:4], arrivals={3: requests[4:6], 6: requests[6:]})
    return engine, step.batches


def check_against_transformers(model, engine, batches, *, lengths=PROMPT_LENGTHS, new_tokens: int = NEW_TOKENS) -> None:
    """Tokens equal generate's, every recorded logits row equals the model's own forward."""
    long_prompt = lengths.index(max(lengths))
    chunks = prefill_chunks(batches, long_prompt, lengths[long_prompt])
    assert sum(chunks) == lengths[long_prompt] and len(chunks) >= 3  # 70 tokens under a 32-token budget
    assert joined_while_others_decoded(batches)
    assert engine.stats.pages_reused > 0 and engine.stats.finished == len(lengths)
    rows = {}
    for req, position, logits in engine.records:
        rows.setdefault(req, []).append((position, logits))
    for i, prompt in enumerate(prompts(lengths)):
        expected = generate_alone(model, prompt, new_tokens)
        assert engine.finished[i] == expected, f"request {i}"
        reference = own_logits(model, expected[:-1])
        positions = [p for p, _ in rows[i]]
        assert sorted(positions) == list(range(len(expected) - 1))  # every token of every step
        got = torch.stack([row for _, row in rows[i]])
        torch.testing.assert_close(got, reference[positions], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
def test_continuous_batching_equals_generate(model_type: str) -> None:
    """Continuous batching with chunked prefill gives generate's greedy tokens and the model's own logits."""
    skip_unless_known(model_type)  # a family newer than the installed transformers (a GPU machine's own)
    model = tiny_model(model_type)
    # the core seven (one of each structure) on the whole workload, the others on a lighter one (suite time)
    workload = {} if model_type in CORE_FAMILIES else {"lengths": LIGHT_LENGTHS, "new_tokens": LIGHT_NEW_TOKENS}
    engine, batches = serve(model, **workload)
    check_against_transformers(model, engine, batches, **workload)


@pytest.mark.slow
def test_compiled_attention_equals_generate() -> None:
    """The same run with the attention compiled (what a GPU runs) on Qwen3: tokens and logits unchanged."""
    model = tiny_model("qwen3")
    engine, batches = serve(model, compile=True)
    check_against_transformers(model, engine, batches)


@pytest.mark.slow
def test_compiled_forward_equals_generate() -> None:
    """The same run with the model's whole forward compiled (torch.compile, compiled flex inside) on Qwen3."""
    model = tiny_model("qwen3")
    engine, batches = serve(model, compile="model")
    check_against_transformers(model, engine, batches)


@pytest.mark.slow
def test_compiled_forward_with_sinks_equals_generate() -> None:
    """gpt-oss's forward compiled whole on a CPU, a mixed step first: its sinks need the log-sum-exp, so its flex
    regions run eagerly inside the compiled forward's attention op, where torch's first-call check of custom ops
    (a dispatch mode; eager flex's vmap cannot run in it) failed the step ("could not find kernel for
    custom_function_call"). Tokens and logits equal transformers'."""
    model = tiny_model("gpt_oss")
    engine, batches = serve(model, compile="model", lengths=LIGHT_LENGTHS, new_tokens=LIGHT_NEW_TOKENS)
    assert max(batches[0].query_lens) > 1  # the compiled forward's first call is a prefill (mixed) step
    check_against_transformers(model, engine, batches, lengths=LIGHT_LENGTHS, new_tokens=LIGHT_NEW_TOKENS)
