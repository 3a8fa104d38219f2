"""graphkv's paged flex attention behind transformers' attention-function interface.

Why the interface rather than swapping attention modules: every transformers attention module
computes its projections, q/k norms, rotary embedding (per layer type for Gemma-3), output gate
(Qwen3-Next) and output projection itself, then calls ``ALL_ATTENTION_FUNCTIONS[name](module, q,
k, v, mask, scaling=..., sliding_window=..., s_aux=..., **kwargs)`` for the core attention only.
Registering one function under :data:`ATTN_IMPLEMENTATION` therefore keeps all of a family's own
code and weights and replaces exactly the part the paged cache changes, for every family at once;
module swapping would re-implement each family's attention. Recurrent mixers have no such
interface, so those are swapped (:mod:`graphkv.hf.mixers`).

Run eagerly, the function receives the step through the ``graphkv`` keyword (a :class:`PagedStep`) that
:class:`graphkv.hf.model.PagedModel` passes to the model's forward and transformers hands down to every
attention call (or, where none is passed, from the step's context); compiled whole, it calls the
``graphkv::attention`` op, which reads the step from that context when it runs. It writes the layer's new K/V
into its pages at the step's slot mapping with the K/V write op
(:func:`graphkv.runtime.ops.kv_write_op.write_kv_op`: a mutating custom op, so a compiled forward writes only
the step's slots) and attends through the model's :class:`~graphkv.runtime.flex.region.FlexRegions` (one
compiled region per group and phase, K/V read through flat views built once); a one-token decode step on the
GPU path attends through graphkv's split-KV paged decode kernel instead
(:mod:`graphkv.kernels.paged_attention`), which reads the block tables directly, so no flex mask is built for
it. Attention sinks (gpt-oss) rescale the flex output by ``sigmoid(lse - sink)``: the softmax with one more
logit ``sink`` per head, whose value vector is zero (the decode kernel adds it to its softmax's denominator).
Attention-logit soft-capping (Gemma-2's ``softcap=``, read from the module at set-up into the layer's binding)
is applied by the decode kernel and by flex's score modifier, after the scale. transformers builds no mask for
an implementation name it does not know; graphkv's block masks replace its masks.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
import torch

from graphkv.errors import CaptureError, Problem
from graphkv.hf.layer_ops import LAYER_BUFFER, active_paged_step, attention_op
from graphkv.kernels.decode_splits import DEFAULT_NUM_SMS
from graphkv.kernels.paged_attention import paged_decode_attention
from graphkv.runtime.flex.region import FlexRegions
from graphkv.runtime.ops.kv_write_op import write_kv_op
from graphkv.runtime.state.rows import PackedRows
from graphkv.runtime.step.context import StepContext
from graphkv.spec.backends import KVLayout

__all__ = ["ATTN_IMPLEMENTATION", "AttentionBinding", "PagedStep", "paged_attention_forward", "register"]

ATTN_IMPLEMENTATION = "graphkv_paged"
"""The name graphkv's attention function is registered under in transformers' ``AttentionInterface``."""


@attrs.frozen(kw_only=True, eq=False)
class AttentionBinding:
    """One attention layer's place in the pool: its plan name and group, its cache view (kv-first
    ``(2, num_kernel_blocks, kbs, Hkv, D)``) and layout (where the K/V write puts the step's
    tokens), and the flat K / V views flex attention reads (``[1, Hkv, kv_tokens, D]``,
    :func:`~graphkv.runtime.flex.views.paged_kv_views`, built once)."""

    name: str
    group: int
    cache: torch.Tensor
    layout: KVLayout
    key: torch.Tensor
    value: torch.Tensor
    window: int | None = None  # the layer's sliding window in tokens (None: full attention)
    softcap: float | None = None  # the layer's attention-logit soft-cap (Gemma-2; None: none)
    workspace: torch.Tensor | None = None  # the decode kernel's split partials, allocated once (None: flex decodes)
    num_sms: int = DEFAULT_NUM_SMS  # the device's SMs, which the decode kernel's split rule fills
    # False: the module passes a window it does not apply (OLMoE: config.sliding_window, which transformers applies
    # only in its flash-attention kernels; its eager / sdpa mask is full causal, as the plan): not checked
    checks_window: bool = True


@attrs.frozen(kw_only=True, eq=False)
class PagedStep:
    """What one forward's layers read: the step context (whose flex mask builders the forward
    rebuilt once for the step), the packing of state-layer tokens (``None`` without state layers), every attention
    layer's binding and every recurrent mixer
    (:class:`~graphkv.hf.mixers.base.PagedMixer`) by its transformers ``layer_idx``, the model's
    flex regions, the K/V write's kernels and the step's phase (``"decode"`` for a uniform decode
    step, which has its own compiled regions, else ``"mixed"``); ``decode_kernel``: this one-token
    decode step attends through graphkv's paged decode kernel, which reads the block tables
    directly (no flex mask is built for it)."""

    context: StepContext
    rows: PackedRows | None
    attention: Mapping[int, AttentionBinding]
    mixers: Mapping[int, Any]
    regions: FlexRegions
    kernels: str
    phase: str
    decode_kernel: bool = False

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
               scale: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
        """:func:`attend` of this step (what the ``graphkv::attention`` op runs)."""
        return attend(self, layer, query, key, value, scale=scale, sinks=sinks)

    def check_call(self, layer: int, *, window: int | None, window_given: bool, softcap: float | None) -> None:
        """Refuse a call of attention layer ``layer`` (its transformers ``layer_idx``) that asks for another
        attention than the layer was set up with: ``softcap`` (the module's attention-logit soft-cap, read at set-up
        into the binding) and ``window`` (the module's sliding window; ``window_given``: the module passed one at all,
        else its window was checked against the plan at set-up). Raises :class:`CaptureError` naming the layer.
        Capture-safe (host comparisons only)."""
        binding = self.attention.get(layer)
        if binding is None:
            return
        if (softcap or None) != binding.softcap:  # read at set-up; applied by the kernels
            raise CaptureError(Problem(field=f"layer {layer}.softcap", value=softcap,
                                       limit=f"the module soft-caps its scores at {softcap}, the layer was set up "
                                             f"with {binding.softcap} (its attn_logit_softcapping)",
                                       fix="set attn_logit_softcapping on the model before wrapping it in a "
                                           "PagedModel, or run it with transformers' eager attention"))
        if not binding.checks_window:
            return
        # What the module asks for (0 / None: full attention); a family that slides through its mask alone
        # (Qwen2-MoE) passes nothing, and its module's window was checked against the plan at set-up.
        window = window or None
        planned = binding.window if window_given else window
        if window != planned:  # the plan's window came from the config; the module's own decides its tokens
            def told(tokens: int | None) -> str:
                return f"a {tokens}-token window" if tokens else "full attention"

            raise CaptureError(Problem(field=f"layer {layer}.sliding_window", value=window,
                                       limit=f"the plan gives this layer {told(planned)} (read from model.config), "
                                             f"the module asks for {told(window)}",
                                       fix="plan from graphkv.hf.model_kv(model) of this same model; if it does, the "
                                           "family's window fields are read wrongly: run it with transformers' own "
                                           "attention"))


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: Any, *, scaling: float | None = None, s_aux: torch.Tensor | None = None,
                            softcap: float | None = None, graphkv: PagedStep | None = None,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The attention function transformers calls per layer (``[1, H, T, D]`` query / key / value
    of the step's packed tokens after rotary); returns ``([1, T, Hq, D], None)``. ``scaling``: the
    module's score scale; ``s_aux``: per-head sink logits ``[Hq]``; ``softcap``: the module's attention-logit
    soft-cap, which must be the one the layer was set up with (:meth:`PagedStep.check_call`, as the sliding window).
    Eager, the step comes in ``graphkv`` (or, where none is passed, from the step's context); compiled (a forward
    compiled whole), the ``graphkv::attention`` op reads it when it runs and the layer is named by the module's
    ``graphkv_layer`` buffer (:func:`~graphkv.hf.layer_ops.layer_id`), so no step object enters the trace. Raises
    :class:`CaptureError` outside a :class:`~graphkv.hf.model.PagedModel` step, for another soft-cap or sliding
    window than the layer's.
    Capture-safe."""
    window, window_given = kwargs.get("sliding_window") or None, "sliding_window" in kwargs
    # [T, H, D] views: the write reads K and V through their strides, the region copies the query
    # into its own dense buffer.
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)
    if torch.compiler.is_compiling():  # the model compiled whole: the pool stays out of its graph
        layer = getattr(module, LAYER_BUFFER, None)
        if layer is None:
            raise CaptureError(Problem(field=f"{type(module).__name__}.{LAYER_BUFFER}", value=None,
                                       limit="a compiled forward reached graphkv's paged attention in a module that "
                                             "is not a planned layer of a PagedModel's view",
                                       fix="compile the model through graphkv.hf.PagedModel (compile='model', "
                                           "'piecewise' or 'fused'), not torch.compile of the model itself"))
        out = attention_op(q, k, v, s_aux, layer, scaling, window=window, window_given=window_given, softcap=softcap)
    else:  # eager (a compiled forward Dynamo runs eagerly passes no step: the context has it)
        step = graphkv if graphkv is not None else active_paged_step()
        if step is None:
            raise CaptureError(Problem(field="attn_implementation", value=ATTN_IMPLEMENTATION,
                                       limit="graphkv's paged attention ran without a step (no graphkv= argument, "
                                             "and no PagedModel step running)",
                                       fix="run the model through graphkv.hf.PagedModel inside Step.run"))
        step.check_call(module.layer_idx, window=window, window_given=window_given, softcap=softcap)
        out = attend(step, module.layer_idx, q, k, v, scale=scaling, sinks=s_aux)
    return out[None], None


def attend(step: PagedStep, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
           scale: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """Attention layer ``layer`` of ``step``: write the step's ``key`` / ``value`` ``[T, Hkv, D]``
    into its pages, then attention of ``query`` ``[T, Hq, D]`` over them: graphkv's paged decode
    kernel on a one-token decode step with ``step.decode_kernel`` (``sinks`` join its softmax),
    else flex attention through the model's regions, where ``sinks`` (``[Hq]`` logits) rescale the
    output by ``sigmoid(lse - sink)``. Returns ``[T, Hq, D]``. Capture-safe."""
    binding = step.attention[layer]
    ctx = step.context
    write_kv_op(key, value, binding.cache, ctx.slot_mappings[binding.group], layout=binding.layout,
                kernels=step.kernels)
    if step.decode_kernel:  # one query token per row: split-KV paged decode over the block table, no mask
        return paged_decode_attention(query, binding.cache, ctx.block_tables[binding.group], ctx.seq_lens,
                                      layout=binding.layout, scale=scale, sliding_window=binding.window, sinks=sinks,
                                      softcap=binding.softcap, workspace=binding.workspace, num_sms=binding.num_sms)
    builder = ctx.mask_builders[binding.group]
    if sinks is None:
        return step.regions.attend(query, binding.key, binding.value, builder, phase=step.phase, scale=scale,
                                   softcap=binding.softcap)
    out, lse = step.regions.attend(query, binding.key, binding.value, builder, phase=step.phase, scale=scale,
                                   softcap=binding.softcap, return_lse=True)
    keep = torch.sigmoid(lse.float() - sinks.float()[None, :])  # [T, Hq]: e^lse / (e^lse + e^sink)
    return (out.float() * keep[..., None]).to(query.dtype)


def register() -> None:
    """Register :func:`paged_attention_forward` in transformers' ``AttentionInterface`` under
    :data:`ATTN_IMPLEMENTATION` (idempotent; transformers' documented extension point)."""
    from transformers import AttentionInterface

    if AttentionInterface._global_mapping.get(ATTN_IMPLEMENTATION) is not paged_attention_forward:
        AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
