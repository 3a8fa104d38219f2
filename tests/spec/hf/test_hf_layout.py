"""The config reader on hand-written config.json fields: older layout encodings, legacy names,
unknown architectures, plausibility caps, head-count checks and one-line refusals."""

from __future__ import annotations

import pytest

from graphkv.errors import SpecError
from graphkv.presets import load_preset_config
from graphkv.spec import DType, LayerKind
from graphkv.spec.hf_config import model_from_hf_config
from graphkv.spec.layers import kind_label

LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072}


def kinds(model) -> str:
    """One letter per model layer in stack order: F full, S sliding, C chunked, L MLA, M state, - none, K shared."""
    letters = {"full_attention": "F", "sliding_window": "S", "chunked_local": "C", "mla": "L", "none": "-",
               "kv_shared": "K"}
    by_layer: dict[int, str] = {}
    for layer in (*model.layers, *model.cacheless):
        by_layer.setdefault(layer.model_layer, letters.get(kind_label(layer.spec), "M"))
    return "".join(by_layer[i] for i in sorted(by_layer))


def test_unknown_architecture_with_a_known_layout_plans_and_says_which_reader():
    """An architecture graphkv does not list plans from its fields; the note names the reader used."""
    config = {**LLAMA_8B, "architectures": ["AcmeForCausalLM"], "model_type": "acme",
              "layer_types": ["sliding_attention", "full_attention"] * 16, "sliding_window": 1024}
    model = model_from_hf_config(config)
    assert kinds(model) == "SF" * 16
    assert model.layers[0].spec.window == 1024 and model.layers[1].spec.num_kv_heads == 8
    assert model.notes == ("config reader: read AcmeForCausalLM by its fields: model_type 'acme' is not a family "
                           "graphkv lists (`graphkv models`); layer kinds from layer_types (32 layers); backends as vLLM "
                           "0.33 picks them on sm_90 (assumed: no GPU named)",)


def test_nemotron_h_both_config_formats_read_the_same():
    """hybrid_override_pattern + num_hidden_layers and transformers 5's layers_block_type (no layer count) agree."""
    old = load_preset_config("nemotron-h-8b")
    names = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    new = {k: v for k, v in old.items() if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    new["layers_block_type"] = [names[c] for c in old["hybrid_override_pattern"]]
    a, b = model_from_hf_config(old), model_from_hf_config(new)
    assert a.layers == b.layers and a.cacheless == b.cacheless
    assert kinds(b) == old["hybrid_override_pattern"].replace("*", "F")
    assert len(b.layers) == 28 and len(b.cacheless) == 24


def test_kimi_linear_attn_config_lists_one_indexed_layers():
    """Kimi-Linear's original linear_attn_config: full_attn_layers / kda_layers are 1-indexed."""
    config = {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "num_hidden_layers": 8,
              "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_size": 2304, "kv_lora_rank": 512,
              "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
              "linear_attn_config": {"full_attn_layers": [4, 8], "kda_layers": [1, 2, 3, 5, 6, 7], "num_heads": 32,
                                     "head_dim": 128, "short_conv_kernel_size": 4}}
    model = model_from_hf_config(config)
    assert kinds(model) == "MMMLMMML"
    kda = model.layers[0].spec
    # 3 x 32 heads x 128 conv channels; float32 recurrent state (vLLM's KDA default)
    assert (kda.variant, kda.shapes, kda.dtypes) == ("kda", ((3, 12288), (32, 128, 128)),
                                                     (DType.BFLOAT16, DType.FLOAT32))
    assert model.layers[0].backend.name == "kda"


def test_minimax_attn_type_list_marks_softmax_layers():
    """MiniMax-Text-01's attn_type_list: 1 is softmax attention, 0 lightning attention (heads, d, d)."""
    config = {"architectures": ["MiniMaxText01ForCausalLM"], "model_type": "minimax_text_01", "num_hidden_layers": 8,
              "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 6144,
              "attn_type_list": [0, 0, 0, 0, 0, 0, 0, 1]}
    model = model_from_hf_config(config, tp=8)
    assert kinds(model) == "MMMMMMMF"
    assert model.layers[0].spec.shapes == ((8, 128, 128),)  # 64 heads / tp 8
    assert model.layers[0].backend.name == "lightning"
    assert model.layers[7].spec.num_kv_heads == 1


def test_mimo_v2_hybrid_layer_pattern_and_swa_fields():
    """MiMo-V2's original fields: hybrid_layer_pattern 1 = sliding, whose heads come from swa_* (V smaller than K)."""
    config = {"architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash", "num_hidden_layers": 4,
              "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192, "v_head_dim": 128,
              "hidden_size": 4096, "hybrid_layer_pattern": [0, 1, 1, 1], "sliding_window_size": 128,
              "swa_num_attention_heads": 64, "swa_num_key_value_heads": 8, "swa_head_dim": 192,
              "swa_v_head_dim": 128}
    model = model_from_hf_config(config)
    assert kinds(model) == "FSSS"
    full, sliding = model.layers[0].spec, model.layers[1].spec
    assert (full.num_kv_heads, full.head_size, full.value_head_size) == (4, 192, 128)
    assert (sliding.num_kv_heads, sliding.head_size, sliding.value_head_size, sliding.window) == (8, 192, 128, 128)
    # page bytes per token: 8 x (192 + 128) x 2 = 5120 sliding, 4 x 320 x 2 = 2560 full
    assert (sliding.bytes_per_token(), full.bytes_per_token()) == (5120, 2560)


def test_gemma4_original_global_head_dim():
    """Gemma-4's original global_head_dim (and num_global_key_value_heads) apply to the full-attention layers."""
    config = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "num_hidden_layers": 6,
              "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
              "num_global_key_value_heads": 2, "attention_k_eq_v": True, "hidden_size": 2304,
              "sliding_window": 512, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    model = model_from_hf_config(config)
    assert [(x.spec.num_kv_heads, x.spec.head_size) for x in model.layers] == [(4, 256)] * 5 + [(2, 512)]


def test_llama4_original_no_rope_layers():
    """Llama-4 without layer_types: attention_chunk_size with no_rope_layers (1 = RoPE = chunked, 0 = global)."""
    config = {**LLAMA_8B, "model_type": "llama4_text", "num_hidden_layers": 8, "attention_chunk_size": 8192,
              "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0]}
    assert kinds(model_from_hf_config(config)) == "CCCFCCCF"
    del config["no_rope_layers"]  # the default interval: every 4th layer is NoPE
    assert kinds(model_from_hf_config(config)) == "CCCFCCCF"


@pytest.mark.parametrize(("fields", "expected"), [
    ({"full_attn_idxs": [1, 3], "conv_L_cache": 3}, "MFMF"),  # LFM2
    ({"attn_layer_indices": [2], "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 16,
      "mamba_n_groups": 1, "mamba_d_conv": 4}, "MMFM"),  # Bamba
    ({"attn_layer_indices": None, "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 16, "mamba_n_groups": 1,
      "mamba_d_conv": 4}, "MMMM"),  # Bamba without attention: the key present but null
    ({"attn_layer_period": 2, "attn_layer_offset": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2},
     "MFMF"),  # Jamba
    ({"full_attention_interval": 2, "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 64,
      "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4}, "MFMF"),  # Qwen3-Next
    ({"sliding_window": 256, "sliding_window_pattern": "LLLG"}, "SSSF"),  # EXAONE-4 string pattern
    ({"sliding_window": 256, "sliding_window_pattern": 2}, "SFSF"),  # Gemma-3 style int pattern
    ({"sliding_window": 256, "use_sliding_window": True, "max_window_layers": 2}, "FFSS"),  # Qwen2
    ({"sliding_window": 256, "use_sliding_window": False, "max_window_layers": 2}, "FFFF"),
    ({"sliding_window": 256}, "SSSS"),  # Mistral: every layer
])
def test_older_layout_fields(fields, expected):
    """Each family's older layout field decides the layer kinds when layer_types is absent."""
    config = {**LLAMA_8B, "model_type": "custom", "num_hidden_layers": 4, **fields}
    assert kinds(model_from_hf_config(config)) == expected


def test_family_default_sliding_pattern_when_the_config_has_none():
    """A Gemma-2 config.json says only sliding_window: the family alternates sliding and full."""
    config = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_size": 2304,
              "sliding_window": 4096}
    model = model_from_hf_config(config)
    assert kinds(model) == "SFSF"
    assert "the gemma2 default: 1 full layer in every 2" in model.notes[0]


def test_zamba2_hybrid_layer_ids_hold_attention_and_state():
    """Zamba2's hybrid_layer_ids: those layers hold attention and a Mamba2 state, the rest a state."""
    config = {"architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "num_hidden_layers": 4,
              "hidden_size": 2560, "num_attention_heads": 32, "num_key_value_heads": 32, "attention_head_dim": 160,
              "kv_channels": 80, "n_mamba_heads": 8, "mamba_headdim": 640, "mamba_d_state": 64, "mamba_ngroups": 1,
              "mamba_d_conv": 4, "hybrid_layer_ids": [2]}
    model = model_from_hf_config(config)
    assert [(x.name, x.index, x.model_layer, kind_label(x.spec)) for x in model.layers] == [
        ("layers.0", 0, 0, "mamba2"), ("layers.1", 1, 1, "mamba2"), ("layers.2", 2, 2, "full_attention"),
        ("layers.3", 3, 3, "mamba2"), ("layers.2.mamba2", 4, 2, "mamba2")]
    assert model.layers[2].spec.head_size == 160  # attention_head_dim, not kv_channels


@pytest.mark.parametrize(("config", "kv", "head", "layers"), [
    ({"n_layer": 12, "n_head": 12, "n_embd": 768, "model_type": "gpt2"}, 12, 64, 12),  # GPT-2 names
    ({"num_hidden_layers": 60, "num_attention_heads": 128, "hidden_size": 8192, "new_decoder_architecture": True,
      "num_kv_heads": 8, "model_type": "falcon"}, 8, 64, 60),  # Falcon-40B: new decoder, 8 KV heads
    ({"num_hidden_layers": 32, "num_attention_heads": 71, "hidden_size": 4544, "new_decoder_architecture": False,
      "multi_query": False, "num_kv_heads": 71, "model_type": "falcon"}, 71, 64, 32),  # Falcon without MQA
    ({"num_layers": 40, "num_attention_heads": 32, "hidden_size": 4096, "multi_query_attention": True,
      "multi_query_group_num": 2, "kv_channels": 128, "model_type": "chatglm"}, 2, 128, 40),  # ChatGLM names
    ({"n_layers": 24, "n_heads": 16, "d_model": 2048, "attn_config": {"kv_n_heads": 8}, "model_type": "dbrx"},
     8, 128, 24),  # DBRX attn_config
])
def test_legacy_field_names(config, kv, head, layers):
    """n_layer / n_head / n_embd, num_layers, n_heads / d_model, multi_query, num_kv_heads and kv_channels read right."""
    model = model_from_hf_config(config)
    assert len(model.layers) == layers
    assert {(x.spec.num_kv_heads, x.spec.head_size) for x in model.layers} == {(kv, head)}


def test_recurrent_state_dtype_precedence():
    """ssm dtype: the argument, else the config field, else the family default (Nemotron-H float32), else the model's."""
    config = load_preset_config("nemotron-h-8b")
    state = next(x.spec for x in model_from_hf_config(config).layers if x.spec.is_ssm)
    assert state.dtypes == (DType.BFLOAT16, DType.FLOAT32)
    config["mamba_ssm_cache_dtype"] = "bfloat16"
    state = next(x.spec for x in model_from_hf_config(config).layers if x.spec.is_ssm)
    assert state.dtypes == (DType.BFLOAT16, DType.BFLOAT16)
    state = next(x.spec for x in model_from_hf_config(config, mamba_ssm_dtype="float16").layers if x.spec.is_ssm)
    assert state.dtypes == (DType.BFLOAT16, DType.FLOAT16)
    qwen35 = {**load_preset_config("qwen3-next-80b-a3b"), "mamba_ssm_dtype": "float32"}  # Qwen3.5's field name
    state = next(x.spec for x in model_from_hf_config(qwen35).layers if x.spec.is_ssm)
    assert state.dtypes == (DType.BFLOAT16, DType.FLOAT32)


_ONE_LINE_REFUSALS = [
    ({**LLAMA_8B, "layer_types": ["full_attention", "hash_attention"] * 16}, "config.layer_types",
     "cannot plan: ['hash_attention']"),
    ({**LLAMA_8B, "mamba_d_state": 16, "mamba_expand": 2}, "config.layer_types=<missing>",
     "attention and recurrent-state fields but no field says which layers are which"),
    ({**LLAMA_8B, "layer_types": ["linear_attention"] * 32}, "config.layer_types",
     "no state fields graphkv reads"),
    ({**LLAMA_8B, "layer_types": ["indexed_attention"] * 32}, "config.layer_types",
     "graphkv plans indexers on MLA layers"),
    ({**LLAMA_8B, "conv_L_cache": 3}, "config.layer_types=<missing>", "short-convolution fields"),
    ({**LLAMA_8B, "layer_types": ["sliding_attention"] * 32, "sliding_window": 128, "num_kv_shared_layers": 32},
     "config.num_kv_shared_layers=32", "must leave at least one"),
    ({**LLAMA_8B, "layer_types": ["sliding_attention"] * 31 + ["full_attention"], "sliding_window": 128,
      "num_kv_shared_layers": 1}, "config.num_kv_shared_layers=1", "layer 31 (full_attention)"),
    ({**LLAMA_8B, "hybrid_override_pattern": "M*Q" * 10}, "config.hybrid_override_pattern", "'Q' at 2"),
    ({**LLAMA_8B, "linear_attn_config": {"full_attn_layers": [1], "kda_layers": [1, 2]}, "num_hidden_layers": 2},
     "config.linear_attn_config", "must split the 2 layers"),
    ({**LLAMA_8B, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "layer_types": ["sliding_attention"] * 32,
      "sliding_window": 128}, "config.layer_types", "mixes sliding, chunked or hybrid layers with MLA"),
    ({**LLAMA_8B, "layer_types": ["indexed_attention"] * 32, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
      "index_head_dim": 128, "indexer_types": ["full", "reuse"] * 16}, "config.indexer_types", "'full' or 'shared'"),
    ({**LLAMA_8B, "layer_types": ["indexed_attention"] * 32, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
      "index_head_dim": 128, "indexer_types": [["full"]] + [{"shared": 1}] + ["full"] * 30}, "config.indexer_types",
     "'full' or 'shared'"),
]


@pytest.mark.parametrize(("config", "field", "limit"), _ONE_LINE_REFUSALS, ids=[c[1] + "-" + c[2][:20]
                                                                                for c in _ONE_LINE_REFUSALS])
def test_unreadable_layers_are_one_line_naming_the_field(config, field, limit):
    """A config whose layers cannot be understood is refused with exactly one problem naming the field."""
    with pytest.raises(SpecError) as info:
        model_from_hf_config(config)
    assert len(info.value.problems) == 1 and "\n" not in str(info.value)
    assert str(info.value).startswith(field) and limit in str(info.value)


@pytest.mark.parametrize(("changes", "field", "cap"), [
    ({"num_hidden_layers": 1_000_000}, "config.num_hidden_layers=1000000", "must be <= 16384"),
    ({"num_attention_heads": 100_000, "num_key_value_heads": 8}, "config.num_attention_heads=100000",
     "must be <= 16384"),
    ({"head_dim": 10 ** 6}, "config.head_dim=1000000", "must be <= 65536"),
    ({"hidden_size": 1 << 30}, "config.hidden_size=1073741824", "must be <= 1048576"),
    ({"layer_types": ["full_attention"] * 20_000, "num_hidden_layers": None}, "config.layer_types",
     "must be <= 16384 layers"),
])
def test_plausibility_caps_name_the_cap(changes, field, cap):
    """Counts and sizes no model comes close to are refused with the cap in the message."""
    config = {k: v for k, v in {**LLAMA_8B, **changes}.items() if v is not None}
    with pytest.raises(SpecError) as info:
        model_from_hf_config(config)
    message = str(info.value)
    assert field in message and cap in message


@pytest.mark.parametrize(("changes", "tp", "field", "limit"), [
    ({"num_key_value_heads": 64}, 1, "config.num_key_value_heads=64", "must be <= num_attention_heads=32"),
    ({"num_key_value_heads": 6}, 1, "config.num_key_value_heads=6", "must divide num_attention_heads=32"),
    ({"num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128}, 16, "config.num_attention_heads=24",
     "must be divisible by tp=16"),
])
def test_head_count_consistency(changes, tp, field, limit):
    """KV heads may not exceed or fail to divide query heads; query heads must divide by tp."""
    with pytest.raises(SpecError) as info:
        model_from_hf_config({**LLAMA_8B, **changes}, tp=tp)
    assert any(str(p).startswith(field) and limit in str(p) for p in info.value.problems)


def test_mla_intent_without_a_rank_names_kv_lora_rank():
    """A config with MLA's qk_rope_head_dim but no kv_lora_rank is refused naming kv_lora_rank, not read as MHA."""
    config = {k: v for k, v in load_preset_config("deepseek-v3").items() if k != "kv_lora_rank"}
    with pytest.raises(SpecError, match=r"config\.kv_lora_rank=<missing>"):
        model_from_hf_config(config)


def test_indexer_types_shared_layers_hold_no_indexer_keys():
    """indexer_types 'shared' layers reuse an earlier indexer's keys: only 'full' layers get an indexer entry."""
    config = {**load_preset_config("deepseek-v3"), "num_hidden_layers": 4, "layer_types": ["indexed_attention"] * 4,
              "index_head_dim": 128, "indexer_types": ["full", "shared", "full", "shared"]}
    model = model_from_hf_config(config)
    assert [(x.name, x.spec.kind) for x in model.layers if x.spec.kind is LayerKind.INDEXER] == [
        ("layers.0.indexer", LayerKind.INDEXER), ("layers.2.indexer", LayerKind.INDEXER)]
