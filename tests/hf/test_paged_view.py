"""The paged view shares the model's weights in place and leaves the model untouched."""

import torch

from graphkv.hf import tiny_model
from graphkv.hf.attention import ATTN_IMPLEMENTATION
from graphkv.hf.layer_ops import LAYER_BUFFER
from graphkv.hf.mixers import PagedGatedDeltaNet

from hf_harness import generate_alone, prompts, serving_loop


def paged(model):
    """The PagedModel of ``model`` a serving loop (no graphs captured) wraps, its pool sized for the test limits."""
    return serving_loop(model, capture_graphs=False).model


def test_every_weight_is_the_models_own_tensor() -> None:
    """Each view parameter has the data_ptr of the model's parameter of the same name; none is new. So are the
    view's buffers, but for each planned layer's id (its index as a host tensor, which the layer ops take), which
    the model does not get."""
    model = tiny_model("qwen3_next")
    view = paged(model).view
    mine = {name: p.data_ptr() for name, p in model.named_parameters()}
    theirs = {name.replace(".mixer.", "."): p.data_ptr() for name, p in view.named_parameters()}
    assert theirs == mine
    ids = {name: int(b) for name, b in view.named_buffers() if name.endswith(LAYER_BUFFER)}
    assert sorted(ids.values()) == list(range(model.config.num_hidden_layers))
    assert all(b.device.type == "cpu" and b.dtype == torch.int64 for name, b in view.named_buffers() if name in ids)
    assert {b.data_ptr() for name, b in view.named_buffers() if name not in ids} <= \
        {b.data_ptr() for b in model.buffers()}
    assert not any(name.endswith(LAYER_BUFFER) for name, _ in model.named_buffers())
    assert not any(LAYER_BUFFER in m._non_persistent_buffers_set for m in model.modules())


def test_the_model_is_left_as_it_was() -> None:
    """After building the view, the model keeps its attention implementation, modules, mode and outputs."""
    model = tiny_model("qwen3_next")
    model.train()
    before = generate_alone(model.eval(), prompts()[0])
    model.train()
    classes = [type(m).__name__ for m in model.modules()]
    view = paged(model).view
    assert model.config._attn_implementation == "sdpa" and view.config._attn_implementation == ATTN_IMPLEMENTATION
    assert [type(m).__name__ for m in model.modules()] == classes and model.training and not view.training
    assert sum(isinstance(m, PagedGatedDeltaNet) for m in view.modules()) == 3
    assert generate_alone(model.eval(), prompts()[0]) == before


def test_a_weight_update_is_seen_by_the_view() -> None:
    """Weights are shared, not copied: changing the model's output head changes the view's logits."""
    model = tiny_model("llama")
    view = paged(model).view
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    assert torch.equal(view.lm_head.weight, model.lm_head.weight)
