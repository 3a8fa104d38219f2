"""Merged projections: q/k/v and gate/up weights laid out end to end, one matmul per group under a split forward."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from graphkv.errors import SpecError
from graphkv.hf import ServingLoop
from graphkv.hf.declare import model_kv
from graphkv.hf.generation import workload_budget
from graphkv.hf.model import PagedModel
from graphkv.hf.projections import ProjectionSlice, merge_projections
from graphkv.hf.tiny import tiny_model
from graphkv.models.demo_engine import DemoRequest
from graphkv.runtime.step.batch import Batch

from hf_harness import LIMITS, NEW_TOKENS, generate_alone, prompts


@torch.no_grad()
def test_merge_lays_each_group_out_end_to_end_and_changes_no_value():
    """Tiny llama (2 layers): 4 groups (q/k/v and gate/up per layer); each projection's weight is a row view of its
    group's weight, at the rows of its place, with the values it had; the model's logits are bitwise the same; a
    second merge finds the layout and copies nothing."""
    model = tiny_model("llama")
    ids = torch.tensor([prompts((9,))[0]])
    before_logits = model(ids).logits
    before = {name: p.clone() for name, p in model.named_parameters()}
    groups = merge_projections(model)
    assert [g.names for g in groups] == [("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")] * 2
    attention, mlp = groups[0], groups[1]
    assert attention.rows == ((0, 64), (64, 96), (96, 128)) and attention.weight.shape == (128, 64)
    assert mlp.rows == ((0, 128), (128, 256)) and mlp.weight.shape == (256, 64) and mlp.bias is None
    for group in groups:
        for linear, (start, stop) in zip(group.linears, group.rows):
            assert linear.weight.data_ptr() == group.weight[start:stop].data_ptr()
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert torch.equal(model(ids).logits, before_logits)
    again = merge_projections(model)
    assert [g.weight.data_ptr() for g in again] == [g.weight.data_ptr() for g in groups]


@torch.no_grad()
def test_biases_merge_with_their_weights_and_odd_groups_are_left_alone():
    """gpt-oss's q/k/v have biases: merged beside the weights. A group with one bias missing, another input width or a
    Linear subclass is not merged; a group inside an excluded module neither."""
    model = tiny_model("gpt_oss")
    groups = merge_projections(model)
    assert len(groups) == 2 and all(g.bias is not None and g.bias.shape == (g.weight.shape[0],) for g in groups)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias.data_ptr() == groups[0].bias.data_ptr()

    class Odd(torch.nn.Linear):
        pass

    llama = tiny_model("llama")
    layers = llama.model.layers
    layers[0].self_attn.k_proj.bias = None
    layers[0].self_attn.q_proj = torch.nn.Linear(64, 64, bias=True)  # a bias where k and v have none
    layers[0].mlp.up_proj = Odd(64, 128, bias=False)
    merged = merge_projections(llama, exclude=[layers[1].mlp])
    assert [(g.parent, g.names) for g in merged] == [(layers[1].self_attn, ("q_proj", "k_proj", "v_proj"))]


class _Subclass(torch.Tensor):
    """A tensor subclass (as a quantized weight would be): a merge would cast it to a plain tensor."""


@torch.no_grad()
def test_tied_weights_and_shared_projections_are_left_alone():
    """A group in which one parameter serves two projections (v tied to k), and two groups sharing one projection
    module, are not merged (one tensor cannot be rows of two places); the other groups are, and the model computes
    what it did. A projection with a forward hook, or a weight over a tensor subclass, is left alone too."""
    model = tiny_model("llama")
    layers = model.model.layers
    layers[0].self_attn.v_proj.weight = layers[0].self_attn.k_proj.weight
    layers[1].mlp.gate_proj = layers[0].mlp.gate_proj
    ids = torch.tensor([prompts((9,))[0]])
    before = model(ids).logits
    groups = merge_projections(model)
    assert [(g.parent, g.names) for g in groups] == [(layers[1].self_attn, ("q_proj", "k_proj", "v_proj"))]
    assert torch.equal(model(ids).logits, before)
    hooked = tiny_model("llama")  # a hook a slice would skip, a weight of another tensor class: left alone
    hooked.model.layers[0].self_attn.q_proj.register_forward_hook(lambda module, args, out: None)
    hooked.model.layers[1].mlp.up_proj.weight = torch.nn.Parameter(
        hooked.model.layers[1].mlp.up_proj.weight.detach().clone().as_subclass(_Subclass))
    assert [g.parent for g in merge_projections(hooked)] == [hooked.model.layers[0].mlp,
                                                              hooked.model.layers[1].self_attn]


def test_paged_model_merges_only_a_split_forward():
    """merge_projections=True with a compile mode that runs the projections eagerly (each slice would compute the
    whole group's matmul) is refused, naming the field and the modes that take it; so is a non-bool; the model's
    weights stay where they were."""
    model = tiny_model("llama")
    loop = ServingLoop(model, limits=LIMITS, budget=workload_budget(model_kv(model), LIMITS), capture_graphs=False)
    addresses = [p.data_ptr() for p in model.parameters()]
    for compile in (True, "model", False):
        with pytest.raises(SpecError, match=r"merge_projections.*compile='piecewise' or 'fused'"):
            PagedModel(model, loop.pool, compile=compile, merge_projections=True)
    with pytest.raises(SpecError, match="merge_projections.*must be a bool"):
        PagedModel(model, loop.pool, compile="fused", merge_projections="yes")
    assert [p.data_ptr() for p in model.parameters()] == addresses  # refused before anything was laid out anew


def _decode_linears(loop: ServingLoop) -> int:
    """Matmuls a one-token decode step dispatches on a CPU (aten::mm of Inductor's pieces, aten::linear traced)."""
    ids = prompts((6,), seed=3)[0]
    loop.run(Batch(req_ids=("p",), query_lens=(5,), seq_lens=(5,), new_pages=(((1,),),)), input_ids=ids[:5])
    loop.run(Batch(req_ids=("p",), query_lens=(1,), seq_lens=(6,), new_pages=(None,)), input_ids=ids[5:])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loop.run(Batch(req_ids=("p",), query_lens=(1,), seq_lens=(7,), new_pages=(None,)), input_ids=ids[:1])
    loop.finish("p")
    top = [e for e in prof.events() if e.name in ("aten::mm", "aten::linear", "aten::addmm")]
    return sum(1 for e in top if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))


@pytest.mark.slow
@pytest.mark.parametrize("compile", ["piecewise", "fused"])
def test_merged_projections_run_one_matmul_per_group_and_serve_generates_tokens(compile: str) -> None:
    """qwen3, 3 layers: merged, a decode step runs 13 matmuls (qkv, o, gate_up, down per layer and the head) where
    unmerged it runs 22; the one trace (1-token steps included) kept one of each group's repeated matmul (2 + 1 per
    layer); prompts served 4 at a time give generate's tokens, and the model's own generate is
    unchanged by the merge."""
    model = tiny_model("qwen3", num_hidden_layers=3)
    batch = prompts((5, 40, 17, 9), seed=1)
    expected = [generate_alone(model, p) for p in batch]
    loop = ServingLoop(model, limits=LIMITS, budget=workload_budget(model_kv(model), LIMITS), compile=compile,
                       kernels="triton", merge_projections=True)
    assert len(loop.model.merged) == 6 and loop.model.piecewise.num_deduped == 9
    slices = [m for m in loop.model.view.modules() if isinstance(m, ProjectionSlice)]
    assert len(slices) == 15  # 3 + 2 per layer
    assert _decode_linears(loop) == 13
    engine = loop.engine()
    engine.run([DemoRequest(req_id=i, prompt=p, max_new_tokens=NEW_TOKENS) for i, p in enumerate(batch)])
    assert [engine.finished[i] for i in range(len(batch))] == expected
    assert [generate_alone(model, p) for p in batch] == expected


def test_a_model_served_unmerged_is_not_merged_later_but_a_merged_one_serves_again():
    """A model an unmerged PagedModel wraps (its CUDA graphs would read the weights where they are) is refused a
    later merge, naming the fix, but a deep copy of it (weights of its own) merges; a model merged first serves
    unmerged and merged loops again, its weights staying where the first merge put them."""
    served = tiny_model("llama")
    loop = ServingLoop(served, limits=LIMITS, budget=workload_budget(model_kv(served), LIMITS), capture_graphs=False)
    with pytest.raises(SpecError, match="already served by a PagedModel .* pass merge_projections=True to the first"):
        PagedModel(served, loop.pool, compile="fused", merge_projections=True)
    merged = tiny_model("llama")
    first = ServingLoop(merged, limits=LIMITS, budget=workload_budget(model_kv(merged), LIMITS), compile="fused",
                        capture_graphs=False, merge_projections=True)
    addresses = [p.data_ptr() for p in merged.parameters()]
    PagedModel(merged, first.pool, compile="fused")
    again = PagedModel(merged, first.pool, compile="piecewise", merge_projections=True)
    assert len(again.merged) == 4 and [p.data_ptr() for p in merged.parameters()] == addresses
    copied = copy.deepcopy(served)  # its own weights, which no graph has read: it may merge
    assert len(PagedModel(copied, loop.pool, compile="fused", merge_projections=True).merged) == 4
