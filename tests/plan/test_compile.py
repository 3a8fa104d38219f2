"""The whole compiler pass: inputs checked, steps chained, a frozen deterministic plan out, no torch."""

import json
import subprocess
import sys

import attrs
import pytest

import graphkv
from graphkv import (Backend, Budget, CacheOrder, CudaGraphSupport, FullAttentionSpec, KVLayout, Limits, MambaSpec,
                     ModelKV, SlidingWindowSpec, SpecError, compile_plan)

ATTN = FullAttentionSpec(num_kv_heads=2, head_size=64)  # A1 = 512 B/token
MAMBA = MambaSpec(shapes=((3, 1024), (8, 64, 64)), dtypes=("bfloat16", "float32"))  # M = 137216 B


def hybrid(**kwargs) -> ModelKV:
    """[attn, mamba, mamba, mamba, attn, mamba, mamba, mamba]."""
    return ModelKV.from_specs("h", [(ATTN, "flash_attn") if c == "A" else (MAMBA, "mamba") for c in "AMMMAMMM"],
                              **kwargs)


def test_compile_alias_and_docstring_example():
    """graphkv.compile is compile_plan; 2 layers of 8 x 128 bf16 in 1 GiB give 4096 blocks."""
    spec = FullAttentionSpec(num_kv_heads=8, head_size=128)
    model = ModelKV.from_specs("tiny", [(spec, "flash_attn")] * 2)
    # page 16 * 8 * 256 * 2 = 65536 B; gs 2 -> 131072 B per page index; 1 GiB // 131072 = 8192.
    assert graphkv.compile is compile_plan
    assert compile_plan(model, Limits(max_model_len=4096), Budget.kv_bytes("1GiB")).num_blocks == 8192


def test_hybrid_plan_end_to_end():
    """The hybrid plan chains all steps: block 272, 4 groups, 2 slots, layers' groups and slots."""
    plan = compile_plan(hybrid(), Limits(max_num_seqs=32, max_num_batched_tokens=2048, num_blocks_override=100))
    assert plan.block_size == 272
    assert [g.layers for g in plan.groups] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert [g.kind.value for g in plan.groups] == ["full_attention", "mamba", "mamba", "mamba"]
    assert [s.layers for s in plan.slots] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert plan.group_of(6).index == 2
    assert plan.slot_of(6).index == 1
    assert plan.kernel_block_sizes == (272, 272, 272, 272)  # flash_attn MultipleOf(16) accepts 272 = 17 * 16
    assert plan.pool_bytes == 100 * 278528
    assert [layer.name for layer in plan.layers] == [f"layers.{i}" for i in range(8)]


def test_plan_is_frozen_and_deterministic():
    """Compiling twice gives equal plans, and a plan cannot be mutated."""
    limits = Limits(max_num_seqs=32, max_num_batched_tokens=2048)
    first = compile_plan(hybrid(), limits, Budget.kv_bytes("64MiB"))
    assert first == compile_plan(hybrid(), limits, Budget.kv_bytes("64MiB"))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        first.group_size = 3  # type: ignore[misc]


def test_to_dict_is_json_and_matches_the_plan():
    """to_dict round-trips through JSON with the plan's numbers."""
    plan = compile_plan(hybrid(), Limits(max_num_seqs=32, max_num_batched_tokens=2048, num_blocks_override=100))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["block_size"] == 272
    assert data["num_blocks"] == 100
    assert data["usable_pages"] == 99
    assert data["max_model_len"] == 26112
    assert data["mamba_page_padding_bytes"] == 2048
    assert [g["layers"] for g in data["groups"]] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert sum(e["bytes"] for e in data["ledger"]["entries"] if e["in_kv_budget"]) == 100 * 278528


def test_custom_backends_plan_like_builtin_ones():
    """A Backend descriptor that is not built in is planned (its support read from the descriptor)."""
    mine = Backend(name="my_paged", supported_kernel_block_sizes=(32,),
                   cudagraph_support=CudaGraphSupport.UNIFORM_BATCH, kv_layout=KVLayout(order=CacheOrder.BLOCKS_FIRST))
    model = ModelKV.from_specs("m", [(ATTN, mine)])
    plan = compile_plan(model, Limits(max_model_len=1024), Budget.kv_bytes("64MiB"))
    assert plan.block_size == 32  # 16 unsupported -> smallest, 32
    assert plan.cudagraph.support is CudaGraphSupport.UNIFORM_BATCH
    assert plan.cudagraph.limited_by == "group 0 (my_paged)"


def test_tensor_parallel_mismatch_is_a_spec_error():
    """Limits.tensor_parallel_size must match the tp the model's specs were built for."""
    with pytest.raises(SpecError, match=r"tensor_parallel_size=2: the model's specs were built for tp=1"):
        compile_plan(hybrid(), Limits(tensor_parallel_size=2, max_num_seqs=8), Budget.kv_bytes("64MiB"))


def test_max_model_len_above_position_cap_is_a_spec_error():
    """A fixed max_model_len above max_position_embeddings is rejected before planning."""
    with pytest.raises(SpecError, match=r"max_model_len=5000: exceeds the model's max_position_embeddings=4096"):
        compile_plan(hybrid(max_position_embeddings=4096), Limits(max_model_len=5000, max_num_seqs=8),
                     Budget.kv_bytes("64MiB"))


def test_wrong_argument_types_are_reported_together():
    """Passing a dict as limits and a string as budget raises one SpecError with both problems."""
    with pytest.raises(SpecError) as info:
        compile_plan(hybrid(), {"max_model_len": 10}, "40GiB")  # type: ignore[arg-type]
    assert [p.field for p in info.value.problems] == ["limits", "budget"]


def test_default_limits_are_used_when_none_given():
    """compile_plan(model, None, budget) plans with Limits() (max_num_seqs 256, 8192 tokens per step)."""
    sliding = SlidingWindowSpec(num_kv_heads=8, head_size=128, window=1024)
    model = ModelKV.from_specs("s", [(sliding, "flash_attn")], max_position_embeddings=4096)
    plan = compile_plan(model, None, Budget.kv_bytes("1GiB"))
    assert plan.limits == Limits(max_concurrent_batches=2)  # resolved: one pipeline stage + 1 (async scheduling)
    # min(1023 + 8192, 4096) = 4096 -> 256 + 1 = 257 pages.
    assert plan.capacity.pages_per_request == 257


def test_planning_imports_no_torch_triton_or_transformers():
    """Reading a config, compiling a plan, `graphkv plan` (also --tp 2 --pp 2), listing the families and
    graphkv.distributed's pure parts load neither torch, triton nor transformers."""
    code = (
        "import sys, graphkv\n"
        "from graphkv.presets import preset_model\n"
        "from graphkv.cli import main\n"
        "spec = graphkv.FullAttentionSpec(num_kv_heads=8, head_size=128)\n"
        "model = graphkv.ModelKV.from_specs('m', [(spec, 'flex')])\n"
        "graphkv.compile(model, graphkv.Limits(max_model_len=1024), graphkv.Budget.kv_bytes('1GiB'))\n"
        "graphkv.compile(preset_model('nemotron-h-8b'), graphkv.Limits(max_num_seqs=64), graphkv.Budget.kv_bytes('20GiB'))\n"
        "import graphkv.distributed\n"
        "main(['models'])\n"
        "assert main(['plan', '--json']) == 0\n"
        "assert main(['plan', '--tp', '2', '--pp', '2', '--json']) == 0\n"
        "bad = [m for m in ('torch', 'triton', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
