"""graphkv's paged flex attention behind transformers' attention-function interface.

Why the interface rather than swapping attention modules: every transformers attention module
computes its projections, q/k norms, rotary embedding (per layer type for Gemma-3), output gate
(Qwen3-Next) and output projection itself, then calls ``ALL_ATTENTION_FUNCTIONS[name](module, q,
k, v, mask, scaling=..., sliding_window=..., s_aux=..., **kwargs)`` for the core attention only.
Registering one function under :data:`ATTN_IMPLEMENTATION` therefore keeps all of a family's own
code and weights and replaces exactly the part the paged cache changes, for every family at once;
module swapping would re-implement each family's attention. Recurrent mixers have no such
interface, so those are swapped (:mod:`graphkv.hf.mixers`).

The function receives the step through the ``graphkv`` keyword (a :class:`PagedStep`) that
:class:`graphkv.hf.model.PagedModel` passes to the model's forward and transformers hands down to
every attention call. It writes the layer's new K/V into its pages (the step's slot mapping) and
attends through :func:`graphkv.runtime.flex.attention.paged_flex_attention` with the step's block
mask, both in :func:`graphkv.runtime.flex.write_attend.write_and_attend` (one compiled call per
layer when the model is compiled). Attention sinks (gpt-oss) rescale the output by
``sigmoid(lse - sink)``: the softmax with one more logit ``sink`` per head, whose value vector is
zero. Attention-logit soft-capping (Gemma-2's ``softcap=``) is refused: no family graphkv.hf runs
passes it (Gemma-3 soft-caps only its output logits, in its own head). transformers builds no
mask for an implementation name it does not know; graphkv's block masks replace its masks.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs
import torch
from torch.nn.attention.flex_attention import BlockMask

from graphkv.errors import CaptureError, Problem
from graphkv.runtime.state.rows import PackedRows
from graphkv.runtime.step.context import StepContext

__all__ = ["ATTN_IMPLEMENTATION", "AttentionBinding", "PagedStep", "paged_attention_forward", "register"]

ATTN_IMPLEMENTATION = "graphkv_paged"
"""The name graphkv's attention function is registered under in transformers' ``AttentionInterface``."""


@attrs.frozen(kw_only=True, eq=False)
class AttentionBinding:
    """One attention layer's place in the pool: its plan name and group, its cache view (kv-first
    ``(2, num_kernel_blocks, kbs, Hkv, D)``) and the write-and-attend call
    (:func:`~graphkv.runtime.flex.write_attend.write_and_attend`, eager or compiled)."""

    name: str
    group: int
    cache: torch.Tensor
    attend: Callable[..., Any]


@attrs.frozen(kw_only=True, eq=False)
class PagedStep:
    """What one forward's layers read: the step context, the block mask of each flex group (built
    once per forward), the packing of state-layer tokens (``None`` without state layers) and every
    attention layer's binding by its transformers ``layer_idx``."""

    context: StepContext
    masks: Mapping[int, BlockMask]
    rows: PackedRows | None
    attention: Mapping[int, AttentionBinding]


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: Any, *, scaling: float | None = None, s_aux: torch.Tensor | None = None,
                            softcap: float | None = None, graphkv: PagedStep | None = None,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The attention function transformers calls per layer (``[1, H, T, D]`` query / key / value
    of the step's packed tokens after rotary); returns ``([1, T, Hq, D], None)``. ``scaling``: the
    module's score scale; ``s_aux``: per-head sink logits ``[Hq]``. Raises :class:`CaptureError`
    outside a :class:`~graphkv.hf.model.PagedModel` step or for ``softcap``. Capture-safe."""
    if graphkv is None:
        raise CaptureError(Problem(field="attn_implementation", value=ATTN_IMPLEMENTATION,
                                   limit="graphkv's paged attention ran without a step (no graphkv= argument)",
                                   fix="run the model through graphkv.hf.PagedModel inside Step.run"))
    binding = graphkv.attention[module.layer_idx]
    if softcap is not None:
        raise CaptureError(Problem(field=f"{binding.name}.softcap", value=softcap,
                                   limit="attention-logit soft-capping is not supported by graphkv.hf",
                                   fix="run the model with transformers' eager attention"))
    # The query as a fresh [T, H, D] tensor: `.contiguous()` keeps a one-token view's odd strides,
    # on which compiled CPU flex (torch 2.13) drops its own query copy and then fails. K and V are
    # written through their strides.
    q = query[0].transpose(0, 1).clone(memory_format=torch.contiguous_format)
    k, v = key[0].transpose(0, 1), value[0].transpose(0, 1)
    slots, mask = graphkv.context.slot_mappings[binding.group], graphkv.masks[binding.group]
    if s_aux is None:
        out = binding.attend(q, k, v, binding.cache, slots, mask, scale=scaling)
    else:
        out, lse = binding.attend(q, k, v, binding.cache, slots, mask, scale=scaling, return_lse=True)
        keep = torch.sigmoid(lse.float() - s_aux.float()[None, :])  # [T, Hq]: e^lse / (e^lse + e^sink)
        out = (out.float() * keep[..., None]).to(query.dtype)
    return out[None], None


def register() -> None:
    """Register :func:`paged_attention_forward` in transformers' ``AttentionInterface`` under
    :data:`ATTN_IMPLEMENTATION` (idempotent; transformers' documented extension point)."""
    from transformers import AttentionInterface

    if AttentionInterface._global_mapping.get(ATTN_IMPLEMENTATION) is not paged_attention_forward:
        AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
