"""graphkv.hf.generate: greedy tokens as transformers gives them, its defaults, end-of-sequence, bad input."""

import pytest
import torch

import graphkv
from graphkv import CapacityError, SpecError
from graphkv.hf import generate, tiny_model
from graphkv.hf.generation import default_limits, generate_with_stats

from hf_harness import LIMITS, NEW_TOKENS, generate_alone, prompts


def test_defaults_give_generates_tokens() -> None:
    """With no limits and no budget, generate() returns exactly the tokens model.generate appends."""
    model = tiny_model("llama")
    batch = prompts((7, 30, 1, 12))
    got = generate(model, batch, max_new_tokens=NEW_TOKENS)
    assert got == [generate_alone(model, p)[len(p):] for p in batch]


def test_recurrent_family_chunked_with_last_token_logits() -> None:
    """Nemotron-H through generate() (last-token logits) under a 32-token budget: generate's tokens, pages reused."""
    model = tiny_model("nemotron_h")
    batch = prompts()
    result = generate_with_stats(model, batch, max_new_tokens=NEW_TOKENS, limits=LIMITS)
    assert result.tokens == [generate_alone(model, p)[len(p):] for p in batch]
    assert result.stats.pages_reused > 0 and result.loop.model.logits == "last"
    assert len(result.first_token_seconds) == len(batch) and min(result.first_token_seconds) > 0


def test_a_request_ends_at_the_end_of_sequence_token() -> None:
    """A model whose generation_config names an EOS token stops there (kept), as model.generate does."""
    model = tiny_model("qwen3")
    batch = prompts((9, 20))
    eos = generate_alone(model, batch[0])[len(batch[0]) + 2]  # the third token prompt 0 generates
    model.generation_config.eos_token_id = eos
    got = generate(model, batch, max_new_tokens=NEW_TOKENS)
    assert got[0][-1] == eos and len(got[0]) <= 3
    assert got == [generate_alone(model, p)[len(p):] for p in batch]


def test_default_limits_fit_the_workload(monkeypatch) -> None:
    """Default limits: max_model_len is the longest prompt plus the new tokens, decode-only CUDA graphs."""
    monkeypatch.delenv("GRAPHKV_GPU_COMPILE", raising=False)  # the shipped GPU default
    limits = default_limits([[1] * 30, [2] * 5], 8)
    assert (limits.max_model_len, limits.max_num_seqs, limits.max_num_batched_tokens) == (38, 2, 256)
    assert limits.cudagraph_mode is graphkv.CudaGraphMode.FULL_DECODE_ONLY


@pytest.mark.parametrize("compile_mode, graph_mode", [(None, "FULL_DECODE_ONLY"), (True, "FULL_DECODE_ONLY"),
                                                      (False, "FULL_DECODE_ONLY"), ("model", "FULL_DECODE_ONLY"),
                                                      ("piecewise", "FULL_AND_PIECEWISE"),
                                                      ("fused", "FULL_AND_PIECEWISE")])
def test_default_limits_capture_mixed_steps_for_a_split_forward(compile_mode, graph_mode, monkeypatch) -> None:
    """A forward split at the attention ops ('piecewise', 'fused') is planned with PIECEWISE graphs for mixed steps
    as well; the others (None: the GPU default, compiled attention regions) with decode graphs only."""
    monkeypatch.delenv("GRAPHKV_GPU_COMPILE", raising=False)  # the shipped GPU default
    assert default_limits([[1] * 30], 8, compile=compile_mode).cudagraph_mode.value == graph_mode


def test_default_limits_follow_the_device_the_model_runs_on(monkeypatch) -> None:
    """With GRAPHKV_GPU_COMPILE=fused, compile=None plans PIECEWISE mixed graphs for a GPU (the model compiles
    'fused' there) and decode graphs only for a CPU (the model runs uncompiled there), so plan and model agree."""
    monkeypatch.setenv("GRAPHKV_GPU_COMPILE", "fused")
    modes = {d: default_limits([[1] * 30], 8, device_type=d).cudagraph_mode for d in ("cuda", "cpu")}
    assert modes == {"cuda": graphkv.CudaGraphMode.FULL_AND_PIECEWISE, "cpu": graphkv.CudaGraphMode.FULL_DECODE_ONLY}


@pytest.mark.parametrize("bad", [["fused"], "Fused", 1])
def test_default_limits_refuse_a_compile_mode_they_do_not_know(bad) -> None:
    """A list raised TypeError (unhashable) and 'Fused' planned decode graphs only, silently; both are refused,
    naming compile, as the serving loop refuses them."""
    with pytest.raises(graphkv.SpecError, match=r"compile=.*: must be True, False, None, 'model', 'piecewise' or "
                                                r"'fused'; True compiles each layer's attention"):
        default_limits([[1] * 30], 8, compile=bad)


@pytest.mark.parametrize("prompts_arg, max_new, field", [
    ([], 4, "prompts"),
    ("hello", 4, "prompts"),
    ([[]], 4, "prompts[0]"),
    ([[1, 2], "abc"], 4, "prompts[1]"),
    ([[1.5]], 4, "prompts[0]"),
    ([[True, 2]], 4, "prompts[0]"),
    ([[1, 128]], 4, "prompts[0][1]"),  # the token that is out of the vocabulary
    ([[-1]], 4, "prompts[0][0]"),
    ([[1]], 0, "max_new_tokens"),
    ([[1]], True, "max_new_tokens"),
])
def test_bad_arguments_are_one_line_errors(prompts_arg, max_new, field) -> None:
    """Empty, non-integer, boolean or out-of-vocabulary prompts and a bad max_new_tokens name the argument."""
    with pytest.raises(SpecError) as info:
        generate(tiny_model("llama"), prompts_arg, max_new_tokens=max_new)
    assert info.value.field == field and "\n" not in str(info.value)


def test_a_prompt_longer_than_max_model_len_is_refused() -> None:
    """A prompt plus max_new_tokens beyond limits.max_model_len is a CapacityError naming the prompt and the limit."""
    with pytest.raises(CapacityError, match=r"^prompts\[0\]='90 tokens': with max_new_tokens=8 needs 98 positions, "
                                            r"more than limits.max_model_len=96"):
        generate(tiny_model("llama"), [[1] * 90], max_new_tokens=8, limits=LIMITS)


def test_tensor_prompts_are_accepted() -> None:
    """A 1-D tensor of token ids is a prompt like a list."""
    model = tiny_model("llama")
    assert generate(model, [torch.tensor([3, 4, 5])], max_new_tokens=2) == [generate_alone(model, [3, 4, 5], 2)[3:]]


def test_a_sliding_window_family_serves_prompts_longer_than_its_window_tables() -> None:
    """Mistral (window 24) with a 200-token prompt: default limits widen the sliding tables; generate's tokens."""
    model = tiny_model("mistral")
    batch = prompts((200, 30))
    assert generate(model, batch, max_new_tokens=4) == [generate_alone(model, p, 4)[len(p):] for p in batch]


def test_limits_whose_sliding_tables_are_too_narrow_are_refused_up_front() -> None:
    """With a sliding table of 7 pages, a 200-token request is a CapacityError when added, naming the fix."""
    limits = graphkv.Limits(max_model_len=256, max_num_seqs=2, max_num_batched_tokens=32)
    with pytest.raises(CapacityError, match=r"needs 13 pages in group 0 \(sliding_window\).*max_concurrent_batches"):
        generate(tiny_model("mistral"), [[1] * 200], max_new_tokens=4, limits=limits)
