"""graphkv.hf refuses token ids the model cannot embed and prompts of the wrong type naming where; numpy prompts run."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import graphkv
from graphkv import Budget, Limits, SpecError
from graphkv.hf import ServingLoop, generate, tiny_model
from graphkv.hf.attention import PagedStep
from graphkv.hf.declare import model_kv
from graphkv.hf.generation import default_limits, sliding_tables_for, workload_budget
from graphkv.runtime import Batch

from hf_harness import generate_alone

VOCAB = 128  # every tiny model's vocabulary
LOOP_LIMITS = Limits(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def loop(llama):
    return ServingLoop(llama, limits=LOOP_LIMITS, budget=Budget.kv_bytes(64 * 3 * 8192))


def _prefill(ids) -> Batch:
    return Batch(req_ids=("a", "b"), query_lens=(2, 2), seq_lens=(2, 2), new_pages=(((1,),), ((2,),)))


@pytest.mark.parametrize("bad, text", [(-1, "-1 would read another token's embedding"),
                                       (VOCAB, f"{VOCAB} is past the embedding table")])
@pytest.mark.parametrize("kind", ["list", "numpy", "tensor"])
def test_loop_run_refuses_ids_outside_the_vocabulary(loop, bad, text, kind) -> None:
    """input_ids[3] (request b, position 1) of -1 or 128 raised an IndexError from the embedding; now a SpecError
    naming it, and the step is untouched: the same batch with valid ids runs."""
    ids = [5, 6, 7, bad]
    given = {"list": ids, "numpy": np.array(ids), "tensor": torch.tensor(ids)}[kind]
    with pytest.raises(SpecError, match=rf"^input_ids\[3\] \(batch row 1, request 'b', position 1\)={bad}: token ids "
                                        rf"must be in \[0, vocab_size={VOCAB}\); {text}; pass token ids of this "
                                        r"model's vocabulary \(tokenize with its tokenizer\)$"):
        loop.run(_prefill(given), input_ids=given)
    assert loop.step.active_requests == ()
    logits = loop.run(_prefill(ids), input_ids=[5, 6, 7, VOCAB - 1])
    assert logits.shape[-1] == VOCAB and loop.step.active_requests == ("a", "b")
    loop.finish("a")
    loop.finish("b")


def test_loop_needs_a_transformers_model() -> None:
    """A model name instead of a model raised AttributeError ('str' has no parameters)."""
    with pytest.raises(SpecError, match=r"^model='str': is not a loaded transformers model"):
        ServingLoop("llama", limits=LOOP_LIMITS, budget=Budget.kv_bytes("1MiB"))


def test_numpy_prompts_run_like_lists(llama) -> None:
    """int64 / int32 arrays, a list of numpy ints, a 2-D array and a numpy max_new_tokens give the list's tokens."""
    want = generate_alone(llama, [3, 4, 5], 2)[3:]
    for prompts in ([np.array([3, 4, 5])], [np.array([3, 4, 5], dtype=np.int32)],
                    [[np.int64(3), np.int64(4), 5]], np.array([[3, 4, 5]]), torch.tensor([[3, 4, 5]])):
        assert generate(llama, prompts, max_new_tokens=np.int64(2)) == [want]


@pytest.mark.parametrize("prompts, text", [
    ([np.array([1.0, 2.0])], r"^prompts\[0\]='array of dtype float64, shape \(2,\)': token ids must be a 1-D integer "
                             r"array or a sequence of ints; pass e.g. np.array\(\[...\], dtype=np.int64\)"),
    ([np.array([True, False])], r"^prompts\[0\]='array of dtype bool, shape \(2,\)': token ids must be a 1-D integer"),
    ([torch.tensor([1.0, 2.0])], r"^prompts\[0\]='tensor of dtype torch.float32, shape \(2,\)': token ids must be a "
                                 r"1-D integer tensor"),
    ([torch.tensor([[1, 2]])], r"^prompts\[0\]='tensor of dtype torch.int64, shape \(1, 2\)'"),
    ([[1, 2], []], r"^prompts\[1\]=\[\]: is empty; a prompt needs at least one token id"),
    ([1, 2, 3], r"^prompts=\[1, 2, 3\]: is one prompt \(a list of token ids\); generate takes a list of prompts; "
                r"wrap it in a list: prompts=\[ids\]$"),
    (np.array([1, 2, 3]), r"^prompts='ndarray': must be a non-empty list of prompts \(token-id lists\), not one 1-D "
                          r"array; wrap one prompt in a list: prompts=\[ids\]$"),
    ([[1, -2, 3]], r"^prompts\[0\]\[1\]=-2: token ids must be in \[0, vocab_size=128\); -2 would read another "
                   r"token's embedding; pass token ids"),
    ([[4], [1, 2, 300]], r"^prompts\[1\]\[2\]=300: token ids must be in \[0, vocab_size=128\); 300 is past the "
                         r"embedding table; pass token ids"),
])
def test_prompts_of_the_wrong_type_or_vocabulary_are_refused(llama, prompts, text) -> None:
    """Float / bool arrays, 2-D tensors, an empty prompt, one bare prompt and ids outside the vocabulary name the
    prompt (and the token's position)."""
    with pytest.raises(SpecError, match=text):
        generate(llama, prompts, max_new_tokens=2)


@pytest.mark.parametrize("count, text", [(-1, r"max_new_tokens=-1: must be an integer >= 1; pass how many tokens"),
                                         (1.5, r"max_new_tokens=1.5: must be an integer >= 1 \(got float\)"),
                                         (2.0, r"max_new_tokens=2.0: must be an integer >= 1 \(got float\); pass how "
                                               r"many tokens to generate per prompt, e.g. 16 \(a Python int: 2\)")])
def test_max_new_tokens_must_be_a_whole_count(llama, count, text) -> None:
    """-1 and 1.5 are refused; 2.0 too, with the int to pass."""
    with pytest.raises(SpecError, match=text):
        generate(llama, [[1, 2]], max_new_tokens=count)


def test_limits_must_be_limits(llama) -> None:
    """A dict of limits raised AttributeError ('dict' has no num_blocks_override)."""
    with pytest.raises(SpecError, match=r"^limits='dict': must be graphkv.Limits or None; pass graphkv.Limits\("):
        generate(llama, [[1, 2]], max_new_tokens=2, limits={"max_model_len": 64})


@pytest.mark.parametrize("prompts, text", [
    (np.zeros((0, 3), dtype=np.int64), r"^prompts='array of shape \(0, 3\)': holds no prompt \(0 rows\); generate "
                                       r"needs at least one; pass one prompt per row"),
    (torch.zeros((0, 3), dtype=torch.int64), r"^prompts='array of shape \(0, 3\)': holds no prompt"),
    ([{5: 0}], r"^prompts\[0\]='dict': is unordered \(dict\), so its order is no order of token ids; pass token ids "
               r"as a list or tuple, in order$"),
    ([{5, 3}], r"^prompts\[0\]='set': is unordered \(set\)"),
])
def test_an_empty_batch_and_unordered_prompts_are_refused(llama, prompts, text) -> None:
    """A 0-row array raised "max() arg is an empty sequence"; a dict or set prompt had its order taken as tokens."""
    with pytest.raises(SpecError, match=text):
        generate(llama, prompts, max_new_tokens=2)


def test_max_new_tokens_beyond_the_model_is_named(llama) -> None:
    """10**9 new tokens blamed max_model_len=1000000002, a limit the caller never set; a too-long prompt is named."""
    cap = llama.config.max_position_embeddings
    with pytest.raises(SpecError, match=rf"^max_new_tokens=1000000000: with the longest prompt \(prompts\[1\], 3 "
                                        rf"tokens\) makes 1000000003 positions, beyond the model's "
                                        rf"max_position_embeddings={cap}; lower max_new_tokens to <= {cap - 3}$"):
        generate(llama, [[1, 2], [1, 2, 3]], max_new_tokens=10**9)
    with pytest.raises(SpecError, match=rf"^prompts\[0\]='{cap} tokens': leaves no position to generate in"):
        generate(llama, [[1] * cap], max_new_tokens=1)


@pytest.mark.parametrize("call, text", [
    (lambda kv: default_limits([], 4), r"^prompts='list': must be a non-empty list of prompts"),
    (lambda kv: default_limits([1, 2, 3], 4), r"^prompts=\[1, 2, 3\]: is one prompt"),
    (lambda kv: default_limits([[]], 4), r"^prompts\[0\]=\[\]: is empty"),
    (lambda kv: default_limits(["abc"], 4), r"^prompts\[0\]='abc': is text, not token ids"),
    (lambda kv: default_limits([[1, 2]], "4"), r"^max_new_tokens='4': must be an integer >= 1"),
    (lambda kv: default_limits([[1, 2]], 0), r"^max_new_tokens=0: must be an integer >= 1"),
    (lambda kv: default_limits([[1, 2]], -5), r"^max_new_tokens=-5: must be an integer >= 1"),
    (lambda kv: default_limits([[1, 2]], 4, "kv"), r"^model_kv='str': must be a graphkv ModelKV or None"),
    (lambda kv: sliding_tables_for(None, kv), r"^limits='NoneType': must be graphkv.Limits"),
    (lambda kv: sliding_tables_for(LOOP_LIMITS, None), r"^model_kv='NoneType': must be a graphkv ModelKV; pass "
                                                       r"graphkv.hf.model_kv\(model\)"),
    (lambda kv: workload_budget(kv, None), r"^limits='NoneType': must be graphkv.Limits"),
    (lambda kv: workload_budget({}, LOOP_LIMITS), r"^model_kv='dict': must be a graphkv ModelKV"),
])
def test_the_planning_helpers_check_their_arguments(llama, call, text) -> None:
    """default_limits([]) raised ValueError, ([1, 2, 3], 4) and a string count TypeError; [[]], ['abc'] and
    max_new_tokens=0 were taken and -5 was blamed on Limits.max_model_len=-3; sliding_tables_for and workload_budget
    raised AttributeError for None. Each names its argument now, as generate does."""
    with pytest.raises(SpecError, match=text):
        call(model_kv(llama))


@pytest.mark.parametrize("eos_of", [int, np.int64, torch.tensor, lambda t: torch.tensor([t, 200]), lambda t: [t, 200]],
                         ids=["int", "numpy", "0-d-tensor", "1-d-tensor", "list"])
def test_every_integer_form_of_the_eos_token_is_a_stop_token(llama, eos_of) -> None:
    """A numpy int, a tensor or a list of ids in generation_config.eos_token_id raised TypeError / RuntimeError
    (transformers' own generate takes them): each stops the request at that token, as the plain id does."""
    plain = generate(llama, [[1, 2]], max_new_tokens=6)
    stop_at = plain[0][2]  # the third token generated: the request ends there when it is the end-of-sequence id
    original = llama.generation_config.eos_token_id
    try:
        llama.generation_config.eos_token_id = eos_of(stop_at)
        got = generate(llama, [[1, 2]], max_new_tokens=6)
    finally:
        llama.generation_config.eos_token_id = original
    assert got == [plain[0][:plain[0].index(stop_at) + 1]] and len(got[0]) <= 3


def test_an_eos_token_that_could_never_match_is_refused_before_planning(llama) -> None:
    """A string or negative end-of-sequence id would never stop a request; it is refused naming the config field."""
    original = llama.generation_config.eos_token_id
    try:
        llama.generation_config.eos_token_id = [2, -1]
        with pytest.raises(SpecError, match=r"^model.generation_config.eos_token_id\[1\]=-1: must be token ids >= 0"):
            generate(llama, [[1, 2]], max_new_tokens=2)
    finally:
        llama.generation_config.eos_token_id = original


@pytest.mark.parametrize("prompts, text", [
    ([[1, 2], 3], r"^prompts\[1\]=3: is one integer, not a sequence of token ids; wrap it in a list: \[3\]$"),
    ([[2**70]], r"^prompts\[0\]=1180591620717411303424: token ids must fit int64 \(-2\*\*63 <= v < 2\*\*63\)"),
])
def test_a_bare_id_and_an_id_beyond_int64_are_named_for_what_they_are(llama, prompts, text) -> None:
    """[[1, 2], 3] was reported as prompts[1]='list' and 2**70 as "must be integers"."""
    with pytest.raises(SpecError, match=text):
        generate(llama, prompts, max_new_tokens=2)


def test_float64_weights_are_refused_with_the_cast_that_works() -> None:
    """A float64 model was told to fix config.dtype (a dtype name list); the cast to float32 is the fix."""
    model = tiny_model("llama").to(torch.float64)
    with pytest.raises(SpecError, match=r"^model='torch.float64': graphkv.hf runs float32, bfloat16 or float16 "
                                        r"weights .*model.to\(torch.float32\)$"):
        generate(model, [[1, 2]], max_new_tokens=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_a_cuda_index_without_cuda_says_cuda_is_unavailable(llama) -> None:
    """device=0 on a CPU build said "not a device torch knows"; an index names a CUDA device, which is not here."""
    with pytest.raises(SpecError, match=r"^device='cuda:0': CUDA is not available here"):
        generate(llama, [[1, 2]], max_new_tokens=2, device=0)


def test_a_config_that_disagrees_with_the_weights_is_named_before_the_first_step() -> None:
    """config.num_key_value_heads edited after loading: the first forward failed on the key's shape
    ("key=(3,2,16): must be ..."); the serving loop refuses it at set-up, naming k_proj and the config fields."""
    model = tiny_model("llama")
    model.config.num_key_value_heads = 1  # the weights project keys for 2 heads of 16
    with pytest.raises(graphkv.PlanError, match=r"^LlamaAttention \(layers.0\).k_proj.out_features=32: the plan "
                                                r"caches 1 KV heads x head size 16 = 16 per token"):
        generate(model, [[1, 2]], max_new_tokens=2)


@pytest.mark.parametrize(("model_type", "overrides", "text"), [
    ("gpt_neox", {"head_dim": 32},
     r"GPTNeoXAttention \(layers.0\).query_key_value.out_features=192: the plan caches 4 KV heads x head size 32 = "
     r"128 per token \(read from model.config\), the weights project keys of 4 heads x head size 16: gpt_neox sizes "
     r"them from hidden_size / num_attention_heads and ignores the config's head_dim=32, num_key_value_heads=None; "
     r"set model.config.head_dim=16 and model.config.num_key_value_heads=4"),
    ("gpt2", {"num_key_value_heads": 2},
     r"GPT2Attention \(layers.0\).c_attn.nf=192: the plan caches 2 KV heads x head size 16 = 32 per token \(read "
     r"from model.config\), the weights project keys of 4 heads x head size 16: gpt2 .* ignores the config's "
     r"head_dim=16, num_key_value_heads=2; set model.config.head_dim=16 and model.config.num_key_value_heads=4"),
    ("gpt_bigcode", {"num_key_value_heads": 4},
     r"GPTBigCodeAttention \(layers.0\).c_attn.out_features=96: the plan caches 4 KV heads x head size 16 = 64 per "
     r"token .* the weights project keys of 1 heads x head size 16: .* set model.config.head_dim=16 and "
     r"model.config.num_key_value_heads=1"),
    ("persimmon", {"num_key_value_heads": 2},
     r"PersimmonAttention \(layers.0\).query_key_value.out_features=192: the plan caches 2 KV heads .* "
     r"set model.config.head_dim=16 and model.config.num_key_value_heads=4"),
    ("ctrl", {"head_dim": 32},
     r"MultiHeadAttention \(layers.0\).Wk.out_features=64: the plan caches 4 KV heads x head size 32 = 128 per "
     r"token .* set model.config.head_dim=16 and model.config.num_key_value_heads=4"),
    ("opt", {"head_dim": 32},
     r"OPTAttention \(layers.0\).k_proj.out_features=64: the plan caches 4 KV heads x head size 32 = 128 per token "
     r".* set model.config.head_dim=16 and model.config.num_key_value_heads=4"),
])
def test_head_fields_a_multi_head_family_ignores_are_named_at_set_up(model_type, overrides, text) -> None:
    """A head_dim / num_key_value_heads the family's attention ignores (it sizes K from hidden_size /
    num_attention_heads) changed the plan only: the first step failed on the key's shape ("key=(3, 4, 16): must be
    [num_tokens, 4, 32]"); it is refused at set-up naming the projection, the config fields and the values that
    work, and with those values the model serves generate's tokens."""
    model = tiny_model(model_type, **overrides)
    with pytest.raises(graphkv.PlanError, match=rf"^{text} \(what the weights compute\), then plan from "
                                                r"graphkv.hf.model_kv\(model\)$"):
        generate(model, [[1, 2, 3]], max_new_tokens=2)
    fixed = re.search(r"head_dim=(\d+) and model.config.num_key_value_heads=(\d+)$", text)
    model.config.head_dim, model.config.num_key_value_heads = int(fixed.group(1)), int(fixed.group(2))
    assert [1, 2, 3] + generate(model, [[1, 2, 3]], max_new_tokens=2)[0] == generate_alone(model, [1, 2, 3], 2)


def test_a_prompt_beyond_the_callers_max_model_len_is_named_before_anything_is_built(llama) -> None:
    """With limits given, a too-long prompt failed in the engine as "request 1" after the pool and graphs were built;
    it is prompts[1], against limits.max_model_len, before planning."""
    limits = Limits(max_model_len=8, max_num_seqs=2, max_num_batched_tokens=16)
    with pytest.raises(graphkv.CapacityError, match=r"^prompts\[1\]='7 tokens': with max_new_tokens=2 needs 9 "
                                                    r"positions, more than limits.max_model_len=8; raise "
                                                    r"limits.max_model_len to >= 9, or shorten the prompt to <= 6"):
        generate(llama, [[1, 2], [1] * 7], max_new_tokens=2, limits=limits)
    assert generate(llama, [[1, 2], [1] * 6], max_new_tokens=2, limits=limits)[1] == \
        generate(llama, [[1] * 6], max_new_tokens=2)[0]


class _FakeStep(SimpleNamespace):
    """A step holding only its layers' bindings, with the real check (what the op and the eager path run)."""

    check_call = PagedStep.check_call


@pytest.mark.parametrize(("planned", "asked", "text"), [
    (None, 24, "the plan gives this layer full attention (read from model.config), the module asks for a 24-token"),
    (24, None, "the plan gives this layer a 24-token window (read from model.config), the module asks for full"),
    (24, 32, "the plan gives this layer a 24-token window (read from model.config), the module asks for a 32-token"),
])
def test_a_module_asking_for_another_window_than_planned_is_refused(planned, asked, text) -> None:
    """The plan reads a layer's window from the config; the module passes its own to the attention function. Where
    they differ (a family's window fields read wrongly) the step is refused naming the layer, not served with the
    wrong keys; a module asking for window 0 means full attention, as transformers reads it, and one asking for none
    (its window is in the mask it builds) was checked at set-up."""
    from types import SimpleNamespace

    from graphkv.errors import CaptureError
    from graphkv.hf.attention import paged_attention_forward

    module = SimpleNamespace(layer_idx=3)
    step = _FakeStep(attention={3: SimpleNamespace(window=planned, softcap=None, checks_window=True)})
    q = torch.zeros(1, 4, 2, 16)
    with pytest.raises(CaptureError, match=re.escape(f"layer 3.sliding_window={asked}: {text}")):
        paged_attention_forward(module, q, q, q, None, sliding_window=asked, graphkv=step)
    if planned is None:
        with pytest.raises(AttributeError):  # window 0 is full attention: past the check, into the (fake) step
            paged_attention_forward(module, q, q, q, None, sliding_window=0, graphkv=step)
    with pytest.raises(AttributeError):  # a family that slides through its mask alone (Qwen2-MoE) passes no window
        paged_attention_forward(module, q, q, q, None, graphkv=step)


def test_a_module_soft_capping_otherwise_than_set_up_is_refused() -> None:
    """The layer's soft-cap is read from the module at set-up; a module that passes another one (its config changed
    after) is refused naming both, not attended with the stale cap."""
    from types import SimpleNamespace

    from graphkv.errors import CaptureError
    from graphkv.hf.attention import paged_attention_forward

    module = SimpleNamespace(layer_idx=0)
    step = _FakeStep(attention={0: SimpleNamespace(window=None, softcap=50.0)})
    q = torch.zeros(1, 4, 2, 16)
    with pytest.raises(CaptureError, match=re.escape("layer 0.softcap=30.0: the module soft-caps its scores at 30.0, "
                                                     "the layer was set up with 50.0")):
        paged_attention_forward(module, q, q, q, None, softcap=30.0, graphkv=step)
    with pytest.raises(CaptureError, match=re.escape("layer 0.softcap=None")):
        paged_attention_forward(module, q, q, q, None, graphkv=step)


@pytest.mark.parametrize("kwargs, text", [
    ({"hidden_size": -4}, r"^overrides=\{'hidden_size': -4\}: transformers cannot build a qwen3 model of them "
                          r"\(RuntimeError: "),
    ({"seed": "x"}, r"^seed='x': must be an int >= 0"),
    ({"seed": True}, r"^seed=True: must be an int >= 0"),
    ({"vocab_size": 0}, r"^vocab_size=0: must be an int >= 2"),
])
def test_tiny_model_refuses_what_it_cannot_build(kwargs, text):
    """tiny_model's seed and overrides: a torch RuntimeError, a ValueError, a model of vocabulary 0 (accepted) and a
    config class's validation error (huggingface_hub's StrictDataclassClassValidationError, let through) became
    SpecErrors naming the argument."""
    from graphkv.errors import SpecError
    from graphkv.hf import tiny_model

    with pytest.raises(SpecError, match=text):
        tiny_model("qwen3", **kwargs)


def test_tiny_model_names_an_override_the_config_class_refuses():
    """num_attention_heads=3 with Llama's hidden size 64: its config class's validator raised huggingface_hub's
    StrictDataclassClassValidationError (not a ValueError), which tiny_model let through; a SpecError naming the
    override, with transformers' reason."""
    with pytest.raises(SpecError, match=r"^overrides=\{'num_attention_heads': 3\}: transformers cannot build a llama "
                                        r"config of them \(StrictDataclassClassValidationError: .*The hidden size "
                                        r"\(64\) is not a multiple of the number of attention heads \(3\)\.\); change "
                                        r"or drop the overrides \(tiny_config\('llama'\) lists the tiny config's "
                                        r"values\)$"):
        tiny_model("llama", num_attention_heads=3)


def test_capture_graphs_must_be_a_bool():
    """capture_graphs="no" is truthy and captured; it is refused naming the argument."""
    from graphkv import Budget, Limits
    from graphkv.errors import SpecError
    from graphkv.hf import ServingLoop, tiny_model

    with pytest.raises(SpecError, match=r"^capture_graphs='no': must be a bool"):
        ServingLoop(tiny_model("qwen3"), limits=Limits(max_model_len=64), budget=Budget.kv_bytes("1MiB"),
                    capture_graphs="no")
    with pytest.raises(SpecError, match=r"^progress=1: must be a bool; pass True or False$"):
        ServingLoop(tiny_model("qwen3"), limits=Limits(max_model_len=64), budget=Budget.kv_bytes("1MiB"), progress=1)


def test_progress_writes_what_capture_did_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """progress=True: each key's warm-up and capture (here rehearsal: the GPU path on a CPU), then what capture did,
    on stderr; False (the default): nothing."""
    from graphkv import Budget, Limits
    from graphkv.hf import ServingLoop, tiny_model

    limits = Limits(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16, max_cudagraph_capture_size=2)
    loop = ServingLoop(tiny_model("qwen3"), limits=limits, budget=Budget.kv_bytes("1MiB"), kernels="triton",
                       progress=True)
    err = capsys.readouterr().err
    assert "\rgraphkv: warming up 1/4 decode(num_tokens=2, num_reqs=2)" in err  # 2 decode and 2 mixed keys
    assert "\rgraphkv: rehearsing graph keys 4/4 " in err
    assert err.endswith(f"\rgraphkv: {loop.capture_report}".ljust(80) + "\n")
    ServingLoop(tiny_model("qwen3"), limits=limits, budget=Budget.kv_bytes("1MiB"), kernels="triton")
    assert "graphkv:" not in capsys.readouterr().err


def test_a_step_longer_than_the_plan_is_refused_before_the_compiled_forward(loop) -> None:
    """The compiled forward's guards may rely on the plan's largest step (size_guards drops 32-bit indexing bounds
    that hold there): a step of more tokens than max_num_batched_tokens (a Step of another plan) is refused naming
    the tokens and the limit."""
    with pytest.raises(SpecError, match=r"input_ids='65 tokens': the plan's max_num_batched_tokens=64"):
        loop.model(torch.zeros(65, dtype=torch.long))
