"""Pipeline stages: vLLM's layer partition, ModelKV.stage, and a stage's plan holding only its layers' pages."""

from __future__ import annotations

import pytest

from graphkv import (Budget, CachelessDecl, FullAttentionSpec, KVSharedSpec, LayerDecl, Limits, MambaSpec, ModelKV,
                     SlidingWindowSpec, SpecError, compile_plan)
from graphkv.presets import preset_model
from graphkv.spec.stages import layer_partition

GIB20 = Budget.kv_bytes("20GiB")


@pytest.mark.parametrize(("layers", "pp", "expected"), [
    (32, 2, (16, 16)),
    (33, 4, (8, 8, 9, 8)),  # one left over: the second-to-last stage takes it
    (35, 4, (9, 9, 9, 8)),  # three left over: every stage but the last
    (45, 4, (11, 11, 12, 11)),  # vLLM 0.33's GLM-5 PP=4 test: [11, 11, 12, 11]
    (61, 8, (7, 7, 8, 8, 8, 8, 8, 7)),  # DeepSeek-V3's 61 layers: five left over
    (4, 1, (4,)),
])
def test_default_partition_is_vllms(layers, pp, expected):
    """layer_partition spreads the remainder over the stages before the last, as vLLM's get_pp_indices."""
    assert layer_partition(layers, pp) == expected


def test_two_stage_llama_holds_sixteen_layers_and_only_their_pages():
    """Llama-3.1-8B in 2 stages: 16 layers each, a page index of 16 pages (not 32), twice the pages of 1 stage."""
    whole = preset_model("llama-3.1-8b")
    one = compile_plan(whole, Limits(), GIB20)
    stages = [compile_plan(whole.stage(2, k), Limits(), GIB20) for k in range(2)]
    page = 16 * 8 * 256 * 2  # 16 tokens x 8 KV heads x (128 + 128) x bf16 = 65536 B
    assert [len(p.layers) for p in stages] == [16, 16]
    assert [p.groups[0].layers for p in stages] == [tuple(range(16)), tuple(range(16, 32))]
    assert [p.pool_bytes_per_block for p in stages] == [16 * page, 16 * page] and one.pool_bytes_per_block == 32 * page
    assert [p.num_blocks for p in stages] == [20480, 20480] and one.num_blocks == 10240


def test_stages_keep_the_whole_models_block_size_and_groups():
    """Jamba in 8 stages: every stage pages at the whole model's 80 tokens (a stage of 4 Mamba layers alone would
    not grow to 80) and keeps all 8 groups, some empty, so a request needs the same pages on every stage."""
    whole = preset_model("jamba-mini-1.5")
    limits = Limits(max_num_seqs=16, max_model_len=65536)
    plans = [compile_plan(whole.stage(8, k), limits, GIB20) for k in range(8)]
    assert {p.block_size for p in plans} == {80} and {len(p.groups) for p in plans} == {8}
    assert [len(g.layers) for g in plans[0].groups] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert {p.capacity.pages_per_request for p in plans} == {7 + 820}  # 7 state groups x 1 + cdiv(65536, 80)


def test_max_concurrent_batches_follows_the_stages():
    """gpt-oss-20b at 2048 tokens per step: 2 stages keep 3 steps in flight: cdiv(127 + 3 x 2048, 16) + 1 = 393."""
    whole = preset_model("gpt-oss-20b")
    limits = Limits(max_num_batched_tokens=2048, max_model_len=32768)
    plan = compile_plan(whole.stage(2, 1), limits, GIB20)
    sliding = next(g for g in plan.groups if g.kind.value == "sliding_window")
    assert plan.limits.max_concurrent_batches == 3 and sliding.pages_per_request == 393
    synchronous = compile_plan(whole.stage(2, 1), Limits(max_num_batched_tokens=2048, max_model_len=32768,
                                                          max_concurrent_batches=2), GIB20)
    assert next(g for g in synchronous.groups if g.kind.value == "sliding_window").pages_per_request == 265


def test_explicit_partition_like_vllm_pp_layer_partition():
    """partition=[10, 22] puts layers 0-9 on stage 0 and 10-31 on stage 1."""
    whole = preset_model("llama-3.1-8b")
    first, second = whole.stage(2, 0, [10, 22]), whole.stage(2, 1, [10, 22])
    assert (len(first.layers), len(second.layers)) == (10, 22)
    assert (second.pipeline.start_layer, second.pipeline.end_layer, second.pipeline.partition) == (10, 32, (10, 22))


@pytest.mark.parametrize(("args", "field", "limit"), [
    ((2, 0, [10, 10]), "partition", "summing to the model's 32 layers"),
    ((2, 0, [32]), "partition", "must list 2 layer counts"),
    ((2, 2, None), "pp_rank", "must be < pp_size=2"),
    ((64, 1, None), "pp_size", None),  # 64 stages of a 32-layer model: stage 1 of them holds no layer
    ((0, 0, None), "pp_size", "must be an integer >= 1"),
    ((2, 1, [32, 0]), "partition", None),  # stage 1 would hold nothing: refused when asked for
])
def test_bad_stage_arguments_name_the_field(args, field, limit):
    """A bad partition, rank or size is a SpecError naming it (a stage without cache layers too)."""
    pp, rank, partition = args
    with pytest.raises(SpecError) as info:
        preset_model("llama-3.1-8b").stage(pp, rank, partition)
    assert info.value.problems[0].field == field
    assert limit is None or limit in info.value.problems[0].limit


def test_a_stage_cannot_be_staged_again():
    """Staging a stage is refused: stages are cut from the whole model."""
    with pytest.raises(SpecError, match="is already pipeline stage 0 of 2"):
        preset_model("llama-3.1-8b").stage(2, 0).stage(2, 0)


def test_kv_sharing_across_stages_is_refused():
    """A layer reading the KV of a layer on another stage cannot be split off: the error names both."""
    spec = FullAttentionSpec(num_kv_heads=2, head_size=64)
    model = ModelKV(name="shared", layers=[LayerDecl(index=i, name=f"layers.{i}", spec=spec, backend="flash_attn")
                                           for i in range(3)],
                    cacheless=[CachelessDecl(index=3, name="layers.3", spec=KVSharedSpec(source="layers.0"))])
    with pytest.raises(SpecError, match=r"layers\.3 on stage 1 but the layer whose KV cache it reads, layers\.0"):
        model.stage(2, 1)


def test_hybrid_stage_with_an_empty_group_plans_and_allocates_its_pages():
    """2 Mamba + 2 sliding layers in 2 stages: stage 0 keeps the sliding group with no layer; both need 1 + 9 pages."""
    state = MambaSpec(shapes=((3, 64), (2, 16, 16)), dtypes=("float32", "float32"))
    sliding = SlidingWindowSpec(num_kv_heads=2, head_size=32, window=64, dtype="float32")
    model = ModelKV.from_specs("h", [(state, "mamba")] * 2 + [(sliding, "flex")] * 2, max_position_embeddings=1024)
    limits = Limits(max_model_len=1024, max_num_seqs=4, max_num_batched_tokens=64, max_concurrent_batches=1)
    plans = [compile_plan(model.stage(2, k), limits, Budget.kv_bytes("1MiB")) for k in range(2)]
    assert [[g.layers for g in p.groups] for p in plans] == [[(0, 1), ()], [(), (2, 3)]]
    assert [p.capacity.pages_per_request for p in plans] == [1 + 9, 1 + 9]  # cdiv(63 + 64, 16) + 1 = 9
    assert plans[0].ledger.kv_total_bytes == plans[0].ledger.budget_bytes
