"""The tiny hybrid model on the paged pool: what a real model's forward looks like under graphkv.

Same weights and maths as :func:`graphkv.models.tiny_hybrid.dense_forward`, but for a packed
batch of many requests at once, reading everything per-step from the forward context
(:class:`graphkv.runtime.step.StepContext`) and keeping all state in the shared pool:

- attention layers write the step's K/V into their paged cache with the K/V write op (at the
  step's slot mapping; Triton or torch, as ``kernels`` says) and attend through the model's
  :class:`~graphkv.runtime.flex.region.FlexRegions` (compiled once per group and phase) with the
  step's mask;
- recurrence layers read each request's conv and recurrent state from its state page (zero for
  a request's first chunk), process the packed tokens and write the new states back.

The forward has fixed shapes for a given token count and no host syncs, so it can be captured
in a CUDA graph. The recurrence uses the parallel (quadratic) form of the gated linear
recurrence over the step's packed tokens: ``[state_heads, T, T]`` scores, fine for a demo model
whose steps are a few hundred tokens.
"""

from __future__ import annotations

import math

import torch

from graphkv.errors import Problem, SpecError
from graphkv.models.tiny_hybrid import TinyHybridWeights, rms_norm, split_qkv
from graphkv.runtime.capture.shape import current_shape
from graphkv.runtime.flex.region import FlexRegions
from graphkv.runtime.flex.views import paged_kv_views
from graphkv.runtime.ops.choice import resolve_kernels
from graphkv.runtime.ops.kv_write_op import write_kv_op
from graphkv.runtime.pool.allocate import KVPool
from graphkv.runtime.state.conv import packed_causal_conv
from graphkv.runtime.state.rows import PackedRows
from graphkv.runtime.state.ssd import packed_ssd
from graphkv.runtime.step.context import StepContext, current_context

__all__ = ["PagedTinyHybrid"]


class PagedTinyHybrid(torch.nn.Module):
    """The tiny hybrid model over ``pool`` (allocated from a plan of
    :func:`graphkv.models.tiny_hybrid.model_kv` with the flex backend).

    ``forward(input_ids [T] int64) -> logits [T, vocab]`` runs inside a step's forward context.
    ``compile_attention``: compile the flex attention regions (default: on a GPU pool; on a CPU
    each region costs seconds to compile once). ``kernels``: the K/V write's implementation
    (``"auto"``: Triton on CUDA, torch elsewhere; ``"triton"`` runs the GPU's kernel on a CPU too,
    in Triton's interpreter).
    """

    def __init__(self, weights: TinyHybridWeights, pool: KVPool, *, compile_attention: bool | None = None,
                 kernels: str = "auto") -> None:
        super().__init__()
        if not isinstance(pool, KVPool):
            raise SpecError(Problem(field="pool", value=type(pool).__name__, limit="must be a graphkv KVPool",
                                    fix="allocate it from the model's plan: graphkv.runtime.allocate(plan, device)"))
        self.weights = weights
        self.config = weights.config
        self.pool = pool
        self.kernels = resolve_kernels(kernels, pool.device)
        self.layer_names = [f"layers.{i}" for i in range(len(self.config.pattern))]
        # Compiled flex reads only the blocks the mask lists and runs the fused Triton kernel;
        # the default compiles on a GPU and stays eager on a CPU (compiling takes seconds there).
        if compile_attention is None:
            compile_attention = pool.device.type == "cuda"
        self.regions = FlexRegions(compile=bool(compile_attention), name="tiny_hybrid_flex")
        # K and V of each attention layer as flat views of its cache, built once (outside any compiled region).
        self._flat = {name: paged_kv_views(pool.kv_cache(name))
                      for name, kind in zip(self.layer_names, self.config.pattern) if kind == "A"}

    @property
    def vocab_size(self) -> int:
        """Token ids the model embeds. The forward does not check its ids (a check needs a host sync,
        which a captured graph cannot hold, and a negative id reads another token's embedding): check
        them before the step — :class:`~graphkv.models.demo_engine.DemoEngine` reads this to refuse
        prompts, ``Step.run(..., vocab_size=model.vocab_size)`` to refuse a step's ids."""
        return int(self.weights["embed"].shape[0])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits of every packed token of the step (padding tokens give unused rows). Capture-safe;
        the ids must be in ``[0, vocab_size)`` (see :attr:`vocab_size`)."""
        ctx: StepContext = current_context()
        w, c = self.weights, self.config
        x = w["embed"][input_ids]
        ctx.build_masks(input_ids.shape[0])  # once per forward, into the builders' buffers: replayed inside a graph
        rows = PackedRows.from_context(ctx, input_ids.shape[0])  # once per forward, for every recurrence
        for name, kind in zip(self.layer_names, c.pattern):
            h = rms_norm(x)
            if kind == "A":
                x = x + self._attention(ctx, name, h)
            else:
                x = x + self._recurrence(ctx, name, h, rows)
        return rms_norm(x) @ w["lm_head"]

    def _attention(self, ctx: StepContext, name: str, h: torch.Tensor) -> torch.Tensor:
        """One attention layer: write the step's K/V, attend through the region (the step's mask was
        built into the group's builder, whose persistent buffers the region reads)."""
        q, k, v = split_qkv(self.weights, name + ".", h)
        g = ctx.group(name)
        write_kv_op(k, v, self.pool.kv_cache(name), ctx.slot_mappings[g], layout=self.pool.layout(name),
                    kernels=self.kernels)
        shape = current_shape()
        key, value = self._flat[name]
        out = self.regions.attend(q, key, value, ctx.mask_builders[g], scale=self.config.head_size ** -0.5,
                                  phase="decode" if shape is not None and shape.uniform else "mixed")
        return out.reshape(h.shape[0], -1) @ self.weights[name + ".wo"]

    def _recurrence(self, ctx: StepContext, name: str, h: torch.Tensor, rows: PackedRows) -> torch.Tensor:
        w, c = self.weights, self.config
        conv_pool, ssm_pool = self.pool.mamba_states(name)
        pages = ctx.state_indices[ctx.group(name)]
        # Causal depthwise conv over each request's inputs, continuing from its conv state.
        mixed = torch.nn.functional.silu(packed_causal_conv(h @ w[name + ".w_in"], conv_pool, pages, rows,
                                                            weight=w[name + ".conv"]))
        hs, dk, dv = c.state_heads, c.state_key_size, c.state_value_size
        q = mixed[:, :hs * dk].view(-1, hs, dk)
        k = mixed[:, hs * dk:2 * hs * dk].view(-1, hs, dk) / math.sqrt(dk)
        v = mixed[:, 2 * hs * dk:].view(-1, hs, dv)
        log_decay = torch.nn.functional.logsigmoid(h @ w[name + ".w_gate"])  # [T, Hs]
        # The same scan as a Mamba2 layer's: unit time steps, per-token log decays, k / q as B / C,
        # the state stored [Hs, dk, dv] (the scan's [H, head_dim, state] is its transpose).
        out = packed_ssd(v, torch.ones_like(log_decay), log_decay, k, q, ssm_pool.transpose(-1, -2), pages, rows)
        return out.to(h.dtype).reshape(h.shape[0], -1) @ w[name + ".w_out"]
