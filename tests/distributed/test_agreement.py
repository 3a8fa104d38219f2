"""The agreement rule in one process: minimum pages and length, mismatches named, vLLM 0.33's multi-worker cases.

The vLLM cases port the numbers of ``tests/v1/core/test_kv_cache_utils.py``
(``test_get_kv_cache_configs_multiple_workers``, ``test_get_kv_cache_configs_pp_sharding``,
``test_project_kv_cache_groups_to_worker``) and the semantics of vLLM 0.33's
``kv_cache_groups_tp_replicas``; specs are vLLM's test specs (16-token pages, 2 KV heads of 64,
float32: 16384 B per page).
"""

from __future__ import annotations

import attrs
import pytest

from graphkv import (Budget, ConsensusError, FullAttentionSpec, IndexerKeySpec, Limits, MambaSpec, MLASpec, ModelKV,
                     SlidingWindowSpec, SpecError)
from graphkv.distributed import agree, budget_report, rank_models, simulate_consensus
from graphkv.plan.groups import build_groups
from graphkv.plan.stage_groups import project_grouping
from graphkv.presets import preset_model
from graphkv.spec.layers import StateSplit

PAGE = 16 * 2 * 64 * 2 * 4  # vLLM's new_kv_cache_spec(): 16 tokens x 2 heads x (64 + 64) x float32
FULL = FullAttentionSpec(num_kv_heads=2, head_size=64, dtype="float32")
SLIDING = SlidingWindowSpec(num_kv_heads=2, head_size=64, dtype="float32", window=1)
LEN16 = Limits(max_model_len=16)


def model(*specs, tp_heads: int = 1) -> ModelKV:
    """Layers ``layers.0..`` of ``specs`` (whole model, KV heads multiplied by ``tp_heads`` so a shard has vLLM's 2)."""
    scaled = [attrs.evolve(s, num_kv_heads=s.num_kv_heads * tp_heads) for s in specs]
    return ModelKV.from_specs("vllm-case", [(s, "flash_attn") for s in scaled], max_position_embeddings=4096)


def budgets(*pages: int):
    """Per-rank budgets of ``pages[rank] x PAGE`` bytes."""
    return lambda rank, _model: Budget(kv_cache_bytes=pages[rank] * PAGE)


def test_vllm_two_workers_same_specs_and_memory():
    """vLLM: 2 TP workers, 2 full layers, memory 2 x 10 pages each -> 10 blocks, one group of both layers."""
    agreed = simulate_consensus(model(FULL, FULL, tp_heads=2), LEN16, budgets(20, 20), tp_size=2)
    assert agreed.num_blocks == 10 and agreed.stages[0].groups[0].layers == (0, 1)
    assert agreed.stages[0].groups[0].page_size_bytes == PAGE


def test_vllm_tp_workers_with_different_memory_use_the_smallest():
    """vLLM: the TP case with 20 and 40 pages of memory -> both workers use 10 blocks."""
    agreed = simulate_consensus(model(FULL, FULL, tp_heads=2), LEN16, budgets(20, 40), tp_size=2)
    assert agreed.num_blocks == 10 and [r.num_blocks for r in agreed.ranks] == [10, 20]
    assert agreed.num_blocks_reason.startswith("the smallest of 2 ranks' own counts: rank 0 (tp 0, pp 0)")


def test_vllm_pp_workers_with_different_layers():
    """vLLM: worker 0 holds layer1, worker 1 layers 2-3, 20 pages each -> 20 and 10 blocks, agreed 10."""
    agreed = simulate_consensus(model(FULL, FULL, FULL), LEN16, budgets(20, 20), tp_size=1, pp_size=2,
                                partition=[1, 2])
    assert [r.num_blocks for r in agreed.ranks] == [20, 10] and agreed.num_blocks == 10
    assert [p.groups[0].layers for p in agreed.stages] == [(0,), (1, 2)]
    assert [p.pool_bytes_per_block for p in agreed.stages] == [PAGE, 2 * PAGE]


def test_vllm_tp_and_pp_workers():
    """vLLM: TP 2 x PP 2, layers 1-2 on stage 0 and layer 3 on stage 1, 20 pages each -> 10 blocks everywhere."""
    agreed = simulate_consensus(model(FULL, FULL, FULL, tp_heads=2), LEN16, budgets(20, 20, 20, 20), tp_size=2,
                                pp_size=2, partition=[2, 1])
    assert [(r.tp_rank, r.pp_rank, r.num_blocks) for r in agreed.ranks] == [(0, 0, 10), (1, 0, 10), (0, 1, 20),
                                                                            (1, 1, 20)]
    assert agreed.num_blocks == 10 and [p.groups[0].layers for p in agreed.stages] == [(0, 1), (2,)]


def test_vllm_hybrid_pp_keeps_empty_groups():
    """vLLM: full layers on worker 0, sliding on worker 1: each keeps both groups, the other's empty; 10 blocks."""
    agreed = simulate_consensus(model(FULL, FULL, SLIDING, SLIDING), LEN16, budgets(20, 20), tp_size=1, pp_size=2)
    assert [[g.layers for g in p.groups] for p in agreed.stages] == [[(0, 1), ()], [(), (2, 3)]]
    assert agreed.num_blocks == 10


def test_vllm_pp_groups_keep_similar_layer_counts():
    """vLLM: 1 full + 2 sliding per worker, 10 pages each: groups full [l1, l4], sliding [l2, l5], [l3, l6]."""
    whole = model(FULL, SLIDING, SLIDING, FULL, SLIDING, SLIDING)
    agreed = simulate_consensus(whole, LEN16, budgets(10, 10), tp_size=1, pp_size=2)
    assert [[g.layers for g in p.groups] for p in agreed.stages] == [[(0,), (1,), (2,)], [(3,), (4,), (5,)]]
    assert agreed.num_blocks == 10 and {p.pool_bytes_per_block for p in agreed.stages} == {PAGE}


def test_vllm_conflicting_layer_specs_are_refused():
    """vLLM: layer1 full on one worker and sliding on the other -> refused; graphkv names the layer and ranks."""
    ranks = [model(FULL, tp_heads=2).shard(2, 0), model(SLIDING, tp_heads=2).shard(2, 1)]
    reports = [budget_report(m, LEN16, Budget(kv_cache_bytes=20 * PAGE), rank=r) for r, m in enumerate(ranks)]
    with pytest.raises(ConsensusError) as info:
        agree(reports)
    problem = info.value.problems[0]
    assert problem.field == "model.layers[layers.0]" and "rank(s) [1]" in problem.limit
    assert "rank 0: full_attention 2x64" in problem.value and "rank 1: sliding_window 2x64" in problem.value


@pytest.mark.parametrize("pages", [(33, 33), (33, 66)], ids=["symmetric", "asymmetric"])
def test_vllm_pp_sharding_plans_each_worker_for_its_own_layers(pages):
    """vLLM: max_model_len 512, one layer per stage, 33 pages (32 + the null page) -> 33 blocks, more memory or not."""
    agreed = simulate_consensus(model(FULL, FULL), Limits(max_model_len=512), budgets(*pages), tp_size=1, pp_size=2)
    assert agreed.num_blocks == 33 and [p.groups[0].layers for p in agreed.stages] == [(0,), (1,)]


def test_auto_fit_takes_the_shortest_rank():
    """Auto max_model_len: stage 0 fits 63 usable pages (1008 tokens), stage 1 127 (capped at 1024) -> 1008."""
    whole = ModelKV.from_specs("two", [(FULL, "flash_attn")] * 2, max_position_embeddings=1024)
    agreed = simulate_consensus(whole, Limits(), budgets(64, 128), tp_size=1, pp_size=2)
    assert [r.max_model_len for r in agreed.ranks] == [1008, 1024]
    assert (agreed.max_model_len, agreed.num_blocks) == (1008, 64)
    assert agreed.max_model_len_reason.startswith("the shortest of 2 ranks' auto-fit lengths: rank 0")


def test_vllm_project_groups_to_a_worker():
    """vLLM's projection: a uniform-type group (2-, 4- and 2-head layers) cut to layers 1 and 3 keeps their slots."""
    wide = FullAttentionSpec(num_kv_heads=4, head_size=64, dtype="float32")
    layers = model(FULL, wide, FULL).layers
    grouping = build_groups(layers, 16)
    projected = project_grouping(grouping, {0, 2}, "worker")
    assert [x.index for x in projected.groups[0].layers] == [0, 2]
    assert projected.slot_page_bytes == (PAGE, PAGE) and grouping.slot_page_bytes == (PAGE, 2 * PAGE, PAGE)


def _kimi_like() -> ModelKV:
    split = StateSplit.kda(heads=32, head_dim=128, conv_kernel=4)
    state = MambaSpec(shapes=split.shapes_per_rank(1), dtypes=("bfloat16", "float32"), variant="kda", tp_split=split)
    return ModelKV.from_specs("kimi-like", [(state, "kda"), (MLASpec(kv_lora_rank=512, rope_dim=64), "flashmla")])


@pytest.mark.parametrize(("whole", "tp", "replicas"), [
    (model(FULL, FULL, tp_heads=8), 2, 1),  # split KV heads: no replica
    (ModelKV.from_specs("mla", [(MLASpec(kv_lora_rank=512, rope_dim=64), "flashmla")] * 2), 8, 8),  # max_tp_shards=1
    (ModelKV.from_specs("dsv32", [(MLASpec(kv_lora_rank=512, rope_dim=64), "flashmla"),
                                  (IndexerKeySpec(head_size=132), "indexer")]), 4, 4),
    (_kimi_like(), 4, 1),  # gcd(4 for the latent, 1 for the split state)
    (ModelKV.from_specs("mla", [(MLASpec(kv_lora_rank=512, rope_dim=64), "flashmla")]), 1, 1),
])
def test_tp_replicas_as_vllm_counts_them(whole, tp, replicas):
    """Consecutive TP ranks with identical caches: the gcd over layers, latents counting every rank (vLLM 0.33)."""
    agreed = simulate_consensus(whole, Limits(max_model_len=1024), Budget.kv_bytes("1GiB"), tp_size=tp)
    assert agreed.kv_tp_replicas == replicas


def test_replicated_kv_heads_count_as_replicas_beyond_vllm():
    """graphkv also counts KV heads replicated over tp (2 heads at tp 4: 2 replicas); vLLM 0.33 reports 1 there."""
    agreed = simulate_consensus(model(FULL), Limits(max_model_len=1024), Budget.kv_bytes("1GiB"), tp_size=4)
    assert agreed.kv_tp_replicas == 2


def test_unequal_budgets_agree_on_the_smallest_and_identical_plans():
    """Qwen3-Next over tp 4 with 10-13 GiB: num_blocks is rank 0's 3212 and every rank's stage plan is the same."""
    agreed = simulate_consensus(preset_model("qwen3-next-80b-a3b"), Limits(),
                                lambda rank, _m: Budget.kv_bytes(f"{10 + rank}GiB"), tp_size=4)
    assert [r.num_blocks for r in agreed.ranks] == [3212, 3533, 3855, 4176]
    plan = agreed.stages[0]
    assert (agreed.num_blocks, plan.num_blocks, plan.block_size) == (3212, 3212, 272)
    assert plan.limits.num_blocks_override == 3212 and plan.capacity.num_blocks_reason == agreed.num_blocks_reason


def test_a_rank_whose_own_plan_fails_fails_them_all():
    """Rank 2's 512 KiB holds 1 page index of 512 KiB (2 needed): the agreement names rank 2 and its CapacityError."""
    with pytest.raises(ConsensusError) as info:
        simulate_consensus(preset_model("llama-3.1-8b"), Limits(),
                           lambda rank, _m: Budget.kv_bytes("512KiB" if rank == 2 else "8GiB"), tp_size=2, pp_size=2)
    problem = info.value.problems[0]
    assert problem.value == [2] and "rank 2 (tp 0, pp 1) could not plan its own cache: CapacityError" in problem.limit


def test_different_limits_are_named():
    """One rank with max_num_seqs=128 against 256 elsewhere: the field limits.max_num_seqs and rank 3 are named."""
    models = rank_models(preset_model("llama-3.1-8b"), 2, 2)
    reports = [budget_report(m, Limits(max_num_seqs=128 if r == 3 else 256), Budget.kv_bytes("8GiB"), rank=r)
               for r, m in enumerate(models)]
    with pytest.raises(ConsensusError, match=r"limits\.max_num_seqs='rank 0: 256; rank 3: 128'.*rank\(s\) \[3\]"):
        agree(reports)


def test_a_group_of_the_wrong_size_is_refused():
    """Two ranks of a tp=4 model cannot agree: 4 ranks were expected."""
    models = rank_models(preset_model("llama-3.1-8b"), 4, 1)[:2]
    reports = [budget_report(m, Limits(), Budget.kv_bytes("8GiB"), rank=r) for r, m in enumerate(models)]
    with pytest.raises(ConsensusError, match=r"sharded for tp=4 x pp=1 = 4 ranks but 2 ranks joined"):
        agree(reports)


def test_two_ranks_holding_the_same_shard_are_refused():
    """Ranks 0 and 1 both holding tp rank 0 is refused, naming both."""
    rank0 = preset_model("llama-3.1-8b").shard(2, 0)
    reports = [budget_report(rank0, Limits(), Budget.kv_bytes("8GiB"), rank=r) for r in range(2)]
    with pytest.raises(ConsensusError, match=r"ranks 0 and 1 both hold tp rank 0 of stage 0"):
        agree(reports)


def test_a_non_model_is_reported_not_raised():
    """A rank passing something other than a ModelKV reports a SpecError that every rank raises."""
    good = budget_report(preset_model("llama-3.1-8b").shard(2, 0), Limits(), Budget.kv_bytes("8GiB"), rank=0)
    bad = budget_report("llama", Limits(), Budget.kv_bytes("8GiB"), rank=1)  # type: ignore[arg-type]
    with pytest.raises(ConsensusError, match=r"rank 1 .*could not plan its own cache: SpecError: model='str'"):
        agree([good, bad])


def test_a_simulation_shards_the_model_once_per_tensor_parallel_rank(monkeypatch) -> None:
    """rank_models sharded the whole model for every rank and every rank fingerprinted it: tp x pp x layers work
    twice over (a 16384-layer model at --tp 8 --pp 32 took 74 s). It shards once per tensor-parallel rank, and the
    agreement is the same."""
    from graphkv.distributed.simulate import rank_models
    from graphkv.spec.model import ModelKV

    model = preset_model("deepseek-v3")
    calls = []
    shard = ModelKV.shard
    monkeypatch.setattr(ModelKV, "shard", lambda self, *a, **k: calls.append(a) or shard(self, *a, **k))
    models = rank_models(model, 4, 8)
    assert len(models) == 32 and len(calls) == 4
    assert [(m.tensor_parallel_rank, m.pipeline_rank) for m in models[:5]] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]
    assert all(models[r].whole is models[r % 4].whole for r in range(32))


def test_agree_refuses_what_is_not_one_report_per_rank():
    """agree() of nothing, of a non-report, or of ranks missing / given twice: a SpecError naming the ranks."""
    llama = preset_model("llama-3.1-8b")
    reports = [budget_report(m, Limits(), Budget.kv_bytes("20GiB"), rank=i)
               for i, m in enumerate(rank_models(llama, 2, 1))]
    with pytest.raises(SpecError, match=r"^reports=\[\]: must be a non-empty sequence of RankReport"):
        agree([])
    with pytest.raises(SpecError, match=r"^reports\[1\]='str': must be a RankReport"):
        agree([reports[0], "rank 1"])
    with pytest.raises(SpecError, match=r"^reports \(ranks\)=\[0, 0\]: must be ranks 0 \.\. 1, each once"):
        agree([reports[0], reports[0]])


@pytest.mark.parametrize("sizes, text", [
    ({"tp_size": 0}, r"^tp_size=0: must be an integer >= 1"),
    ({"tp_size": 2, "pp_size": -1}, r"^pp_size=-1: must be an integer >= 1"),
    ({"tp_size": "2"}, r"^tp_size='2': must be an integer >= 1 \(got str\)"),
])
def test_simulation_sizes_are_checked(sizes, text):
    """simulate_consensus with a tensor- or pipeline-parallel size that is not a positive int: a SpecError (an
    IndexError or TypeError before)."""
    with pytest.raises(SpecError, match=text):
        simulate_consensus(preset_model("llama-3.1-8b"), Limits(), Budget.kv_bytes("20GiB"), **sizes)


def test_a_local_plan_of_another_model_or_not_a_plan_is_refused():
    """compile_local returning the unsharded model's plan (8 KV heads a layer where the tp-2 shard has 4: it would
    have agreed on 10240 pages instead of 20480) or None: every rank's report names it."""
    import graphkv

    llama, budget = preset_model("llama-3.1-8b"), Budget.kv_bytes("20GiB")
    assert simulate_consensus(llama, Limits(), budget, tp_size=2).num_blocks == 20480
    whole_plan = graphkv.compile(llama, Limits(), budget)
    with pytest.raises(ConsensusError, match=r"must plan this rank's model \(32 cache layers\); first difference at "
                                             r"layer 0: the plan's layers.0: 8 KV heads x 128, the model's "
                                             r"layers.0: 4 KV"):
        simulate_consensus(llama, Limits(), budget, tp_size=2, compile_local=lambda r, m: whole_plan)
    with pytest.raises(ConsensusError, match=r"compile_local\(\)='NoneType': must return a Plan"):
        simulate_consensus(llama, Limits(), budget, tp_size=2, compile_local=lambda r, m: None)


def test_finalize_and_plan_for_refuse_another_model_or_layout():
    """finalize() of a llama agreement with qwen3-next or other limits, and plan_for() of another model or of a stage
    outside the agreed pipeline: SpecErrors naming the first difference (before: a plan of the wrong model, or an
    IndexError)."""
    from graphkv.distributed import finalize

    llama, qwen = preset_model("llama-3.1-8b"), preset_model("qwen3-next-80b-a3b")
    reports = [budget_report(m, Limits(), Budget.kv_bytes("20GiB"), rank=i)
               for i, m in enumerate(rank_models(llama, 2, 1))]
    agreement = agree(reports)
    with pytest.raises(SpecError, match=r"^model \(model.max_position_embeddings\)='262144': differs from the "
                                        r"model the ranks agreed on: 131072"):
        finalize(qwen.shard(2, 0), Limits(), agreement)
    with pytest.raises(SpecError, match=r"^limits \(limits.max_num_seqs\)='8': differs from the limits the "
                                        r"ranks agreed"):
        finalize(llama.shard(2, 0), Limits(max_num_seqs=8), agreement)
    agreed = simulate_consensus(llama, Limits(), Budget.kv_bytes("20GiB"), tp_size=2, pp_size=2)
    assert agreed.plan_for(llama.shard(2, 1).stage(2, 1)) is agreed.stages[1]
    with pytest.raises(SpecError, match=r"^model='tp=1 x pp=4': the ranks agreed on tp=2 x pp=2"):
        agreed.plan_for(llama.stage(4, 3))
    with pytest.raises(SpecError, match=r"^model \(model.max_position_embeddings\)='262144'"):
        agreed.plan_for(qwen.shard(2, 0).stage(2, 1))


def test_ranks_with_different_graph_memory_calibrations_are_named():
    """A rank planning with a calibration and one without would agree on stages whose graph-memory ledgers differ:
    refused, naming graph_pool."""
    from graphkv.plan.graph_pool import GraphPoolModel

    llama = preset_model("llama-3.1-8b")
    calibrated = GraphPoolModel(per_graph_bytes=4096.0, output_bytes_per_token=64.0, workspace_bytes_per_token=32.0,
                                calibrated=True, source="a test calibration", hidden_size=4096)
    reports = [budget_report(m, Limits(), Budget.kv_bytes("20GiB"), rank=i, graph_pool=calibrated if i else None)
               for i, m in enumerate(rank_models(llama, 2, 1))]
    with pytest.raises(ConsensusError, match=r"^graph_pool=.*rank 0: the uncalibrated estimate; rank 1: <absent>.*"
                                             r"differs between rank 0 and rank\(s\) \[1\]: every rank must "
                                             r"reserve graph memory from the same calibration"):
        agree(reports)


def test_a_group_that_is_not_a_process_group_is_refused(tmp_path):
    """compile_consensus(group="world") on an initialised one-rank gloo world: a SpecError naming the group (a raw
    ValueError from torch before); group=None plans alone."""
    dist = pytest.importorskip("torch.distributed")
    from graphkv.distributed import compile_consensus

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        llama = preset_model("llama-3.1-8b")
        with pytest.raises(SpecError, match=r"^group='str': must be a torch.distributed ProcessGroup \(or None: the "
                                            r"world\)"):
            compile_consensus(llama, Limits(), Budget.kv_bytes("20GiB"), group="world")
        assert compile_consensus(llama, Limits(), Budget.kv_bytes("20GiB")).num_blocks == 10240
    finally:
        dist.destroy_process_group()
