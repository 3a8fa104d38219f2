"""The backends a model plans on follow the GPU, as vLLM 0.33 picks them (graphkv.spec.hf.gpu_backends)."""

from __future__ import annotations

import pytest

import graphkv
from graphkv.errors import PlanError, SpecError
from graphkv.spec import Budget, Limits
from graphkv.spec.backends import CudaGraphSupport, MultipleOf
from graphkv.spec.budget import KNOWN_GPUS
from graphkv.spec.hf_config import model_from_hf_config
from graphkv.spec.limits import CudaGraphMode
from tests.preset_configs import preset_config

M16 = (MultipleOf(16),)


def _backends(model: graphkv.ModelKV) -> set[tuple[str, tuple, str]]:
    return {(x.backend.name, x.backend.supported_kernel_block_sizes, x.backend.cudagraph_support.name)
            for x in model.layers}


def _llama(**changes: object) -> dict:
    return preset_config("llama-3.1-8b", **changes)


@pytest.mark.parametrize(("gpu", "want"), [
    (None, ("flash_attn", M16, "ALWAYS")),  # FlashAttention 3, an H100 assumed
    ("H100", ("flash_attn", M16, "ALWAYS")),
    ("h200", ("flash_attn", M16, "ALWAYS")),  # any case
    ("sm_90", ("flash_attn", M16, "ALWAYS")),  # an architecture itself
    ("A100-80GB", ("flash_attn", M16, "UNIFORM_BATCH")),  # FlashAttention 2 captures uniform batches only
    ("L40S", ("flash_attn", M16, "UNIFORM_BATCH")),
    (KNOWN_GPUS["rtx4090"], ("flash_attn", M16, "UNIFORM_BATCH")),  # a GPU object
])
def test_attention_follows_the_gpu(gpu, want):
    assert _backends(model_from_hf_config(_llama(), gpu=gpu)) == {want}


def test_fp8_attention_below_hopper_runs_flashinfer():
    """FlashAttention 2 reads no fp8 cache: vLLM takes FlashInfer (16 / 32 / 64-token kernel blocks), whose
    FlashAttention-2 decode captures uniform batches; on an H100 FlashAttention 3 reads e4m3, and FlashInfer serves
    e5m2 (single-token decodes: the level it reports without its downloadable kernels)."""
    flashinfer = (16, 32, 64)
    assert _backends(model_from_hf_config(_llama(), kv_cache_dtype="fp8", gpu="A100-80GB")) == {
        ("flashinfer", flashinfer, "UNIFORM_BATCH")}
    assert _backends(model_from_hf_config(_llama(), kv_cache_dtype="fp8")) == {("flash_attn", M16, "ALWAYS")}
    assert _backends(model_from_hf_config(_llama(), kv_cache_dtype="fp8_e5m2")) == {
        ("flashinfer", flashinfer, "UNIFORM_SINGLE_TOKEN_DECODE")}
    assert _backends(model_from_hf_config(_llama(), kv_cache_dtype="fp8_e5m2", gpu="L40S")) == {
        ("flashinfer", flashinfer, "UNIFORM_BATCH")}


@pytest.mark.parametrize(("head", "dtype", "gpu", "want"), [
    (512, "fp8", "H100", ("flash_attn", (64,), "ALWAYS")),  # FlashAttention 4's fp8 kernel reads 64-token pages
    (512, None, "H100", ("flash_attn", M16, "ALWAYS")),  # FlashAttention 4
    (512, None, "A100-80GB", ("flashinfer", (16, 32, 64), "UNIFORM_BATCH")),  # FlashAttention 2 stops at 256
    (384, "fp8", "H100", ("triton_paged", M16, "ALWAYS")),  # FA4's fp8 kernel is for 512 only; FlashInfer has no 384
    (80, "fp8", "L40S", ("triton_paged", M16, "ALWAYS")),  # FlashInfer has no 80; Triton reads fp8 from sm_89
    (20, None, "H100", ("flex", M16, "ALWAYS")),  # FlashAttention wants multiples of 8, Triton 32 and wider
])
def test_head_sizes_pick_the_backend_vllm_runs(head, dtype, gpu, want):
    config = _llama(head_dim=head, num_attention_heads=8, hidden_size=8 * head)
    kwargs = {} if dtype is None else {"kv_cache_dtype": dtype}
    assert _backends(model_from_hf_config(config, gpu=gpu, **kwargs)) == {want}


def test_fp8_head_512_on_hopper_plans_64_token_pages():
    config = _llama(head_dim=512, num_attention_heads=8, hidden_size=4096)
    plan = graphkv.compile(model_from_hf_config(config, kv_cache_dtype="fp8"), Limits(), Budget.kv_bytes("4GiB"))
    assert (plan.block_size, plan.groups[0].kernel_block_size) == (64, 64)
    bf16 = graphkv.compile(model_from_hf_config(config), Limits(), Budget.kv_bytes("4GiB"))
    assert bf16.block_size == 16


def test_fp8_only_triton_reads_is_refused_on_an_a100():
    config = _llama(head_dim=80, num_attention_heads=8, hidden_size=640)
    with pytest.raises(SpecError) as err:
        model_from_hf_config(config, kv_cache_dtype="fp8", gpu="A100-40GB")
    (problem,) = err.value.problems
    assert problem.field == "kv_cache_dtype"
    assert problem.limit == ("neither FlashAttention nor FlashInfer serves 80-wide heads with an fp8 cache on sm_80, "
                             "and Triton reads an fp8 cache from sm_89 on; the plan is for A100-40GB (sm_80)")
    assert problem.fix == "use kv_cache_dtype='bfloat16', or plan for another GPU (--gpu / --arch)"


def test_float32_runs_triton_everywhere():
    """FlashAttention and FlashInfer run bf16 / fp16 models only; vLLM serves float32 with Triton."""
    for gpu in ("H100", "A100-80GB", "L40S"):
        assert _backends(model_from_hf_config(_llama(torch_dtype="float32"), gpu=gpu)) == {
            ("triton_paged", M16, "ALWAYS")}


def test_gpt_oss_sinks_run_triton_below_hopper():
    assert {x.backend.name for x in model_from_hf_config(preset_config("gpt-oss-20b")).layers} == {"flash_attn"}
    for gpu in ("A100-80GB", "L40S"):
        model = model_from_hf_config(preset_config("gpt-oss-20b"), gpu=gpu)
        assert _backends(model) == {("triton_paged", M16, "ALWAYS")}
    with pytest.raises(SpecError, match="kv_cache_dtype"):  # Triton's fp8 needs sm_89
        model_from_hf_config(preset_config("gpt-oss-20b"), gpu="A100-80GB", kv_cache_dtype="fp8")


def test_gemma4_with_two_head_widths_runs_triton_below_hopper():
    config = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "num_hidden_layers": 6,
              "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
              "num_global_key_value_heads": 2, "attention_k_eq_v": True, "hidden_size": 2304,
              "sliding_window": 512, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    assert _backends(model_from_hf_config(config, gpu="L40S")) == {("triton_paged", M16, "ALWAYS")}
    assert _backends(model_from_hf_config(config)) == {("flash_attn", M16, "ALWAYS")}  # FlashAttention 4, every layer
    one_width = {**config, "global_head_dim": 256}
    assert _backends(model_from_hf_config(one_width, gpu="L40S")) == {("flash_attn", M16, "UNIFORM_BATCH")}


@pytest.mark.parametrize(("gpu", "backend"), [(None, "flash_attn_mla"), ("A100-80GB", "triton_mla"),
                                              ("L40S", "triton_mla")])
def test_mla_follows_the_gpu(gpu, backend):
    """Neither FlashAttention's nor FlashMLA's MLA kernels run below Hopper: vLLM serves MLA with Triton there."""
    model = model_from_hf_config(preset_config("deepseek-v3"), gpu=gpu)
    assert {x.backend.name for x in model.layers} == {backend}
    assert graphkv.compile(model, Limits(), Budget.kv_bytes("20GiB")).num_blocks == 19099


def test_fp8_mla_below_hopper():
    """fp8 on an L40S: Triton MLA's 16-token pages, where an H100 plans FlashMLA's 64; an A100 is refused."""
    l40s = model_from_hf_config(preset_config("deepseek-v3"), kv_cache_dtype="fp8", gpu="L40S")
    assert {x.backend.name for x in l40s.layers} == {"triton_mla"}
    plan = graphkv.compile(l40s, Limits(), Budget.kv_bytes("20GiB"))
    assert (plan.block_size, plan.num_blocks) == (16, 38199)
    h100 = graphkv.compile(model_from_hf_config(preset_config("deepseek-v3"), kv_cache_dtype="fp8"), Limits(),
                           Budget.kv_bytes("20GiB"))
    assert (h100.block_size, h100.num_blocks) == (64, 9549)
    with pytest.raises(SpecError) as err:
        model_from_hf_config(preset_config("deepseek-v3"), kv_cache_dtype="fp8", gpu="A100-80GB")
    (problem,) = err.value.problems
    assert problem.field == "kv_cache_dtype" and "sm_80" in problem.limit and "bfloat16" in problem.fix


def test_indexed_mla_below_hopper_is_refused():
    """vLLM 0.33's sparse MLA backends all need an sm_90 GPU: below Hopper such a model cannot start."""
    config = preset_config("deepseek-v3", num_hidden_layers=4, layer_types=["indexed_attention"] * 4,
                           index_head_dim=128)
    for named in (None, "triton_mla"):
        with pytest.raises(SpecError) as err:
            model_from_hf_config(config, gpu="L40S", attention_backend=named)
        (problem,) = err.value.problems
        assert (problem.field, problem.value) == ("gpu", "L40S")
        assert "need an sm_90 GPU, and the plan is for L40S (sm_89)" in problem.limit
    assert {x.backend.name for x in model_from_hf_config(config).layers} == {"flashmla", "indexer"}


@pytest.mark.parametrize("named", ["flash_attn_mla", "flashmla"])
def test_a_hopper_only_mla_backend_named_below_hopper_is_refused(named):
    with pytest.raises(SpecError) as err:
        model_from_hf_config(preset_config("deepseek-v3"), gpu="A100-80GB", attention_backend=named)
    (problem,) = err.value.problems
    assert (problem.field, problem.value) == ("attention_backend", named)
    assert problem.limit.endswith("which need an sm_90 GPU, but the plan is for A100-80GB (sm_80)")
    assert "triton_mla" in problem.fix
    assert {x.backend.name for x in model_from_hf_config(preset_config("deepseek-v3"), attention_backend=named,
                                                         gpu="H100").layers} == {named}


def test_qwen_gated_delta_checkpoints_only_on_hopper():
    """FlashInfer's GDN prefill (sm_90) exports a checkpoint every 64 tokens; Triton's (sm_80 / sm_89) none, so an
    A100's align-mode plan keeps two state pages of 544 tokens, as vLLM does there."""
    limits = Limits(mamba_cache_mode="align", max_num_seqs=64)
    h100 = graphkv.compile(model_from_hf_config(preset_config("qwen3-next-80b-a3b")), limits, Budget.kv_bytes("20GiB"))
    a100 = graphkv.compile(model_from_hf_config(preset_config("qwen3-next-80b-a3b"), gpu="A100-80GB"), limits,
                           Budget.kv_bytes("20GiB"))
    assert (h100.block_size, h100.num_blocks) == (576, 1517)
    assert (a100.block_size, a100.num_blocks) == (544, 1606)


def test_a_named_backend_runs_as_it_does_on_that_gpu():
    for name in ("flash_attn", "flashinfer"):
        model = model_from_hf_config(_llama(), attention_backend=name, gpu="A100-80GB")
        assert {x.backend.cudagraph_support for x in model.layers} == {CudaGraphSupport.UNIFORM_BATCH}
    assert {x.backend.cudagraph_support for x in model_from_hf_config(_llama(), attention_backend="flex",
                                                                      gpu="A100-80GB").layers} == {
        CudaGraphSupport.ALWAYS}


def test_full_cudagraph_mode_downgrades_on_an_a100():
    """FlashAttention 2 cannot hold a mixed step in a graph: FULL becomes FULL_AND_PIECEWISE there, as in vLLM."""
    limits = Limits(cudagraph_mode="FULL")
    h100 = graphkv.compile(model_from_hf_config(_llama()), limits, Budget.kv_bytes("20GiB"))
    a100 = graphkv.compile(model_from_hf_config(_llama(), gpu="A100-80GB"), limits, Budget.kv_bytes("20GiB"))
    assert (h100.cudagraph.mode, a100.cudagraph.mode) == (CudaGraphMode.FULL, CudaGraphMode.FULL_AND_PIECEWISE)
    assert a100.cudagraph.limited_by == "group 0 (flash_attn)"


@pytest.mark.parametrize("gpu", ["B200", "", 3, KNOWN_GPUS["h100"].__class__(name="X1", total_memory_bytes=1)])
def test_an_unknown_gpu_is_refused_naming_the_known_ones(gpu):
    with pytest.raises(SpecError) as err:
        model_from_hf_config(_llama(), gpu=gpu)
    (problem,) = err.value.problems
    assert problem.field == "gpu" and "H100, H200, A100-80GB" in problem.limit and "sm_80, sm_89, sm_90" in problem.fix


def test_a_gpu_object_is_read_by_its_architecture():
    from graphkv.spec.budget import GPU

    assert model_from_hf_config(_llama(), gpu=GPU(name="X", total_memory_bytes=1, arch="SM_89")).notes[0].endswith(
        "on sm_89")
    with pytest.raises(SpecError) as err:
        model_from_hf_config(_llama(), gpu=GPU(name="B200", total_memory_bytes=1, arch="sm_100"))
    (problem,) = err.value.problems
    assert (problem.field, problem.value) == ("gpu", "B200")
    assert problem.limit.startswith("has architecture 'sm_100', not one graphkv plans for (sm_80, sm_89, sm_90)")


def test_the_notes_say_which_gpu_the_backends_are_for():
    assert model_from_hf_config(_llama(), gpu="L40S").notes[0].endswith("backends as vLLM 0.33 picks them on sm_89")
    assert model_from_hf_config(_llama()).notes[0].endswith("on sm_90 (assumed: no GPU named)")


def test_gemma4_fp8_on_hopper_needs_64_token_pages_and_says_so():
    """Its 512-wide full-attention heads read FlashAttention 4's 64-token fp8 pages, its 256-wide sliding heads
    FlashAttention 3's 16-token multiples. vLLM asks the FLASH_ATTN class for its sizes once, for the model's head size
    (256), picks 16 and fails on the 512-wide layers: graphkv refuses the same page size, naming 64, which plans."""
    config = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "num_hidden_layers": 6,
              "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
              "num_global_key_value_heads": 2, "attention_k_eq_v": True, "hidden_size": 2304,
              "sliding_window": 512, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    model = model_from_hf_config(config, kv_cache_dtype="fp8")
    assert _backends(model) == {("flash_attn", M16, "ALWAYS"), ("flash_attn", (64,), "ALWAYS")}
    with pytest.raises(PlanError) as err:
        graphkv.compile(model, Limits(), Budget.kv_bytes("4GiB"))
    (problem,) = err.value.problems
    assert (problem.field, problem.value) == ("block_size", 16)
    assert problem.limit == ("group 5 (the page size vLLM picks: no block_size given): no kernel block size is "
                             "supported by all of flash_attn [64] and divides 16")
    assert problem.fix.startswith("set block_size=64 (every backend of the group takes it; vLLM needs --block-size "
                                  "64 too)")
    plan = graphkv.compile(model, Limits(block_size=64), Budget.kv_bytes("4GiB"))
    assert plan.block_size == 64 and {g.kernel_block_size for g in plan.groups} == {64}


@pytest.mark.parametrize(("named", "gpu", "dtype", "head", "why"), [
    ("flash_attn", "A100-80GB", "fp8", 128, "FlashAttention 2 (sm_80 / sm_89) reads no fp8 cache"),
    ("flash_attn", "L40S", None, 512, "FlashAttention 2 (sm_80 / sm_89) takes heads up to 256, not 512"),
    ("flash_attn", "H100", "fp8_e5m2", 128, "FlashAttention reads no fp8_e5m2 cache"),
    ("flash_attn", "H100", "fp8", 384, "FlashAttention 3 / 4 (sm_90) reads an fp8 cache of heads up to 256 or of "
                                       "exactly 512, not 384"),
    ("flashinfer", "H100", None, 96, "FlashInfer takes heads of 64, 128, 256, 512, not 96"),
])
def test_a_named_backend_that_cannot_run_the_layer_is_refused(named, gpu, dtype, head, why):
    config = _llama(head_dim=head, num_attention_heads=8, hidden_size=8 * head)
    kwargs = {} if dtype is None else {"kv_cache_dtype": dtype}
    with pytest.raises(SpecError) as err:
        model_from_hf_config(config, attention_backend=named, gpu=gpu, **kwargs)
    (problem,) = err.value.problems
    assert (problem.field, problem.value) == ("attention_backend", named)
    assert problem.limit.startswith(why + "; the plan is for ") and problem.fix.startswith("leave attention_backend")


def test_a_named_flash_attn_keeps_fa4s_fp8_pages():
    config = _llama(head_dim=512, num_attention_heads=8, hidden_size=4096)
    named = model_from_hf_config(config, kv_cache_dtype="fp8", attention_backend="flash_attn")
    assert _backends(named) == {("flash_attn", (64,), "ALWAYS")}


@pytest.mark.parametrize(("gpu", "named", "dtype", "field"), [
    ("A100-80GB", "triton_mla", "fp8", "kv_cache_dtype"),  # Triton MLA's fp8 needs sm_89, however it was chosen
    ("L40S", None, "fp8_e5m2", "kv_cache_dtype"),  # no MLA backend reads e5m2
    ("H100", None, "fp8_e5m2", "kv_cache_dtype"),
    ("H100", "flash_attn_mla", "fp8", "kv_cache_dtype"),  # FlashAttention's MLA kernels read bf16 / fp16 only
])
def test_an_mla_cache_no_backend_reads_is_refused(gpu, named, dtype, field):
    with pytest.raises(SpecError) as err:
        model_from_hf_config(preset_config("deepseek-v3"), gpu=gpu, attention_backend=named, kv_cache_dtype=dtype)
    (problem,) = err.value.problems
    assert problem.field == field and "bfloat16" in problem.fix


def test_narrow_heads_with_fp8_or_sinks_have_no_backend():
    config = _llama(head_dim=20, num_attention_heads=8, hidden_size=160)  # not a multiple of 8: no FlashAttention
    assert _backends(model_from_hf_config(config)) == {("flex", M16, "ALWAYS")}
    with pytest.raises(SpecError, match="no vLLM 0.33 backend serves 20-wide heads with an fp8 cache"):
        model_from_hf_config(config, kv_cache_dtype="fp8")


def test_gpt_oss_fp8_on_an_a100_names_the_sinks():
    with pytest.raises(SpecError) as err:
        model_from_hf_config(preset_config("gpt-oss-20b"), gpu="A100-80GB", kv_cache_dtype="fp8")
    assert err.value.problems[0].limit.startswith("the attention sinks leave only Triton")


def test_a_budget_for_another_gpu_is_named_in_the_plan():
    """The model records its architecture (kept by shard); a plan whose budget is another GPU says so."""
    model = model_from_hf_config(_llama())
    assert model.gpu_arch is None  # an H100's assumed
    h100 = model_from_hf_config(_llama(), gpu="H100")
    assert (h100.gpu_arch, h100.shard(2, 1).gpu_arch) == ("sm_90", "sm_90")
    budget = Budget.for_gpu("A100-80GB", weights_bytes=16 << 30)
    (warning,) = [n for n in graphkv.compile(model, Limits(), budget).notes if n.startswith("WARNING")]
    assert warning.startswith("WARNING: the budget is for the A100-80GB (sm_80) but the model's backends are those "
                              "vLLM runs on sm_90 (no GPU was named when it was built): build it for that GPU "
                              "(ModelKV.from_hf_config(config, gpu='A100-80GB')")
    (named,) = [n for n in graphkv.compile(h100, Limits(), budget).notes if n.startswith("WARNING")]
    assert "vLLM runs on sm_90: build it" in named
    a100 = model_from_hf_config(_llama(), gpu="A100-80GB")
    assert not [n for n in graphkv.compile(a100, Limits(), budget).notes if n.startswith("WARNING")]
    flex = graphkv.ModelKV.from_specs("m", [(model.layers[0].spec, "flex")])  # the same on every GPU: no warning
    assert not [n for n in graphkv.compile(flex, Limits(), budget).notes if n.startswith("WARNING")]


def test_the_cublas_workspaces_follow_the_named_architecture():
    """PyTorch's cuBLAS workspace is 32 MiB per stream on sm_90 and 8 MiB + 128 KiB elsewhere."""
    def lazy(model):
        plan = graphkv.compile(model, Limits(), Budget.kv_bytes("20GiB"))
        (entry,) = [e for e in plan.ledger.entries if e.name == "lazy workspaces"]
        return entry.nbytes, entry.reason.split("(", 1)[1].split(")", 1)[0]
    assert lazy(model_from_hf_config(_llama())) == (68 << 20, "PyTorch's defaults on sm_90, assumed: no GPU named")
    assert lazy(model_from_hf_config(_llama(), gpu="sm_80")) == (44 << 20, "PyTorch's defaults on sm_80")


@pytest.mark.parametrize("bad", ["H100", 90, ""])
def test_gpu_arch_must_be_a_compute_capability(bad):
    layer = model_from_hf_config(_llama()).layers[0]
    with pytest.raises(SpecError, match="gpu_arch"):
        graphkv.ModelKV(name="m", layers=(layer,), gpu_arch=bad)
