"""Every new layer kind through the whole planner: groups, capacity, ledger, layout, report and JSON."""

from __future__ import annotations

import json

from graphkv import (Budget, CachelessDecl, FullAttentionSpec, IndexerKeySpec, KVSharedSpec, LayerDecl, Limits,
                     MambaSpec, MLASpec, ModelKV, NoCacheSpec, SlidingWindowSpec, compile_plan)
from graphkv.presets import load_preset_config, preset_model
from graphkv.report import format_plan
from graphkv.spec.hf_config import model_from_hf_config

GIB = Budget.kv_bytes("1GiB")


def dsv32(layers: int = 4) -> ModelKV:
    """DeepSeek-V3.2's layout on a few layers: MLA 512 + 64 and 132-byte indexer keys per layer."""
    config = {**load_preset_config("deepseek-v3"), "num_hidden_layers": layers, "index_head_dim": 128,
              "layer_types": ["indexed_attention"] * layers}
    return model_from_hf_config(config)


def test_mla_with_indexer_keys_is_one_group_with_a_slot_per_cache():
    """MLA latents and indexer keys keep every token: one group, 2 x layers slots sized to their own pages."""
    plan = compile_plan(dsv32(), Limits(max_model_len=4096), GIB)
    assert plan.block_size == 64 and plan.kernel_block_sizes == (64,)
    # 64 tokens x 576 x 2 B = 73728 B latent; 64 x 132 x 1 B = 8448 B indexer keys
    assert [s.page_size_bytes for s in plan.slots] == [73728] * 4 + [8448] * 4
    assert plan.pool_bytes_per_block == 4 * (73728 + 8448)
    assert plan.groups[0].pages_per_request == 4096 // 64
    assert plan.ledger.kv_total_bytes == plan.ledger.budget_bytes
    assert {g.backends for g in plan.groups} == {("flashmla", "indexer")}


def test_json_says_what_every_layer_became():
    """--json: a top-level layers list (index, name, kind, group, kv_source) and spec objects with spec_text."""
    data = json.loads(json.dumps(compile_plan(dsv32(2), Limits(max_model_len=4096), GIB).to_dict()))
    assert data["layers"] == [
        {"index": 0, "name": "layers.0", "kind": "mla", "group": 0, "kv_source": "layers.0"},
        {"index": 0, "name": "layers.0.indexer", "kind": "indexer", "group": 0, "kv_source": "layers.0.indexer"},
        {"index": 1, "name": "layers.1", "kind": "mla", "group": 0, "kv_source": "layers.1"},
        {"index": 1, "name": "layers.1.indexer", "kind": "indexer", "group": 0, "kv_source": "layers.1.indexer"}]
    assert data["groups"][0]["spec"] == {"kind": "mla", "kv_lora_rank": 512, "rope_dim": 64, "num_kv_heads": 1,
                                         "head_size": 576, "dtype": "bfloat16"}
    assert data["groups"][0]["spec_text"] == "mla 512+64 bfloat16"


def test_state_spec_json_has_shapes_and_dtypes():
    """A state group's spec object names the variant, state shapes and state dtypes."""
    plan = compile_plan(preset_model("qwen3-next-80b-a3b"), Limits(max_model_len=8192, max_num_seqs=16), GIB)
    spec = plan.to_dict()["groups"][0]["spec"]
    assert spec == {"kind": "mamba", "variant": "gated_delta", "state_shapes": [[3, 8192], [32, 128, 128]],
                    "state_dtypes": ["bfloat16", "bfloat16"], "chunk_size": 64, "page_size_padded": 1114112}
    sliding = compile_plan(preset_model("gpt-oss-20b"), Limits(max_model_len=8192), GIB).to_dict()["groups"][0]
    assert sliding["spec"] == {"kind": "sliding_window", "num_kv_heads": 8, "head_size": 64, "head_size_v": 64,
                               "dtype": "bfloat16", "sliding_window": 128}


def test_layers_that_hold_nothing_are_listed_with_no_group():
    """Nemotron-H's MLP layers appear in --json with kind none, group null and kv_source null; the report counts them."""
    plan = compile_plan(preset_model("nemotron-h-8b"), Limits(max_model_len=8192, max_num_seqs=128),
                        Budget.kv_bytes("20GiB"))
    layers = plan.to_dict()["layers"]
    assert len(layers) == 52 and [x["index"] for x in layers] == list(range(52))
    assert layers[1] == {"index": 1, "name": "layers.1", "kind": "none", "group": None, "kv_source": None}
    assert {x["group"] for x in layers if x["kind"] == "mamba"} == set(range(6))
    report = format_plan(plan, budget_text=None)
    assert "28 KV layers: 24 mamba, 4 full_attention; 24 layers without a cache: 24 hold nothing (MLP / MoE)" in report


def test_kv_shared_layers_read_their_source_and_take_no_pages():
    """KV-shared layers are in no group and no slot; the plan lists their source; pages are those of the holders."""
    attn = SlidingWindowSpec(num_kv_heads=2, head_size=256, window=512)
    model = ModelKV(name="shared", layers=[LayerDecl(index=0, name="layers.0", spec=attn, backend="flash_attn")],
                    cacheless=[CachelessDecl(index=1, name="layers.1", spec=KVSharedSpec(source="layers.0")),
                               CachelessDecl(index=2, name="layers.2", spec=NoCacheSpec(role="mlp"))],
                    max_position_embeddings=32768)
    plan = compile_plan(model, Limits(max_num_batched_tokens=2048), GIB)
    assert [g.layers for g in plan.groups] == [(0,)] and [s.layers for s in plan.slots] == [(0,)]
    assert plan.to_dict()["layers"][1] == {"index": 1, "name": "layers.1", "kind": "kv_shared", "group": None,
                                           "kv_source": "layers.0"}
    assert "1 read earlier layers’ KV, 1 hold nothing (MLP / MoE)" in format_plan(plan, budget_text=None)


def test_gemma3n_plans_only_the_first_twenty_layers():
    """Gemma-3n-E4B-like: 20 of 35 layers hold KV (16 sliding, 4 full); the plan's pages come from them alone."""
    types = (["sliding_attention"] * 4 + ["full_attention"]) * 7
    config = {"architectures": ["Gemma3nForCausalLM"], "model_type": "gemma3n_text", "num_hidden_layers": 35,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "hidden_size": 2048,
              "sliding_window": 512, "layer_types": types, "num_kv_shared_layers": 15,
              "max_position_embeddings": 32768}
    plan = compile_plan(model_from_hf_config(config), Limits(max_num_batched_tokens=2048), GIB)
    # buckets: 16 sliding, 4 full -> gs = 4: 4 sliding groups + 1 full group, 4 slots
    assert sorted(len(g.layers) for g in plan.groups) == [4] * 5 and plan.group_size == 4
    assert sum(x["group"] is None for x in plan.to_dict()["layers"]) == 15
    # per request at 32768: full cdiv(32768, 16) = 2048; sliding 4 x (cdiv(511 + 4096, 16) + 1) = 4 x 289
    assert plan.capacity.pages_per_request == 2048 + 4 * 289


def test_parallel_hybrid_layer_holds_attention_and_state():
    """Falcon-H1-like: every layer holds an attention entry and a Mamba2 entry, in two groups sharing slots."""
    config = {"architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 512,
              "mamba_d_ssm": 512, "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 16,
              "mamba_d_conv": 4, "max_position_embeddings": 4096}
    plan = compile_plan(model_from_hf_config(config), Limits(max_num_seqs=4, max_num_batched_tokens=256), GIB)
    assert [(g.kind.value, g.layers) for g in plan.groups] == [("full_attention", (0, 1, 2, 3)),
                                                              ("mamba", (4, 5, 6, 7))]
    layers = plan.to_dict()["layers"]
    assert [(x["index"], x["name"], x["group"]) for x in layers[:2]] == [(0, "layers.0", 0), (0, "layers.0.mamba2", 1)]
    # state: conv (3, 512 + 2 x 16) bf16 = 3264 B + ssm (8, 64, 16) bf16 = 16384 B -> 19648 B;
    # A1 = 2 x 128 x 2 = 512 B/token -> block 16 x cdiv(19648, 8192) = 48
    assert plan.block_size == 48 and plan.block.mamba_state_bytes == 19648


def test_v_head_size_different_from_k_plans_its_page():
    """MiMo-V2-like K 192 / V 128: page = block x heads x (192 + 128) x 2 bytes."""
    spec = FullAttentionSpec(num_kv_heads=4, head_size=192, head_size_v=128)
    plan = compile_plan(ModelKV.from_specs("mimo", [(spec, "flash_attn")]), Limits(max_model_len=4096), GIB)
    assert plan.groups[0].page_size_bytes == 16 * 4 * 320 * 2
    assert plan.to_dict()["groups"][0]["spec"]["head_size_v"] == 128


def test_state_variants_align_their_pages_with_attention():
    """KDA, lightning and short-conv states are padded to the attention page like Mamba states."""
    attn = FullAttentionSpec(num_kv_heads=2, head_size=128)  # 1024 B/token
    cases = [
        # KDA: 3 x 1536 x 2 + 4 x 128 x 128 x 4 = 9216 + 262144 = 271360 B -> 16 x cdiv(271360, 16384) = 272
        (MambaSpec(shapes=((3, 1536), (4, 128, 128)), dtypes=("bfloat16", "float32"), variant="kda"), "kda", 272),
        # lightning: 4 x 128 x 128 x 2 = 131072 B -> 16 x 8 = 128
        (MambaSpec(shapes=((4, 128, 128),), dtypes=("bfloat16",), variant="lightning"), "lightning", 128),
        # short conv: 2 x 2048 x 2 = 8192 B -> 16 x 1 = 16
        (MambaSpec(shapes=((2, 2048),), dtypes=("bfloat16",), variant="short_conv"), "short_conv", 16),
    ]
    for state, backend, block in cases:
        model = ModelKV.from_specs("h", [(state, backend)] * 3 + [(attn, "flash_attn")],
                                   max_position_embeddings=8192)
        plan = compile_plan(model, Limits(max_num_seqs=8, max_num_batched_tokens=1024), GIB)
        assert plan.block_size == block, state.variant
        assert plan.block.mamba_page_bytes == block * 1024
        assert plan.ledger.kv_total_bytes == plan.ledger.budget_bytes


def test_lightning_backend_limits_cuda_graphs_to_single_token_decode():
    """MiniMax's lightning backend captures uniform single-token decode only: speculative decode is downgraded."""
    attn = FullAttentionSpec(num_kv_heads=2, head_size=128)
    state = MambaSpec(shapes=((4, 128, 128),), dtypes=("bfloat16",), variant="lightning")
    plan = compile_plan(ModelKV.from_specs("m", [(state, "lightning"), (attn, "flash_attn")],
                                           max_position_embeddings=4096),
                        Limits(max_num_seqs=8, max_num_batched_tokens=1024, num_speculative_tokens=1), GIB)
    assert plan.cudagraph.support.name == "UNIFORM_SINGLE_TOKEN_DECODE"
    assert plan.cudagraph.mode.value == "PIECEWISE"


def test_indexer_spec_page_formula():
    """IndexerKeySpec: block x head bytes; MLA: block x (rank + rope) x 2."""
    assert IndexerKeySpec(head_size=132).page_size_bytes(64) == 8448
    assert MLASpec(kv_lora_rank=256, rope_dim=32).page_size_bytes(64) == 64 * 288 * 2
