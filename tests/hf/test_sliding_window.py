"""graphkv.hf plans a sliding window exactly where the transformers model slides, whatever its config names.

A family whose model ignores ``config.sliding_window`` (OLMo, GPT-2, LFM2, Llama, ...) attends to the whole context;
graphkv planned (and served) a window there — logits off by up to 0.8 past the window — or refused the model it had
planned itself; OLMoE's attention passes the window on (only transformers' flash-attention kernels apply it) and
was refused at its first step once graphkv planned full attention. Each family is checked against its own forward,
not against a list.
"""

import pytest
import torch

from graphkv import Budget
from graphkv.hf import ServingLoop, model_kv, tiny_model
from graphkv.hf.support import FAMILIES
from graphkv.runtime import Batch

from hf_harness import LIMITS, own_logits, prompts, serving_loop
from transformers_types import skip_unless_known

WINDOW = 8
NUM_TOKENS = 14  # past the window: a model that slides gives other logits from position 8 on
WIDE = 64  # a window wider than the tokens: the same logits as full attention


def _planned_windows(model) -> list:
    return [getattr(layer.spec, "window", None) for layer in model_kv(model).layers]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_the_planned_window_is_the_one_the_model_slides_over(model_type: str) -> None:
    """With sliding_window=8, model_kv plans an 8-token window on some layer exactly when the model's own logits past
    position 8 differ from those with a window wider than the tokens (the model slides), and full attention else; a
    14-token prefill served by graphkv equals the model's own logits."""
    skip_unless_known(model_type)
    narrow, wide = tiny_model(model_type, sliding_window=WINDOW), tiny_model(model_type, sliding_window=WIDE)
    [tokens] = prompts((NUM_TOKENS,))
    mine, theirs = own_logits(narrow, tokens), own_logits(wide, tokens)
    torch.testing.assert_close(mine[:WINDOW], theirs[:WINDOW])  # same weights (same seed), same first positions
    slides = not torch.allclose(mine[WINDOW:], theirs[WINDOW:], atol=1e-5, rtol=0)
    windows = _planned_windows(narrow)
    assert set(windows) <= {None, WINDOW}
    assert (WINDOW in windows) == slides, f"{model_type}: the model slides: {slides}, planned windows {windows}"
    loop = serving_loop(narrow, logits="all")  # and serves it so (a module asking for another window is refused)
    pages = tuple((i + 1,) for i in range(len(loop.plan.groups)))
    served = loop.run(Batch(req_ids=("a",), query_lens=(NUM_TOKENS,), seq_lens=(NUM_TOKENS,), new_pages=(pages,)),
                      input_ids=tokens)
    torch.testing.assert_close(served[:NUM_TOKENS], mine, atol=1e-4, rtol=1e-4)


def test_only_the_families_whose_model_slides_read_the_window_from_the_config() -> None:
    """window_from_config (every layer slides over config.sliding_window) holds for the families whose transformers
    model builds its sliding mask from that field (transformers 5.24), no others."""
    assert sorted(f for f, s in FAMILIES.items() if s.window_from_config) == [
        "ministral3", "mistral", "mixtral", "phi3", "phimoe", "starcoder2"]


def test_a_sliding_layer_type_the_model_does_not_act_on_is_planned_full() -> None:
    """A Llama config with layer_types naming a sliding layer (LlamaModel reads neither): full attention planned,
    where the reader refused the config for a missing sliding_window."""
    model = tiny_model("llama", sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])
    assert _planned_windows(model) == [None, None]


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "overrides", "kinds"), [
    ("olmo", {}, ["full_attention"]), ("gpt2", {}, ["full_attention"]),
    ("lfm2", {}, ["mamba", "mamba", "full_attention"]), ("mistral", {}, ["sliding_window"]),
    ("seed_oss", {"use_sliding_window": False}, ["full_attention"]),
])
def test_a_served_prefill_and_decode_equal_the_models_own_logits(model_type: str, overrides: dict,
                                                                 kinds: list) -> None:
    """With sliding_window=8, a 14-token prefill and 3 decode steps served by graphkv equal the model's own forward
    (OLMo, GPT-2 and Seed-OSS attend to everything, and were served sliding; LFM2 and Seed-OSS with
    use_sliding_window=False were refused; Mistral slides); the plan's groups are the model's."""
    model = tiny_model(model_type, sliding_window=WINDOW, **overrides)
    loop = ServingLoop(model, limits=LIMITS, budget=Budget.kv_bytes(64 * 3 * 8192), logits="all")
    assert [g.kind.value for g in loop.plan.groups] == kinds
    [tokens] = prompts((NUM_TOKENS,))
    pages = tuple((2 * i + 1,) if g.is_ssm else (2 * i + 1, 2 * i + 2) for i, g in enumerate(loop.plan.groups))
    logits = loop.run(Batch(req_ids=("a",), query_lens=(NUM_TOKENS,), seq_lens=(NUM_TOKENS,), new_pages=(pages,)),
                      input_ids=tokens)[:NUM_TOKENS]
    torch.testing.assert_close(logits, own_logits(model, tokens), atol=1e-4, rtol=1e-4)
    for _ in range(3):
        tokens.append(int(logits[-1].argmax()))
        logits = loop.run(Batch(req_ids=("a",), query_lens=(1,), seq_lens=(len(tokens),)), input_ids=tokens[-1:])[:1]
        torch.testing.assert_close(logits[0], own_logits(model, tokens)[-1], atol=1e-4, rtol=1e-4)
