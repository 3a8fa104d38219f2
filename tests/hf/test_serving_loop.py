"""ServingLoop: the plan, the Step and the (captured) forward for a stack that schedules itself."""

import pytest
import torch

from graphkv import Budget, CudaGraphMode, Limits, PlanError, SpecError
from graphkv.errors import CaptureError
from graphkv.hf import PagedModel, ServingLoop, tiny_model
from graphkv.hf.attention import paged_attention_forward
from graphkv.hf.declare import CPU_FLEX_Q_TILE, model_dtype, model_kv
from graphkv.hf.generation import workload_budget
from graphkv.runtime import Batch, Step, allocate
from graphkv.runtime.capture.graphs import CPU_UNAVAILABLE, CapturedForward

from hf_harness import LIMITS, own_logits, prompts, serving_loop


def loop_for(model_type: str, model=None, **kwargs) -> ServingLoop:
    """A ServingLoop of ``model`` (default: a tiny model of ``model_type``) under the test limits."""
    model = model if model is not None else tiny_model(model_type)
    return ServingLoop(model, limits=LIMITS, budget=Budget.kv_bytes(64 * 3 * 8192), **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback (eager, said so)")
def test_loop_exposes_plan_step_and_an_eager_forward_on_a_cpu() -> None:
    """The plan is the model's (flex groups with the CPU query tile), the step a Step, the forward eager and said so."""
    loop = loop_for("gemma3_text")
    assert isinstance(loop.step, Step) and isinstance(loop.forward, CapturedForward)
    assert [g.kind.value for g in loop.plan.groups] == ["sliding_window", "sliding_window", "full_attention"]
    assert {d.backend.q_tile_tokens for d in loop.plan.layers} == {CPU_FLEX_Q_TILE}
    assert loop.graphs == CPU_UNAVAILABLE


def test_a_stack_runs_its_own_steps() -> None:
    """Prefill then decode through loop.run: each step's last-token logits equal the model's own forward."""
    model = tiny_model("qwen3_next")
    loop = loop_for("qwen3_next", model)
    a, b = prompts((6, 11))
    ids_ptr = loop.step.input_ids.data_ptr()
    logits = loop.run(Batch(req_ids=("a", "b"), query_lens=(6, 11), seq_lens=(6, 11), new_pages=(
        ((1,), (2,), (3,), (4,)), ((5,), (6,), (7,), (8,)))), input_ids=a + b)
    torch.testing.assert_close(logits[:2], torch.stack([own_logits(model, p)[-1] for p in (a, b)]),
                               atol=1e-4, rtol=1e-4)
    a.append(int(logits[0].argmax()))
    b.append(int(logits[1].argmax()))
    decode = loop.run(Batch(req_ids=("a", "b"), query_lens=(1, 1), seq_lens=(7, 12)), input_ids=[a[-1], b[-1]])
    torch.testing.assert_close(decode[:2], torch.stack([own_logits(model, p)[-1] for p in (a, b)]),
                               atol=1e-4, rtol=1e-4)
    assert loop.step.input_ids.data_ptr() == ids_ptr  # persistent input buffer
    loop.finish("a")
    assert loop.step.active_requests == ("b",)


def test_attention_outside_a_step_is_a_capture_error() -> None:
    """Calling graphkv's attention function, or a paged mixer of a view, without a step (no keyword, no PagedModel
    step running) names what to do."""
    with pytest.raises(CaptureError, match=r"no graphkv= argument, and no PagedModel step running.*run the model "
                                           r"through graphkv.hf.PagedModel"):
        paged_attention_forward(torch.nn.Module(), *[torch.zeros(1, 2, 3, 4)] * 3, None)
    from graphkv.hf.mixers import PagedGatedDeltaNet

    model = tiny_model("qwen3_next")
    mixer = next(m for m in serving_loop(model).model.view.modules() if isinstance(m, PagedGatedDeltaNet))
    with pytest.raises(CaptureError, match=r"a paged mixer ran without a step \(no graphkv= argument, and no "
                                           r"PagedModel step running\)"):
        mixer(torch.zeros(1, 3, model.config.hidden_size))


def test_a_pool_of_another_model_is_refused() -> None:
    """A PagedModel over a pool planned for a different family names the layer that does not match."""
    other = loop_for("nemotron_h").pool
    with pytest.raises(PlanError, match="has no state module with layer_idx=0"):
        PagedModel(tiny_model("llama"), other)


def test_compiled_sinks_on_a_cpu_run_their_regions_eagerly() -> None:
    """gpt-oss's sinks need the flex log-sum-exp, which compiled CPU flex lacks: under compile=True and
    compile='model' the sink layers' regions run eager flex on a CPU (nothing is refused)."""
    model = tiny_model("gpt_oss")
    loop = loop_for("gpt_oss", compile=True)
    loop.run(Batch(req_ids=("a",), query_lens=(3,), seq_lens=(3,), new_pages=(((1,), (2,)),)), input_ids=[1, 2, 3])
    regions = loop.model.regions
    assert regions.compile and regions.num_regions == 2 and not any(r.compiled for r in regions._regions.values())
    assert PagedModel(model, loop.pool, compile="model").regions.compile


def test_an_unknown_compile_mode_is_refused() -> None:
    """compile takes True, False, None, 'model', 'piecewise' or 'fused': anything else is a one-line SpecError naming it."""
    loop = loop_for("llama")
    with pytest.raises(SpecError, match="compile='graph': must be True, False, None, 'model', 'piecewise' or 'fused'"):
        PagedModel(tiny_model("llama"), loop.pool, compile="graph")


def test_bad_logits_mode_and_mixed_dtypes_are_refused() -> None:
    """logits must be 'last' or 'all'; a model with two weight dtypes is refused, naming them."""
    loop = loop_for("llama")
    with pytest.raises(SpecError, match="logits='every'"):
        PagedModel(tiny_model("llama"), loop.pool, logits="every")
    model = tiny_model("llama")
    model.lm_head.to(torch.float64)
    with pytest.raises(SpecError, match="one floating dtype"):
        model_dtype(model)


def test_pool_dtype_follows_the_weights() -> None:
    """A bfloat16 model gets a bfloat16 cache (the reader is told the weights' dtype)."""
    model = tiny_model("llama").to(torch.bfloat16)
    loop = ServingLoop(model, limits=LIMITS, budget=Budget.kv_bytes("1MiB"))
    assert loop.pool.kv_cache("layers.0").dtype == torch.bfloat16
    assert allocate(loop.plan).kv_cache("layers.1").dtype == torch.bfloat16


def test_bidirectional_attention_is_refused() -> None:
    """A Gemma-3 configured to attend both ways (an embedding model) is refused: causal masks would be wrong."""
    model = tiny_model("gemma3_text", use_bidirectional_attention=True)
    with pytest.raises(SpecError, match=r"Gemma3Attention \(layers.0\).is_causal=False"):
        ServingLoop(model, limits=LIMITS, budget=Budget.kv_bytes("1MiB"))


def test_a_pool_missing_some_of_the_models_layers_is_refused() -> None:
    """A pool planned for a 2-layer Llama cannot serve a 3-layer one: the unplanned layer is named."""
    pool = loop_for("llama").pool
    with pytest.raises(PlanError, match=r"has no cache layer for the model's layers \[2\]"):
        PagedModel(tiny_model("llama", num_hidden_layers=3), pool)


def test_a_pool_beyond_the_machine_is_refused_before_allocating() -> None:
    """A budget larger than the machine's memory is a one-line SpecError naming the budget, not an allocator crash."""
    model = tiny_model("llama")
    limits = Limits(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32)
    with pytest.raises(SpecError, match=r"^budget=.*only .* is available") as info:
        ServingLoop(model, limits=limits, budget=Budget.kv_bytes("10TiB"))  # 100TiB: more pages than int32 ids
    assert "\n" not in str(info.value)


def test_a_speculative_decode_step_on_its_graph_key_gives_one_row_per_request() -> None:
    """A verification step of 4 requests x (1 + 3) tokens replays (rehearses, on a CPU) the decode key of 16 tokens
    and 4 requests: the forward's last-token logits are one row per request (the key's 4, not min(16 tokens,
    max_num_seqs=8), which the captured run refused), each equal to the model's own forward."""
    limits = Limits(max_model_len=96, max_num_seqs=8, max_num_batched_tokens=32, num_speculative_tokens=3,
                    cudagraph_mode=CudaGraphMode.FULL_DECODE_ONLY)
    model = tiny_model("qwen3")
    loop = ServingLoop(model, limits=limits, budget=workload_budget(model_kv(model), limits), kernels="triton")
    assert (16, 4) in [(k.num_tokens, k.num_reqs) for k in loop.capture_report.keys]
    ids, drafts = prompts((5, 7, 3, 6)), prompts((4, 4, 4, 4), seed=3)
    loop.run(Batch(req_ids=tuple("abcd"), query_lens=(5, 7, 3, 6), seq_lens=(5, 7, 3, 6),
                   new_pages=(((1,),), ((2,),), ((3,),), ((4,),))), input_ids=sum(ids, []))
    logits = loop.run(Batch(req_ids=tuple("abcd"), query_lens=(4,) * 4, seq_lens=(9, 11, 7, 10)),
                      input_ids=sum(drafts, []))
    assert logits.shape == (4, model.config.vocab_size)
    torch.testing.assert_close(logits, torch.stack([own_logits(model, p + d)[-1] for p, d in zip(ids, drafts)]),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_speculative_decode_keys_share_one_trace_down_to_one_request() -> None:
    """Under compile="piecewise" the decode keys of 8, 4, 2 and 1 requests x (1 + 3) tokens (the 1-request key
    keeps one logits row, a size Dynamo specialises) all run the forward's one trace, rehearsed at construction and
    then served: verification steps of 2 and 1 requests and a plain 1-token decode add no trace."""
    limits = Limits(max_model_len=96, max_num_seqs=8, max_num_batched_tokens=32, num_speculative_tokens=3,
                    cudagraph_mode=CudaGraphMode.FULL_DECODE_ONLY)
    model = tiny_model("qwen3")
    loop = ServingLoop(model, limits=limits, budget=workload_budget(model_kv(model), limits), kernels="triton",
                       compile="piecewise")
    assert [(k.num_tokens, k.num_reqs) for k in loop.capture_report.keys] == [(32, 8), (16, 4), (8, 2), (4, 1)]
    assert len(loop.model.piecewise.splits) == 1  # the rehearsal ran every key
    ids = prompts((5, 7), seed=1)
    loop.run(Batch(req_ids=("a", "b"), query_lens=(5, 7), seq_lens=(5, 7), new_pages=(((1,),), ((2,),))),
             input_ids=sum(ids, []))
    drafts = prompts((4, 4, 4), seed=2)
    logits = loop.run(Batch(req_ids=("a", "b"), query_lens=(4, 4), seq_lens=(9, 11)), input_ids=drafts[0] + drafts[1])
    assert logits.shape == (2, model.config.vocab_size)
    logits = loop.run(Batch(req_ids=("a",), query_lens=(4,), seq_lens=(13,)), input_ids=drafts[2])
    assert logits.shape == (1, model.config.vocab_size)
    torch.testing.assert_close(logits[0], own_logits(model, ids[0] + drafts[0] + drafts[2])[-1], atol=1e-4,
                               rtol=1e-4)
    logits = loop.run(Batch(req_ids=("a",), query_lens=(1,), seq_lens=(14,)), input_ids=[7])
    assert logits.shape == (1, model.config.vocab_size)
    assert len(loop.model.piecewise.splits) == 1


def test_limits_that_are_not_limits_are_refused() -> None:
    """limits=None was planned with the default Limits() (256 sequences) without a word: refused naming limits."""
    with pytest.raises(SpecError, match=r"^limits='NoneType': must be a graphkv.Limits; pass e.g."):
        ServingLoop(tiny_model("qwen3"), limits=None, budget=Budget.kv_bytes(64 * 3 * 8192))


def test_finishing_an_engines_request_behind_it_is_refused_and_abort_stops_it() -> None:
    """loop.finish(id) of a request the loop's engine runs left the engine holding its pages and every later step
    failed ("0 page(s) held"); it is refused naming engine.abort, which stops it while the other request goes on."""
    from graphkv.models.demo_engine import DemoRequest

    model = tiny_model("qwen3")
    loop = loop_for("qwen3", model)
    a, b = prompts((6, 11))
    engine = loop.engine()
    engine.add(DemoRequest(req_id="a", prompt=a, max_new_tokens=6))
    engine.add(DemoRequest(req_id="b", prompt=b, max_new_tokens=6))
    engine.step()
    engine.step()
    with pytest.raises(SpecError, match=r"req_id='a': is a request of this loop's engine .*engine.abort\('a'\)"):
        loop.finish("a")
    assert engine.abort("a")[:6] == a
    engine.run()
    want = model.generate(torch.tensor([b]), max_new_tokens=6, do_sample=False)[0].tolist()
    assert engine.finished == {"b": want} and loop.step.active_requests == ()
