"""model_from_hf_config: per-architecture layer kinds, per-rank state shapes, dtypes, backends, errors."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

import graphkv
from graphkv import Budget, Limits
from graphkv.errors import SpecError
from graphkv.spec import DType, LayerKind, MLASpec, ModelKV, SlidingWindowSpec
from graphkv.spec.hf_config import model_from_hf_config

from preset_configs import JUNK as _JUNK, preset_config as _cfg, state_of as _state


def _kinds(model: ModelKV) -> str:
    """One letter per declared layer: F full, S sliding, M Mamba-style state, L MLA."""
    letters = {LayerKind.FULL_ATTENTION: "F", LayerKind.SLIDING_WINDOW: "S", LayerKind.MAMBA: "M", LayerKind.MLA: "L"}
    return "".join(letters[layer.spec.kind] for layer in model.layers)


def _attention(model: ModelKV) -> Any:
    return next(layer.spec for layer in model.layers if not layer.spec.is_ssm)


# --- Llama-style ---------------------------------------------------------------------------


def test_llama_3_1_8b_every_layer_is_full_attention_8x128_bf16():
    """Llama-3.1-8B: 32 full-attention layers of 8 KV heads x 128 (head_dim derived 4096 / 32)."""
    model = model_from_hf_config(_cfg("llama-3.1-8b"))
    assert _kinds(model) == "F" * 32
    spec = model.layers[0].spec
    assert (spec.num_kv_heads, spec.head_size, spec.dtype) == (8, 128, DType.BFLOAT16)
    # 16 tokens * 8 heads * (128 + 128) * 2 bytes = 65536
    assert spec.page_size_bytes(16) == 65536
    assert model.layers[0].backend.name == "flash_attn"
    assert (model.max_position_embeddings, model.hidden_size, model.tensor_parallel_size) == (131072, 4096, 1)


@pytest.mark.parametrize(("tp", "kv_heads_per_rank"), [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1), (32, 1)])
def test_llama_kv_heads_split_over_tp_and_replicate_beyond(tp, kv_heads_per_rank):
    """KV heads per rank are 8 // tp, and 1 (replicated) once tp exceeds the 8 KV heads."""
    model = model_from_hf_config(_cfg("llama-3.1-8b"), tp=tp)
    assert model.layers[0].spec.num_kv_heads == kv_heads_per_rank
    assert model.tensor_parallel_size == tp


def test_missing_num_key_value_heads_defaults_to_num_attention_heads():
    """Without num_key_value_heads every attention head has its own KV head (MHA)."""
    model = model_from_hf_config(_cfg("llama-3.1-8b", num_key_value_heads=None))
    assert model.layers[0].spec.num_kv_heads == 32


def test_mistral_sliding_window_applies_to_every_layer():
    """A Mistral config with sliding_window set makes every layer a 4096-token sliding window."""
    config = _cfg("llama-3.1-8b", architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=4096)
    model = model_from_hf_config(config)
    assert _kinds(model) == "S" * 32
    assert isinstance(model.layers[0].spec, SlidingWindowSpec) and model.layers[0].spec.window == 4096


def test_mistral_null_sliding_window_is_full_attention():
    """sliding_window: null (Mistral v0.2+) means full attention."""
    config = _cfg("llama-3.1-8b", architectures=["MistralForCausalLM"], model_type="mistral")
    config["sliding_window"] = None
    assert _kinds(model_from_hf_config(config)) == "F" * 32


def test_qwen2_sliding_window_needs_use_sliding_window():
    """Qwen2 ships sliding_window with use_sliding_window=false: every layer stays full attention."""
    config = _cfg("llama-3.1-8b", architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                  sliding_window=32768, use_sliding_window=False)
    assert _kinds(model_from_hf_config(config)) == "F" * 32


@pytest.mark.parametrize(("model_type", "fields"), [
    ("qwen2", {"max_window_layers": 28}),  # a Qwen2 config.json without the switch
    ("qwen3", {}),  # neither the switch nor max_window_layers: the family's config has the switch, off
    ("smollm3", {}),
    ("custom", {"max_window_layers": 28}),  # an unknown type: only Qwen-style configs write max_window_layers
])
def test_sliding_window_without_use_sliding_window_is_off_where_transformers_reads_it_off(model_type, fields):
    """transformers' Qwen2 / Qwen3 / SmolLM3 configs default use_sliding_window to false and drop sliding_window
    then (vLLM reads the config through them): a config.json that leaves the switch out plans every layer full.
    Planned with 7 of 28 layers sliding before, 1,281 pages per request for them instead of 2,048."""
    config = _cfg("llama-3.1-8b", architectures=["Qwen2ForCausalLM"], model_type=model_type, sliding_window=4096,
                  **fields)
    assert _kinds(model_from_hf_config(config)) == "F" * 32
    config["use_sliding_window"] = True
    assert _kinds(model_from_hf_config(config)) == ("F" * 28 + "S" * 4 if fields else "S" * 32)


def test_sliding_window_alone_slides_every_layer_in_families_without_the_switch():
    """Mistral's configs write sliding_window alone (no switch in its transformers config): every layer slides."""
    config = _cfg("llama-3.1-8b", architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=4096)
    assert _kinds(model_from_hf_config(config)) == "S" * 32


def test_qwen2_layers_from_max_window_layers_slide():
    """With use_sliding_window, layers i >= max_window_layers slide (the transformers Qwen2 rule)."""
    config = _cfg("llama-3.1-8b", architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                  sliding_window=4096, use_sliding_window=True, max_window_layers=28)
    assert _kinds(model_from_hf_config(config)) == "F" * 28 + "S" * 4


def test_qwen3_explicit_head_dim_wins_over_hidden_size_division():
    """head_dim in the config is used even when it differs from hidden_size / num_attention_heads."""
    config = _cfg("llama-3.1-8b", architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                  hidden_size=5120, num_attention_heads=64, num_key_value_heads=8, head_dim=128)
    assert model_from_hf_config(config).layers[0].spec.head_size == 128  # not 5120 / 64 = 80


def test_model_type_is_used_when_architectures_is_absent():
    """A config without architectures is dispatched on model_type."""
    model = model_from_hf_config(_cfg("llama-3.1-8b", architectures=None))
    assert len(model.layers) == 32


def test_name_comes_from_argument_then_name_or_path_then_model_type():
    """The model is named by name=, else _name_or_path, else model_type."""
    config = _cfg("llama-3.1-8b")
    assert model_from_hf_config(config).name == "llama"
    repo = "meta-llama/Llama-3.1-8B"
    assert model_from_hf_config({**config, "_name_or_path": repo}).name == repo
    assert model_from_hf_config(config, name="mine").name == "mine"


def test_from_hf_config_classmethod_delegates_with_overrides():
    """ModelKV.from_hf_config gives the same model as model_from_hf_config, overrides included."""
    config = _cfg("llama-3.1-8b")
    assert ModelKV.from_hf_config(config, tp=2, kv_cache_dtype="fp8") == model_from_hf_config(
        config, tp=2, kv_cache_dtype="fp8")


def test_pretrained_config_like_object_is_read_through_to_dict():
    """An object with to_dict() (a transformers PretrainedConfig) is accepted."""

    class FakePretrainedConfig:
        def to_dict(self) -> dict[str, Any]:
            return _cfg("llama-3.1-8b")

    assert len(model_from_hf_config(FakePretrainedConfig()).layers) == 32


# --- Qwen3-Next ----------------------------------------------------------------------------


def test_qwen3_next_every_fourth_layer_is_full_attention():
    """Qwen3-Next-80B: layers 3, 7, ..., 47 are full attention (12), the other 36 gated-delta."""
    model = model_from_hf_config(_cfg("qwen3-next-80b-a3b"))
    assert _kinds(model) == "MMMF" * 12
    assert [layer.index for layer in model.layers if not layer.spec.is_ssm] == list(range(3, 48, 4))
    assert {layer.backend.name for layer in model.layers if layer.spec.is_ssm} == {"gdn"}


def test_qwen3_next_tp1_state_shapes_and_page_bytes():
    """Qwen3-Next-80B at tp=1: conv (3, 8192), recurrent (32, 128, 128), all bf16."""
    model = model_from_hf_config(_cfg("qwen3-next-80b-a3b"))
    state = _state(model)
    # conv_dim = 2 * 16 key heads * 128 + 32 value heads * 128 = 4096 + 4096 = 8192; kernel 4 - 1 = 3
    assert state.shapes == ((3, 8192), (32, 128, 128))
    assert state.dtypes == (DType.BFLOAT16, DType.BFLOAT16)
    assert (state.variant, state.chunk_size) == ("gated_delta", 64)
    # conv 3 * 8192 * 2 = 49152; recurrent 32 * 128 * 128 * 2 = 1048576; sum 1097728
    assert state.state_bytes() == (49152, 1048576)
    assert state.page_size_bytes() == 1097728
    attention = _attention(model)
    assert (attention.num_kv_heads, attention.head_size) == (2, 256)
    # 16 tokens * 2 heads * (256 + 256) * 2 bytes = 32768
    assert attention.page_size_bytes(16) == 32768


@pytest.mark.parametrize(("tp", "conv", "recurrent", "kv_heads"), [
    (2, (3, 4096), (16, 128, 128), 1),  # (2*16*128 + 32*128) / 2 = 4096; 2 KV heads / 2
    (4, (3, 2048), (8, 128, 128), 1),  # 8192 / 4; 2 KV heads < tp=4: one replicated head
    (16, (3, 512), (2, 128, 128), 1),  # 8192 / 16
])
def test_qwen3_next_states_shard_over_tp(tp, conv, recurrent, kv_heads):
    """Gated-delta channels and value heads are divided by tp; KV heads split then replicate."""
    model = model_from_hf_config(_cfg("qwen3-next-80b-a3b"), tp=tp)
    assert _state(model).shapes == (conv, recurrent)
    assert _attention(model).num_kv_heads == kv_heads


def test_qwen3_next_mamba_ssm_cache_dtype_float32_gives_float32_recurrent_state():
    """mamba_ssm_cache_dtype: float32 in the config makes the recurrent state float32; conv stays bf16."""
    model = model_from_hf_config(_cfg("qwen3-next-80b-a3b", mamba_ssm_cache_dtype="float32"))
    state = _state(model)
    assert state.dtypes == (DType.BFLOAT16, DType.FLOAT32)
    # conv 49152 + recurrent 32 * 128 * 128 * 4 = 2097152 -> 2146304
    assert state.page_size_bytes() == 2146304


def test_qwen3_next_layer_types_override_the_interval():
    """layer_types (linear_attention / full_attention), when present, decides the layer kinds."""
    layer_types = ["full_attention" if i < 2 else "linear_attention" for i in range(48)]
    model = model_from_hf_config(_cfg("qwen3-next-80b-a3b", layer_types=layer_types))
    assert _kinds(model) == "FF" + "M" * 46


# --- Nemotron-H ----------------------------------------------------------------------------


def test_nemotron_h_8b_pattern_positions_and_mamba2_state():
    """Nemotron-H-8B: 24 Mamba2 + 4 attention layers at their pattern positions; 24 MLPs hold nothing."""
    model = model_from_hf_config(_cfg("nemotron-h-8b"))
    assert len(model.layers) == 28
    assert [layer.index for layer in model.layers if not layer.spec.is_ssm] == [7, 18, 29, 40]
    assert [layer.name for layer in model.layers][:3] == ["layers.0", "layers.2", "layers.4"]
    assert [c.index for c in model.cacheless][:3] == [1, 3, 5] and len(model.cacheless) == 24
    assert {c.spec.kind for c in model.cacheless} == {LayerKind.NO_CACHE}
    state = _state(model)
    # conv_dim = 128 heads * 64 + 2 * 8 groups * 128 state = 8192 + 2048 = 10240
    assert state.shapes == ((3, 10240), (128, 64, 128))
    assert (state.variant, state.chunk_size) == ("mamba2", 128)
    # the ssm state is float32 (vLLM's Nemotron-H default): conv 3 * 10240 * 2 = 61440; ssm 128 * 64 * 128 * 4
    # = 4194304; sum 4255744
    assert state.dtypes == (DType.BFLOAT16, DType.FLOAT32)
    assert state.page_size_bytes() == 4255744
    attention = _attention(model)
    assert (attention.num_kv_heads, attention.head_size) == (8, 128)  # head size from attention_head_dim


@pytest.mark.parametrize(("tp", "conv", "ssm"), [
    (2, (3, 5120), (64, 64, 128)),  # 10240 / 2
    (8, (3, 1280), (16, 64, 128)),  # 16 * 64 + 2 * 1 * 128 = 1280
])
def test_nemotron_h_states_shard_over_tp(tp, conv, ssm):
    """Mamba2 heads, groups and conv channels are divided by tp."""
    assert _state(model_from_hf_config(_cfg("nemotron-h-8b"), tp=tp)).shapes == (conv, ssm)


def test_nemotron_h_single_group_is_replicated_on_every_rank():
    """n_groups=1 is not split: each of 4 ranks keeps the group (conv 128*64/4 + 2*128 = 2304)."""
    model = model_from_hf_config(_cfg("nemotron-h-8b", n_groups=1), tp=4)
    assert _state(model).shapes == ((3, 2304), (32, 64, 128))


def test_nemotron_h_moe_letters_hold_no_cache():
    """E (MoE) layers, like - (MLP), hold no cache: declared as cacheless, not as entries."""
    model = model_from_hf_config(_cfg("nemotron-h-8b", hybrid_override_pattern="ME*E", num_hidden_layers=4))
    assert [(layer.index, layer.spec.kind) for layer in model.layers] == [
        (0, LayerKind.MAMBA), (2, LayerKind.FULL_ATTENTION)]
    assert [(c.index, c.spec.role) for c in model.cacheless] == [(1, "moe"), (3, "moe")]


# --- Jamba ---------------------------------------------------------------------------------


def test_jamba_attention_every_eighth_layer_from_offset_4():
    """Jamba-Mini-1.5: layers 4, 12, 20, 28 are attention, the other 28 Mamba1."""
    model = model_from_hf_config(_cfg("jamba-mini-1.5"))
    assert [layer.index for layer in model.layers if not layer.spec.is_ssm] == [4, 12, 20, 28]
    assert _kinds(model).count("M") == 28


def test_jamba_mamba1_state_uses_d_inner():
    """Mamba1: d_inner = 2 * 4096 = 8192; conv (3, 8192), ssm (8192, 16), no head dimension."""
    state = _state(model_from_hf_config(_cfg("jamba-mini-1.5")))
    assert state.shapes == ((3, 8192), (8192, 16))
    assert state.variant == "mamba1"
    # conv 3 * 8192 * 2 = 49152; ssm 8192 * 16 * 2 = 262144; sum 311296
    assert state.page_size_bytes() == 311296


def test_jamba_tp2_halves_d_inner_and_kv_heads():
    """At tp=2 each rank keeps d_inner / 2 = 4096 channels and 4 KV heads."""
    model = model_from_hf_config(_cfg("jamba-mini-1.5"), tp=2)
    assert _state(model).shapes == ((3, 4096), (4096, 16))
    assert _attention(model).num_kv_heads == 4


# --- gpt-oss -------------------------------------------------------------------------------


def test_gpt_oss_20b_alternates_sliding_and_full():
    """gpt-oss-20b: layer_types alternate sliding (window 128) and full, 8 KV heads x 64."""
    model = model_from_hf_config(_cfg("gpt-oss-20b"))
    assert _kinds(model) == "SF" * 12
    sliding = model.layers[0].spec
    assert isinstance(sliding, SlidingWindowSpec) and sliding.window == 128
    # 16 tokens * 8 heads * (64 + 64) * 2 bytes = 32768, sliding and full alike
    assert sliding.page_size_bytes(16) == model.layers[1].spec.page_size_bytes(16) == 32768


def test_gpt_oss_without_layer_types_alternates_starting_with_sliding():
    """Without layer_types, even layers slide and odd layers are full attention."""
    assert _kinds(model_from_hf_config(_cfg("gpt-oss-20b", layer_types=None))) == "SF" * 12


# --- DeepSeek-V3 ---------------------------------------------------------------------------


def test_deepseek_v3_is_all_mla_on_vllms_first_sm90_backend():
    """DeepSeek-V3: 61 MLA layers of 512 + 64 latent elements on flash_attn_mla (vLLM 0.33's first MLA backend on
    sm_90: 16-token pages, 16 x 576 x 2 = 18432 bytes); an fp8 cache, which FlashAttention's MLA kernels do not read,
    goes to flashmla (64-token pages), as does indexed (sparse) MLA; a named backend is kept."""
    model = model_from_hf_config(_cfg("deepseek-v3"))
    spec = model.layers[0].spec
    assert isinstance(spec, MLASpec) and (spec.kv_lora_rank, spec.rope_dim) == (512, 64)
    assert _kinds(model) == "L" * 61
    assert {layer.backend.name for layer in model.layers} == {"flash_attn_mla"}
    plan = graphkv.compile(model, Limits(), Budget.kv_bytes("20GiB"))
    assert plan.block_size == 16 and plan.groups[0].page_size_bytes == 18432
    fp8 = model_from_hf_config(_cfg("deepseek-v3"), kv_cache_dtype="fp8")
    assert {layer.backend.name for layer in fp8.layers} == {"flashmla"}
    assert graphkv.compile(fp8, Limits(), Budget.kv_bytes("20GiB")).block_size == 64
    sparse = model_from_hf_config(_cfg("deepseek-v3", num_hidden_layers=4, layer_types=["indexed_attention"] * 4,
                                       index_head_dim=128, indexer_types=["full", "shared"] * 2))
    assert {layer.backend.name for layer in sparse.layers} == {"flashmla", "indexer"}
    assert {layer.backend.name for layer in model_from_hf_config(_cfg("deepseek-v3"), kv_cache_dtype="float32").layers
            } == {"triton_mla"}  # neither FlashAttention's nor FlashMLA's kernels read float32
    named = model_from_hf_config(_cfg("deepseek-v3"), attention_backend="triton_mla")
    assert {layer.backend.name for layer in named.layers} == {"triton_mla"}


def test_deepseek_v3_latent_is_not_sharded_by_tp():
    """MLA caches one latent per token, so every rank keeps all 576 elements at tp=8."""
    model = model_from_hf_config(_cfg("deepseek-v3"), tp=8)
    assert model.layers[0].spec.head_size == 576 and model.tensor_parallel_size == 8


# --- dtypes and backends -------------------------------------------------------------------


def test_kv_cache_dtype_override_applies_to_attention_only():
    """kv_cache_dtype='fp8' makes attention pages fp8 but leaves Jamba's Mamba states at the model dtype."""
    model = model_from_hf_config(_cfg("jamba-mini-1.5"), kv_cache_dtype="fp8")
    assert _attention(model).dtype is DType.FLOAT8_E4M3
    assert _state(model).dtypes == (DType.BFLOAT16, DType.BFLOAT16)


def test_mamba_ssm_dtype_override_beats_the_config():
    """mamba_ssm_dtype overrides the config's mamba_ssm_cache_dtype for the ssm state only."""
    config = _cfg("nemotron-h-8b", mamba_ssm_cache_dtype="float32")
    assert _state(model_from_hf_config(config, mamba_ssm_dtype="float16")).dtypes == (DType.BFLOAT16, DType.FLOAT16)


def test_config_dtype_sets_attention_and_conv_dtypes():
    """torch_dtype (or the newer dtype key) sets the attention cache and conv state dtype."""
    model = model_from_hf_config(_cfg("jamba-mini-1.5", torch_dtype=None, dtype="float16"))
    assert _attention(model).dtype is DType.FLOAT16
    assert _state(model).dtypes == (DType.FLOAT16, DType.FLOAT16)


def test_dtype_wins_over_the_older_torch_dtype_as_transformers_reads_them():
    """A config with torch_dtype float32 and dtype bfloat16 planned a float32 cache (pages twice too large);
    transformers (so vLLM) takes dtype, and so does graphkv."""
    model = model_from_hf_config(_cfg("llama-3.1-8b", torch_dtype="float32", dtype="bfloat16"))
    assert model.layers[0].spec.dtype is DType.BFLOAT16


@pytest.mark.parametrize("dtype", ["int64", "uint8", "int32"])
def test_an_integer_config_dtype_is_refused_as_kv_cache_dtype_is(dtype):
    """torch_dtype int64 / uint8 planned an integer KV cache; refused like --kv-cache-dtype, naming the field."""
    with pytest.raises(SpecError, match=rf"config.torch_dtype='{dtype}': is an integer type; keys and values are "
                                        rf"floating-point, so a cache of {dtype} would truncate them; set "
                                        rf"config.torch_dtype to the weights' floating-point type, e.g. bfloat16"):
        model_from_hf_config(_cfg("llama-3.1-8b", torch_dtype=dtype))


def test_missing_dtype_defaults_to_bfloat16_and_auto_means_config_dtype():
    """No torch_dtype means bfloat16; kv_cache_dtype='auto' keeps the config dtype."""
    model = model_from_hf_config(_cfg("llama-3.1-8b", torch_dtype=None), kv_cache_dtype="auto")
    assert model.layers[0].spec.dtype is DType.BFLOAT16


def test_attention_backend_override_replaces_attention_backends_only():
    """attention_backend='flashinfer' changes the attention layers; state layers stay on gdn."""
    model = model_from_hf_config(_cfg("qwen3-next-80b-a3b"), attention_backend="flashinfer")
    assert {layer.backend.name for layer in model.layers} == {"flashinfer", "gdn"}


def test_mla_attention_backend_override_applies_to_mla_layers():
    """An MLA backend override (triton_mla) replaces the default (flash_attn_mla) on MLA layers."""
    model = model_from_hf_config(_cfg("deepseek-v3"), attention_backend="triton_mla")
    assert {layer.backend.name for layer in model.layers} == {"triton_mla"}


# --- errors --------------------------------------------------------------------------------

_BAD_INPUTS = [
    # (id, config, kwargs, field regex)
    ("config-not-a-dict", ["LlamaForCausalLM"], {}, r"config"),
    ("no-architecture", {"num_hidden_layers": 2}, {}, r"config\.architectures"),
    ("architectures-not-a-list", _cfg("llama-3.1-8b", architectures="LlamaForCausalLM"), {}, r"config\.architectures"),
    ("missing-heads", _cfg("llama-3.1-8b", num_attention_heads=None), {}, r"config\.num_attention_heads=<missing>"),
    ("zero-layers", _cfg("llama-3.1-8b", num_hidden_layers=0), {}, r"config\.num_hidden_layers=0"),
    ("kv-heads-string", _cfg("llama-3.1-8b", num_key_value_heads="8"), {}, r"config\.num_key_value_heads='8'"),
    ("negative-head-dim", _cfg("llama-3.1-8b", head_dim=-1), {}, r"config\.head_dim=-1"),
    ("bool-layers", _cfg("llama-3.1-8b", num_hidden_layers=True), {}, r"config\.num_hidden_layers=True"),
    ("float-hidden-size", _cfg("llama-3.1-8b", hidden_size=4096.0), {}, r"config\.hidden_size=4096\.0"),
    ("no-hidden-size-for-head-dim", _cfg("llama-3.1-8b", hidden_size=None), {}, r"config\.hidden_size=<missing>"),
    ("head-dim-not-derivable", _cfg("llama-3.1-8b", hidden_size=4100), {}, r"config\.head_dim.*not divisible"),
    ("bad-torch-dtype", _cfg("llama-3.1-8b", torch_dtype="int4"), {}, r"config\.torch_dtype='int4'"),
    ("bad-max-positions", _cfg("llama-3.1-8b", max_position_embeddings=-5), {}, r"config\.max_position_embeddings"),
    ("bad-use-sliding-window", _cfg("llama-3.1-8b", sliding_window=4096, use_sliding_window="yes"), {},
     r"config\.use_sliding_window"),
    ("kv-heads-not-divisible-by-tp", _cfg("llama-3.1-8b"), {"tp": 3}, r"config\.num_key_value_heads=8.*tp=3"),
    ("tp-not-multiple-of-kv-heads", _cfg("llama-3.1-8b", num_key_value_heads=4), {"tp": 6},
     r"config\.num_key_value_heads=4.*replicated"),
    ("tp-zero", _cfg("llama-3.1-8b"), {"tp": 0}, r"tp=0"),
    ("tp-string", _cfg("llama-3.1-8b"), {"tp": "2"}, r"tp='2'"),
    ("bad-kv-cache-dtype", _cfg("llama-3.1-8b"), {"kv_cache_dtype": "int4"}, r"kv_cache_dtype='int4'"),
    ("bad-mamba-ssm-dtype", _cfg("jamba-mini-1.5"), {"mamba_ssm_dtype": "fp7"}, r"mamba_ssm_dtype='fp7'"),
    ("bad-config-ssm-dtype", _cfg("jamba-mini-1.5", mamba_ssm_cache_dtype=32), {}, r"config\.mamba_ssm_cache_dtype"),
    ("unknown-attention-backend", _cfg("llama-3.1-8b"), {"attention_backend": "nope"}, r"attention_backend='nope'"),
    ("state-backend-as-attention", _cfg("llama-3.1-8b"), {"attention_backend": "mamba"}, r"attention_backend='mamba'"),
    ("non-mla-backend-on-mla-model", _cfg("deepseek-v3"), {"attention_backend": "flashinfer"},
     r"attention_backend='flashinfer'.*none of them"),
    ("empty-name", _cfg("llama-3.1-8b"), {"name": ""}, r"name=''"),
    ("pattern-unknown-letter", _cfg("nemotron-h-8b", hybrid_override_pattern="M-X*" * 13), {},
     r"config\.hybrid_override_pattern.*'X' at 2"),
    ("pattern-length-mismatch", _cfg("nemotron-h-8b", num_hidden_layers=50), {},
     r"config\.hybrid_override_pattern.*52 letters but num_hidden_layers=50"),
    ("pattern-not-a-string", _cfg("nemotron-h-8b", hybrid_override_pattern=["M", "*"]), {},
     r"config\.hybrid_override_pattern"),
    ("pattern-missing", _cfg("nemotron-h-8b", hybrid_override_pattern=None), {},
     r"config\.layer_types=<missing>: is needed.*hybrid_override_pattern"),
    ("mamba-heads-not-divisible", _cfg("nemotron-h-8b", mamba_num_heads=100), {"tp": 8},
     r"config\.mamba_num_heads=100"),
    ("groups-not-divisible", _cfg("nemotron-h-8b", n_groups=6), {"tp": 4}, r"config\.n_groups=6"),
    ("conv-kernel-one", _cfg("nemotron-h-8b", conv_kernel=1), {}, r"config\.conv_kernel=1"),
    ("missing-interval", _cfg("qwen3-next-80b-a3b", full_attention_interval=None), {},
     r"config\.layer_types=<missing>.*full_attention_interval"),
    ("linear-heads-not-divisible", _cfg("qwen3-next-80b-a3b"), {"tp": 3}, r"config\.linear_num_key_heads=16"),
    ("linear-conv-kernel-one", _cfg("qwen3-next-80b-a3b", linear_conv_kernel_dim=1), {},
     r"config\.linear_conv_kernel_dim=1"),
    ("qwen3-next-layer-types-unknown", _cfg("qwen3-next-80b-a3b", layer_types=["banded_attention"] * 48), {},
     r"config\.layer_types.*cannot plan: \['banded_attention'\]"),
    ("jamba-offset-past-period", _cfg("jamba-mini-1.5", attn_layer_offset=8), {}, r"config\.attn_layer_offset=8"),
    ("jamba-d-inner-not-divisible", _cfg("jamba-mini-1.5", hidden_size=4098, head_dim=128), {"tp": 8},
     r"config\.mamba_expand \* hidden_size=8196"),
    ("jamba-missing-period", _cfg("jamba-mini-1.5", attn_layer_period=None), {},
     r"config\.layer_types=<missing>.*attn_layer_period"),
    ("gpt-oss-layer-types-short", _cfg("gpt-oss-20b", layer_types=["sliding_attention", "full_attention"]), {},
     r"config\.layer_types.*num_hidden_layers=24"),
    ("gpt-oss-layer-types-unknown", _cfg("gpt-oss-20b", layer_types=["banded"] * 24), {},
     r"config\.layer_types.*'banded'"),
    ("gpt-oss-missing-window", _cfg("gpt-oss-20b", sliding_window=None), {}, r"config\.sliding_window=<missing>"),
    ("deepseek-missing-rank", _cfg("deepseek-v3", kv_lora_rank=None), {}, r"config\.kv_lora_rank=<missing>"),
    ("deepseek-rope-zero", _cfg("deepseek-v3", qk_rope_head_dim=0), {}, r"config\.qk_rope_head_dim=0"),
]


@pytest.mark.parametrize(("config", "kwargs", "match"), [case[1:] for case in _BAD_INPUTS],
                         ids=[case[0] for case in _BAD_INPUTS])
def test_malformed_input_raises_spec_error_naming_the_field(config, kwargs, match):
    """Every malformed config or override raises SpecError whose message names the field."""
    with pytest.raises(SpecError, match=match):
        model_from_hf_config(copy.deepcopy(config), **kwargs)


def test_error_message_names_value_limit_and_fix():
    """A tp the KV heads cannot split says the value, the limit and which tp values would work."""
    with pytest.raises(SpecError) as info:
        model_from_hf_config(_cfg("llama-3.1-8b"), tp=3)
    problem = info.value.problems[0]
    assert problem.field == "config.num_key_value_heads" and problem.value == 8
    assert "divisible by tp=3" in problem.limit and "[1, 2, 4, 8]" in problem.fix


def test_every_problem_is_reported_at_once():
    """Several independent problems come back in one SpecError."""
    config = _cfg("qwen3-next-80b-a3b", linear_conv_kernel_dim=0, head_dim="256", torch_dtype="int4")
    with pytest.raises(SpecError) as info:
        model_from_hf_config(config, tp=3)
    fields = {problem.field for problem in info.value.problems}
    assert {"config.linear_conv_kernel_dim", "config.head_dim", "config.torch_dtype", "config.linear_num_key_heads",
            "config.linear_num_value_heads", "config.num_key_value_heads"} <= fields


def test_bad_override_is_reported_with_the_config_problems():
    """A bad tp or backend does not hide the config's own problems: all come back together."""
    with pytest.raises(SpecError) as info:
        model_from_hf_config(_cfg("jamba-mini-1.5", mamba_d_state=None), tp=0, attention_backend="nope")
    assert {"tp", "attention_backend", "config.mamba_d_state"} <= {p.field for p in info.value.problems}


@pytest.mark.parametrize("preset", ["llama-3.1-8b", "qwen3-next-80b-a3b", "nemotron-h-8b", "jamba-mini-1.5",
                                    "gpt-oss-20b", "deepseek-v3"])
def test_junk_in_any_field_gives_a_model_or_a_spec_error(preset):
    """Replacing any field with junk never lets KeyError / TypeError / ZeroDivisionError escape."""
    base = _cfg(preset)
    for key in [k for k in base if not k.startswith("_")]:
        for junk in _JUNK:
            config = {**base, key: junk}
            try:
                model = model_from_hf_config(config, tp=2)
            except SpecError:
                continue
            assert isinstance(model, ModelKV) and all(math.prod(s) > 0 for layer in model.layers
                                                      if layer.spec.is_ssm for s in layer.spec.shapes)


@pytest.mark.parametrize("text_config", [True, False])
def test_cross_attention_layers_are_refused_naming_the_field(text_config):
    """Mllama's decoder has cross-attention layers that cache the vision encoder's output; its config says
    is_encoder_decoder false, so it was planned with every layer a decoder KV layer (40 full_attention)."""
    decoder = _cfg("llama-3.1-8b", cross_attention_layers=[3, 8, 13])
    config = ({"architectures": ["MllamaForConditionalGeneration"], "model_type": "mllama",
               "text_config": {**decoder, "model_type": "mllama_text_model"}} if text_config else decoder)
    field = "config.text_config.cross_attention_layers" if text_config else "config.cross_attention_layers"
    with pytest.raises(SpecError, match=rf"{field}=\[3, 8, 13\]: .* has cross-attention layers"):
        model_from_hf_config(config)
    decoder["cross_attention_layers"] = []  # none: a decoder-only model
    assert model_from_hf_config(decoder).layers
