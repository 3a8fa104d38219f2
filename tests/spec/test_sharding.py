"""Tensor-parallel sharding in the descriptors: split rules, ModelKV.shard and the reader built on it."""

from __future__ import annotations

import pytest

from graphkv import Budget, FullAttentionSpec, Limits, MambaSpec, MLASpec, ModelKV, SpecError, compile_plan
from graphkv.presets import list_presets, load_preset_config, preset_model
from graphkv.spec.hf_config import model_from_hf_config
from graphkv.spec.layers import IndexerKeySpec, StateSplit
from graphkv.spec.split_rules import HeadSplit, Refusal, SplitRule, split_count


def attention_model(kv_heads: int, layers: int = 2) -> ModelKV:
    """A full-attention model with ``kv_heads`` KV heads of 128 (every head: unsharded)."""
    spec = FullAttentionSpec(num_kv_heads=kv_heads, head_size=128)
    return ModelKV.from_specs("attn", [(spec, "flash_attn")] * layers, max_position_embeddings=4096)


@pytest.mark.parametrize(("total", "tp", "rule", "expected"), [
    (8, 2, SplitRule.KV_HEADS, HeadSplit(per_rank=4)),
    (2, 4, SplitRule.KV_HEADS, HeadSplit(per_rank=1, replicas=2)),
    (1, 8, SplitRule.KV_HEADS, HeadSplit(per_rank=1, replicas=8)),
    (8, 8, SplitRule.GROUPS, HeadSplit(per_rank=1)),
    (1, 4, SplitRule.GROUPS, HeadSplit(per_rank=1, replicas=4)),
    (32, 4, SplitRule.DIVIDE, HeadSplit(per_rank=8)),
])
def test_split_count_follows_vllm_rules(total, tp, rule, expected):
    """Counts divide; KV heads fewer than tp replicate (tp / heads ranks each); one Mamba2 group replicates."""
    assert split_count(total, tp, rule) == expected


@pytest.mark.parametrize(("total", "tp", "rule", "limit"), [
    (8, 3, SplitRule.KV_HEADS, "must be divisible by tp=3"),
    (4, 6, SplitRule.KV_HEADS, "tp to be a multiple of 4"),
    (6, 4, SplitRule.GROUPS, "or be 1 (one group is replicated on every rank)"),
    (16, 3, SplitRule.DIVIDE, "must be divisible by tp=3"),
])
def test_split_count_refuses_with_the_limit(total, tp, rule, limit):
    """A count tp cannot split is refused with a limit saying why and a fix."""
    refusal = split_count(total, tp, rule)
    assert isinstance(refusal, Refusal) and limit in refusal.limit and refusal.fix


def test_two_kv_heads_at_tp_four_keep_one_replicated_head_per_rank():
    """2 KV heads at tp 4: every rank keeps 1 head, each head held by 2 consecutive ranks."""
    whole = attention_model(kv_heads=2)
    ranks = [whole.shard(4, r) for r in range(4)]
    assert [m.layers[0].spec.num_kv_heads for m in ranks] == [1, 1, 1, 1]
    assert [m.layers[0].tp_replicas for m in ranks] == [2, 2, 2, 2]
    assert [m.tensor_parallel_rank for m in ranks] == [0, 1, 2, 3]
    assert ranks[0].kv_tp_replicas == 2 and {m.layers for m in ranks} == {ranks[0].layers}


def test_qwen3_next_at_tp_four_plans_block_size_272():
    """Qwen3-Next at tp 4: 2 KV heads replicate to 1 of 256 (1024 B/token), a 274432 B state -> 16 x 17 = 272."""
    rank = preset_model("qwen3-next-80b-a3b").shard(4, 2)
    plan = compile_plan(rank, Limits(), Budget.kv_bytes("20GiB"))
    assert rank.layers[0].spec.shapes == ((3, 2048), (8, 128, 128))
    assert plan.block_size == 272 and plan.group_size == 12


@pytest.mark.parametrize("preset", list_presets())
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_reader_tp_equals_shard_of_the_whole_model(preset, tp):
    """from_hf_config(config, tp=N) is exactly from_hf_config(config).shard(N, 0) for every preset."""
    config = load_preset_config(preset)
    assert model_from_hf_config(config, tp=tp) == model_from_hf_config(config).shard(tp, 0)


def test_mla_latent_and_indexer_keys_stay_whole_on_every_rank():
    """MLA latents and indexer keys are not split: each of 8 ranks keeps all 576 / 132 elements (8 replicas)."""
    whole = ModelKV.from_specs("dsv32", [(MLASpec(kv_lora_rank=512, rope_dim=64), "flashmla"),
                                         (IndexerKeySpec(head_size=132), "indexer")])
    rank = whole.shard(8, 5)
    assert [x.spec for x in rank.layers] == [x.spec for x in whole.layers]
    assert [x.tp_replicas for x in rank.layers] == [8, 8] and rank.kv_tp_replicas == 8


def test_mamba2_single_group_is_replicated_like_vllm():
    """Nemotron-H with n_groups=1 at tp 4: conv 8192/4 + 2 x 1 x 128 = 2304 channels, ssm 128/4 heads."""
    whole = model_from_hf_config({**load_preset_config("nemotron-h-8b"), "n_groups": 1})
    state = next(x.spec for x in whole.shard(4, 3).layers if x.spec.is_ssm)
    assert state.shapes == ((3, 2304), (32, 64, 128)) and state.tp_split is None


def test_state_split_formulas_at_tp_one_give_the_shapes():
    """Each variant's StateSplit gives vLLM 0.33's unsplit shapes at tp=1 and divided ones at tp=2."""
    cases = [
        (StateSplit.mamba1(inner=8192, state=16, conv_kernel=4), ((3, 8192), (8192, 16)), ((3, 4096), (4096, 16))),
        (StateSplit.mamba2(heads=128, head_dim=64, state=128, groups=8, conv_kernel=4),
         ((3, 10240), (128, 64, 128)), ((3, 5120), (64, 64, 128))),
        (StateSplit.kda(heads=32, head_dim=128, conv_kernel=4), ((3, 12288), (32, 128, 128)),
         ((3, 6144), (16, 128, 128))),
        (StateSplit.lightning(heads=64, head_dim=96), ((64, 96, 96),), ((32, 96, 96),)),
        (StateSplit.short_conv(channels=2048, conv_kernel=3), ((2, 2048),), ((2, 1024),)),
    ]
    for split, whole, half in cases:
        assert (split.shapes_per_rank(1), split.shapes_per_rank(2)) == (whole, half)


def test_shard_names_every_count_tp_cannot_split():
    """6 KV heads at tp 4 and a state without tp_split are both named, with the layer they belong to."""
    state = MambaSpec(shapes=((3, 64), (4, 16, 16)), dtypes=("bfloat16", "bfloat16"))
    model = ModelKV.from_specs("bad", [(FullAttentionSpec(num_kv_heads=6, head_size=64), "flash_attn"),
                                       (state, "mamba")])
    with pytest.raises(SpecError) as info:
        model.shard(4, 0)
    fields = [p.field for p in info.value.problems]
    assert fields == ["layers.0.num_kv_heads", "layers.1.tp_split"]
    assert info.value.problems[0].value == 6 and "must be divisible by tp=4" in info.value.problems[0].limit


def test_split_errors_name_the_config_fields_they_came_from():
    """A whole model read from a config names the config field when a later shard cannot split it."""
    whole = preset_model("qwen3-next-80b-a3b")
    with pytest.raises(SpecError) as info:
        whole.shard(3, 0)
    assert {p.field for p in info.value.problems} >= {"config.linear_num_key_heads", "config.linear_num_value_heads"}


@pytest.mark.parametrize(("call", "field"), [
    (lambda m: m.shard(2, 2), "tp_rank"),
    (lambda m: m.shard(0, 0), "tp_size"),
    (lambda m: m.shard(2, 0).shard(2, 0), "model"),
    (lambda m: m.shard(True, 0), "tp_size"),
])
def test_bad_shard_arguments_are_spec_errors(call, field):
    """A rank out of range, a zero or bool size, or sharding twice is a SpecError naming the argument."""
    with pytest.raises(SpecError) as info:
        call(attention_model(kv_heads=8))
    assert info.value.problems[0].field == field


def test_tp_split_must_match_the_shapes():
    """A StateSplit describing other shapes than the spec's is refused at construction."""
    with pytest.raises(SpecError, match=r"MambaSpec\.tp_split.*must describe shapes"):
        MambaSpec(shapes=((3, 100),), dtypes=("bfloat16",), variant="short_conv",
                  tp_split=StateSplit.short_conv(channels=200, conv_kernel=4))
