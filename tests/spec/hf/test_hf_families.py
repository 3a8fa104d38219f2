"""Every family graphkv lists, read from transformers' own reference config (no download).

Each row gives the exact layer kinds, counts, KV heads, head sizes, windows and state shapes the
family's modeling code uses, worked out by hand from the config's fields and the modeling /
vLLM code (the comment says how); the reader's output must equal them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs
import pytest

from graphkv.spec.hf.families import FAMILIES
from graphkv.spec.hf_config import model_from_hf_config
from graphkv.spec.layers import (ChunkedLocalSpec, FullAttentionSpec, IndexerKeySpec, MambaSpec, MLASpec,
                                 SlidingWindowSpec, kind_label)

transformers = pytest.importorskip("transformers", reason="the family tests read transformers' reference configs")
transformers.logging.set_verbosity_error()

from transformers_types import reference_config  # noqa: E402 - after the importorskip above

BF16 = "bfloat16"


@attrs.frozen
class Row:
    """One family: config overrides, kind counts, and the one signature every layer of a kind has."""

    model_type: str
    counts: dict[str, int]
    specs: dict[str, Any]
    overrides: dict[str, Any] = attrs.field(factory=dict)


def signature(spec: Any) -> tuple:
    """What the rows compare: heads and sizes of attention, latents of MLA, shapes and dtypes of states."""
    if isinstance(spec, MambaSpec):
        return spec.shapes, tuple(d.value for d in spec.dtypes)
    if isinstance(spec, MLASpec):
        return spec.kv_lora_rank, spec.rope_dim
    if isinstance(spec, IndexerKeySpec):
        return spec.head_size, spec.dtype.value
    extra = spec.window if isinstance(spec, SlidingWindowSpec) else spec.chunk if isinstance(spec, ChunkedLocalSpec) \
        else None
    assert isinstance(spec, FullAttentionSpec)
    return spec.num_kv_heads, spec.head_size, spec.value_head_size, extra


def full(n: int, kv: int, head: int, v: int | None = None) -> Row:
    """Helper for the many pure full-attention rows (filled in by ``rows``)."""
    return Row("", {"full_attention": n}, {"full_attention": (kv, head, v or head, None)})


def _f(model_type: str, n: int, kv: int, head: int, **overrides: Any) -> Row:
    return attrs.evolve(full(n, kv, head), model_type=model_type, overrides=overrides)


def _sw(model_type: str, sliding: int, full_: int, kv: int, head: int, window: int, **overrides: Any) -> Row:
    counts = {k: v for k, v in (("sliding_window", sliding), ("full_attention", full_)) if v}
    specs = {"sliding_window": (kv, head, head, window), "full_attention": (kv, head, head, None)}
    return Row(model_type, counts, {k: specs[k] for k in counts}, overrides)


ROWS = [
    # --- full attention: KV heads x head size (head_dim, else hidden_size / heads)
    _f("llama", 32, 32, 128),  # head_dim 128, MHA
    _sw("mistral", 32, 0, 8, 128, 4096),  # sliding_window 4096 on every layer
    _f("mixtral", 32, 8, 128),  # head_dim null: 4096 / 32
    _sw("ministral", 32, 0, 8, 128, 4096),  # layer_types all sliding; 4096 / 32
    _f("ministral3", 34, 8, 128),
    _f("qwen2", 32, 32, 128),  # use_sliding_window false: full; 4096 / 32
    _f("qwen2_moe", 24, 16, 128),  # 2048 / 16
    _f("qwen3", 32, 32, 128),
    _f("qwen3_moe", 24, 4, 64),  # no head_dim: 2048 / 32
    _f("gemma", 28, 16, 256),
    _f("phi", 24, 32, 64),  # 2048 / 32
    _f("phi3", 32, 32, 96),  # 3072 / 32
    _f("phimoe", 32, 8, 128),
    _f("granite", 32, 32, 128),
    _f("granitemoe", 32, 32, 128),
    _f("granitemoeshared", 32, 32, 128),
    _f("cohere", 40, 64, 128),  # 8192 / 64
    _f("glm", 40, 2, 128),
    _f("glm4", 40, 2, 128),
    _f("glm4_moe", 46, 8, 128, head_dim=128),  # GLM-4.5 writes head_dim 128 (4096 / 96 is not whole)
    _f("olmo", 32, 32, 128),
    _f("olmo2", 32, 32, 128),
    _f("olmoe", 16, 16, 128),  # 2048 / 16
    _f("flex_olmo", 32, 32, 128),
    _f("starcoder2", 30, 2, 128),  # 3072 / 24
    _f("stablelm", 32, 32, 80),  # 2560 / 32
    _f("persimmon", 36, 64, 64),  # no KV field: MHA, 4096 / 64
    _f("gpt_neox", 44, 64, 96),  # 6144 / 64
    _f("gpt_neox_japanese", 32, 32, 80),  # 2560 / 32
    _f("gptj", 28, 16, 256),  # legacy n_layer / n_head / n_embd: 4096 / 16
    _f("codegen", 28, 16, 256),
    _f("gpt2", 12, 12, 64),  # 768 / 12
    _f("gpt_bigcode", 12, 1, 64),  # multi_query: one KV head
    _f("openai-gpt", 12, 12, 64),
    _f("ctrl", 48, 16, 80),  # 1280 / 16
    _f("xglm", 24, 16, 64),  # num_layers / attention_heads / d_model: 1024 / 16
    _f("falcon", 32, 1, 64),  # multi_query without new_decoder_architecture: 1 KV head; 4544 / 71
    _f("bloom", 2, 8, 8),  # n_layer 2, n_head 8, hidden 64
    _f("opt", 12, 12, 64),
    _f("mpt", 24, 16, 128),  # n_layers / n_heads / d_model: 2048 / 16, MHA
    _f("dbrx", 24, 1, 128),  # attn_config.kv_n_heads 1; 2048 / 16
    _f("internlm3", 48, 2, 128),
    _f("helium", 24, 20, 128),
    _f("ernie4_5", 18, 2, 128),
    _f("ernie4_5_moe", 28, 4, 128),  # 2560 / 20
    _f("seed_oss", 64, 8, 128),
    _f("smollm3", 36, 4, 128),  # NoPE layers are still full attention; 2048 / 16
    _f("hunyuan_v1_dense", 32, 32, 128),  # head_dim null: 4096 / 32
    _f("hunyuan_v1_moe", 32, 32, 128),
    _f("minimax_m2", 62, 8, 128),
    _f("jetmoe", 12, 16, 128),  # kv_channels 128 (not 2048 / 32)
    _f("nemotron", 32, 48, 128),  # num_key_value_heads null: MHA
    _f("bitnet", 30, 5, 128),  # 2560 / 20
    _f("apertus", 32, 32, 128),
    _f("arcee", 32, 32, 80),  # head_dim 80
    _f("diffllama", 16, 32, 64),
    _f("nanochat", 12, 6, 128),  # 768 / 6
    _f("solar_open", 48, 8, 128),
    _f("dots1", 62, 32, 144),  # layer_types all full despite sliding_window; 4608 / 32
    _f("hy_v3", 80, 8, 128),
    _f("iquestcoder", 80, 8, 128),
    _f("jais2", 32, 26, 128),
    _f("laguna", 40, 8, 128),
    _f("mellum", 28, 4, 128),
    _f("aria_text", 32, 32, 128),
    _f("emu3", 32, 8, 128),  # the text_config of a multimodal config: 4096 / 32
    # --- sliding window + full attention (every N-th layer full, from layer_types)
    _sw("gemma2", 13, 13, 4, 256, 4096),  # alternating
    _sw("gemma3_text", 22, 4, 4, 256, 4096),  # every 6th full: 5, 11, 17, 23
    _sw("vaultgemma", 13, 13, 4, 256, 4096),
    _sw("cohere2", 30, 10, 64, 128, 4096),  # every 4th full
    _sw("cohere2_moe", 30, 10, 64, 128, 4096),
    _sw("gpt_oss", 18, 18, 8, 64, 128),
    _sw("olmo3", 24, 8, 32, 128, 4096),
    _sw("exaone4", 24, 8, 32, 128, 4096),
    _sw("exaone_moe", 24, 8, 32, 128, 4096),
    _sw("afmoe", 24, 8, 16, 128, 1024),  # global_attn_every_n_layers 4
    _sw("cwm", 48, 16, 8, 128, 8192),
    _sw("granite_swa", 18, 6, 4, 128, 128),  # 2560 / 20
    _sw("kolibri1", 40, 10, 4, 128, 513),
    _sw("flint", 35, 14, 4, 128, 513),
    _sw("beam", 43, 9, 8, 128, 512),
    _sw("gpt_neo", 12, 12, 16, 128, 256),  # attention_layers global / local, window_size 256; 2048 / 16
    # v_head_dim 128 != head_dim 192. sliding_window pinned to the current reference default, 129 (the SGLang window:
    # 128 earlier tokens plus the query); transformers 5.17 and 5.18 default to 128. The row checks the reader.
    Row("mimo_v2_flash", {"sliding_window": 39, "full_attention": 9},
        {"sliding_window": (4, 192, 128, 129), "full_attention": (4, 192, 128, None)}, {"sliding_window": 129}),
    # --- chunked local, per-layer head sizes, KV sharing
    Row("llama4_text", {"chunked_local": 36, "full_attention": 12},  # RoPE layers chunked, every 4th (NoPE) global
        {"chunked_local": (8, 128, 128, 8192), "full_attention": (8, 128, 128, None)}),
    Row("gemma4_text", {"sliding_window": 25, "full_attention": 5},  # global layers: per_layer_config head_dim 512
        {"sliding_window": (4, 256, 256, 512), "full_attention": (4, 512, 512, None)}),
    Row("gemma3n_text", {"sliding_window": 16, "full_attention": 4, "kv_shared": 15},  # last 15 of 35 share KV
        {"sliding_window": (2, 256, 256, 512), "full_attention": (2, 256, 256, None)}),
    # --- MLA: kv_lora_rank + qk_rope_head_dim per token
    Row("deepseek_v2", {"mla": 32}, {"mla": (512, 64)}),
    Row("deepseek_v3", {"mla": 61}, {"mla": (512, 64)}),
    Row("glm4_moe_lite", {"mla": 47}, {"mla": (512, 64)}),
    Row("minicpm3", {"mla": 62}, {"mla": (256, 32)}),
    Row("youtu", {"mla": 32}, {"mla": (512, 64)}),
    Row("longcat_flash", {"mla": 56}, {"mla": (512, 64)}),  # 28 layers x 2 attentions each
    Row("deepseek_v32", {"mla": 61, "indexer": 61}, {"mla": (512, 64), "indexer": (132, "uint8")}),  # 128 + 128/128*4
    Row("glm_moe_dsa", {"mla": 78, "indexer": 78}, {"mla": (512, 64), "indexer": (132, "uint8")}),
    # --- recurrent states (conv state first; bf16 checkpoint dtype unless a float32 default applies)
    Row("mamba", {"mamba1": 32}, {"mamba1": (((3, 1536), (1536, 16)), (BF16, BF16))}),  # intermediate_size 1536
    Row("falcon_mamba", {"mamba1": 32}, {"mamba1": (((3, 1536), (1536, 16)), (BF16, BF16))}),
    Row("jamba", {"mamba1": 28, "full_attention": 4},  # mamba_expand 2 x 4096; attention every 8th from 4
        {"mamba1": (((3, 8192), (8192, 16)), (BF16, BF16)), "full_attention": (8, 128, 128, None)}),
    Row("mamba2", {"mamba2": 64},  # 128 x 64 + 2 x 8 groups x 128 = 10240
        {"mamba2": (((3, 10240), (128, 64, 128)), (BF16, BF16))}),
    Row("bamba", {"mamba2": 29, "full_attention": 3},  # Bamba-9B attention at 9, 18, 27; 8192 + 2 x 1 x 256
        {"mamba2": (((3, 8704), (128, 64, 256)), (BF16, BF16)), "full_attention": (8, 128, 128, None)},
        {"attn_layer_indices": [9, 18, 27]}),
    Row("granitemoehybrid", {"mamba2": 29, "full_attention": 3},
        {"mamba2": (((3, 8704), (128, 64, 256)), (BF16, BF16)), "full_attention": (32, 128, 128, None)},
        {"layer_types": ["attention" if i in (5, 15, 25) else "mamba" for i in range(32)]}),
    Row("zamba2", {"mamba2": 54, "full_attention": 9},  # 9 hybrid layers hold attention too; 5120 + 2 x 64
        {"mamba2": (((3, 5248), (8, 640, 64)), (BF16, BF16)), "full_attention": (32, 160, 160, None)}),
    Row("falcon_h1", {"full_attention": 32, "mamba2": 32},  # parallel: every layer both; mamba_d_ssm 1024 + 2 x 256
        {"full_attention": (8, 128, 128, None), "mamba2": (((3, 1536), (128, 8, 256)), (BF16, BF16))}),
    Row("nemotron_h", {"mamba2": 1, "full_attention": 1, "none": 2},  # layers_block_type M E * -; ssm float32
        {"mamba2": (((3, 10240), (128, 64, 128)), (BF16, "float32")), "full_attention": (8, 128, 128, None)}),
    Row("qwen3_next", {"gated_delta": 36, "full_attention": 12},  # 2 x 16 x 128 + 32 x 128 = 8192
        {"gated_delta": (((3, 8192), (32, 128, 128)), (BF16, BF16)), "full_attention": (2, 256, 256, None)}),
    Row("qwen3_5_text", {"gated_delta": 24, "full_attention": 8},
        {"gated_delta": (((3, 8192), (32, 128, 128)), (BF16, BF16)), "full_attention": (4, 256, 256, None)}),
    Row("qwen3_5_moe_text", {"gated_delta": 30, "full_attention": 10},
        {"gated_delta": (((3, 8192), (32, 128, 128)), (BF16, BF16)), "full_attention": (2, 256, 256, None)}),
    Row("olmo_hybrid", {"gated_delta": 24, "full_attention": 8},  # 2 x 30 x 96 + 30 x 192; recurrent (v, v_dim, k_dim)
        {"gated_delta": (((3, 11520), (30, 192, 96)), (BF16, BF16)), "full_attention": (30, 128, 128, None)}),
    Row("kimi_linear", {"kda": 21, "mla": 6},  # KDA: 3 x 32 x 128 conv channels, float32 recurrent state
        {"kda": (((3, 12288), (32, 128, 128)), (BF16, "float32")), "mla": (512, 64)}),
    Row("bailing_hybrid", {"kda": 35, "mla": 7},
        {"kda": (((3, 12288), (32, 128, 128)), (BF16, "float32")), "mla": (512, 64)}),
    Row("minimax", {"lightning": 16, "full_attention": 16},  # lightning: (heads, head_dim, head_dim), 4096 / 32
        {"lightning": (((32, 128, 128),), (BF16,)), "full_attention": (8, 128, 128, None)}),
    Row("lfm2", {"short_conv": 10, "full_attention": 6},  # LFM2-1.2B: conv_L_cache 3 -> 2 rows; 2048 / 32
        {"short_conv": (((2, 2048),), (BF16,)), "full_attention": (8, 64, 64, None)},
        {"full_attn_idxs": [2, 5, 8, 10, 12, 14], "num_hidden_layers": 16, "hidden_size": 2048}),
    Row("lfm2_moe", {"short_conv": 18, "full_attention": 6},  # LFM2-8B-A1B layout
        {"short_conv": (((2, 2048),), (BF16,)), "full_attention": (8, 64, 64, None)},
        {"num_hidden_layers": 24,
         "layer_types": ["full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)]}),
    Row("lfm3", {"short_conv": 13, "full_attention": 6, "sliding_window": 5},  # conv_L_cache 7 -> 6 rows
        {"short_conv": (((6, 2048),), (BF16,)), "full_attention": (4, 128, 128, None),
         "sliding_window": (4, 128, 128, 256)}),
]
BY_TYPE = {row.model_type: row for row in ROWS}


def read(model_type: str, **overrides: Any):
    """The reader's model of transformers' reference config for ``model_type`` (a skip when the installed
    transformers does not know the type)."""
    return model_from_hf_config(reference_config(model_type, **overrides).to_dict())


def test_at_least_seventy_families_and_every_listed_family_has_a_row():
    """Every family of `graphkv models` is checked here, and there are at least 70."""
    assert {row.model_type for row in ROWS} == {f.model_type for f in FAMILIES}
    assert len(ROWS) >= 70


@pytest.mark.parametrize("row", ROWS, ids=[row.model_type for row in ROWS])
def test_family_reads_the_kinds_counts_and_shapes_its_model_code_uses(row: Row):
    """The reference config reads as exactly the kinds, counts, heads, sizes, windows and states of the row."""
    model = model_from_hf_config(reference_config(row.model_type, **row.overrides).to_dict())
    counts = Counter(kind_label(layer.spec) for layer in model.layers)
    counts.update(kind_label(c.spec) for c in model.cacheless)
    assert dict(counts) == row.counts
    for kind, expected in row.specs.items():
        assert {signature(layer.spec) for layer in model.layers if kind_label(layer.spec) == kind} == {expected}


def test_family_table_kinds_match_what_the_reader_finds():
    """The kinds `graphkv models` lists for a family are the kinds its reference config reads as."""
    for family in FAMILIES:
        assert set(family.kinds) == set(BY_TYPE[family.model_type].counts), family.model_type


def test_gemma3n_shared_layers_read_the_last_earlier_layer_of_their_type():
    """Gemma-3n: layers 20-34 hold no KV; sliding ones read layer 18, full ones (24, 29, 34) read layer 19."""
    model = read("gemma3n_text")
    sources = {c.index: c.spec.source for c in model.cacheless}
    assert sorted(sources) == list(range(20, 35))
    assert {i for i, s in sources.items() if s == "layers.19"} == {24, 29, 34}
    assert {i for i, s in sources.items() if s == "layers.18"} == set(range(20, 35)) - {24, 29, 34}
    assert [layer.index for layer in model.layers] == list(range(20))


def test_longcat_flash_saved_with_num_hidden_layers_reads_as_its_num_layers():
    """LongCat-Flash saved with num_hidden_layers = 2 x num_layers (28 layers) reads as 56 MLA entries, not 112."""
    config = reference_config("longcat_flash").to_dict()
    model = model_from_hf_config({**config, "num_hidden_layers": 2 * config["num_layers"]})
    assert Counter(kind_label(layer.spec) for layer in model.layers) == {"mla": 2 * config["num_layers"]}


def test_two_entry_layers_keep_their_layer_index():
    """DeepSeek-V3.2: layer i holds layers.i (MLA) and layers.i.indexer (index 61 + i, layer_index i)."""
    model = read("deepseek_v32")
    indexer = [layer for layer in model.layers if isinstance(layer.spec, IndexerKeySpec)]
    assert [(x.name, x.index, x.model_layer) for x in indexer[:2]] == [("layers.0.indexer", 61, 0),
                                                                       ("layers.1.indexer", 62, 1)]
    falcon = read("falcon_h1")
    assert [(x.name, x.model_layer) for x in falcon.layers if x.spec.is_ssm][:2] == [("layers.0.mamba2", 0),
                                                                                     ("layers.1.mamba2", 1)]


@pytest.mark.parametrize(("outer", "text"), [("gemma3", "gemma3_text"), ("gemma3n", "gemma3n_text"),
                                             ("gemma4", "gemma4_text"), ("llama4", "llama4_text"),
                                             ("qwen3_5", "qwen3_5_text"), ("qwen3_5_moe", "qwen3_5_moe_text")])
def test_multimodal_config_plans_its_text_config(outer: str, text: str):
    """A multimodal config reads as its text model: same kinds, counts and shapes as the text family's row."""
    model = read(outer)
    row = BY_TYPE[text]
    counts = Counter(kind_label(layer.spec) for layer in model.layers)
    counts.update(kind_label(c.spec) for c in model.cacheless)
    assert dict(counts) == row.counts
    assert "text_config" in model.notes[0]


@pytest.mark.parametrize(("model_type", "family", "kv", "head", "layers"), [
    ("fuyu", "persimmon", 64, 64, 36),  # a Persimmon text_config: 4096 / 64, MHA
    ("got_ocr2", "qwen2", 16, 64, 24),  # a Qwen2 text_config: 1024 / 16
    ("moss_transcribe_diarize", "qwen3", 8, 128, 28),  # a Qwen3 text_config with head_dim 128
])
def test_unlisted_wrapper_plans_its_text_config_by_the_text_family(model_type: str, family: str, kv: int, head: int,
                                                                  layers: int):
    """A multimodal wrapper graphkv does not list plans from its text_config, read as that config's family."""
    model = read(model_type)
    assert len(model.layers) == layers
    assert {signature(layer.spec) for layer in model.layers} == {(kv, head, head, None)}
    assert f"read text_config of {model_type} as family {family}" in model.notes[0]


_JUNK = [None, "x", -1, 0, 2.5, True, [], {}, [1], 10 ** 9]


@pytest.mark.parametrize("model_type", ["gemma3n_text", "deepseek_v32", "falcon_h1", "kimi_linear", "minimax",
                                        "lfm3", "zamba2", "mimo_v2_flash", "llama4_text", "gemma4_text"])
def test_junk_in_any_field_of_a_new_kind_gives_a_model_or_a_spec_error(model_type: str):
    """Replacing any field of these configs with junk never lets a raw exception escape the reader."""
    from graphkv.errors import SpecError

    base = reference_config(model_type).to_dict()
    for key in [k for k in base if not k.startswith("_") and k not in ("id2label", "label2id")]:
        for junk in _JUNK:
            try:
                model = model_from_hf_config({**base, key: junk}, tp=2)
            except SpecError:
                continue
            assert all(all(d > 0 for d in shape) for layer in model.layers if layer.spec.is_ssm
                       for shape in layer.spec.shapes)


def test_nemotron_h_saved_by_transformers_5_reads_like_the_original_config():
    """transformers 5 saves Nemotron-H-8B as layers_block_type without num_hidden_layers: same entries as the preset."""
    from graphkv.presets import load_preset_config

    original = load_preset_config("nemotron-h-8b")
    saved = reference_config(
        "nemotron_h", hybrid_override_pattern=original["hybrid_override_pattern"], num_hidden_layers=52,
        hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, mamba_num_heads=128,
        mamba_head_dim=64, n_groups=8, ssm_state_size=128, conv_kernel=4, chunk_size=128).to_dict()
    assert "hybrid_override_pattern" not in saved and "num_hidden_layers" not in saved
    assert len(saved["layers_block_type"]) == 52
    old, new = model_from_hf_config(original), model_from_hf_config(saved)
    assert new.layers == old.layers and new.cacheless == old.cacheless
    assert [x.index for x in new.layers if not x.spec.is_ssm] == [7, 18, 29, 40]
