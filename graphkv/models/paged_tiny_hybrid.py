"""The tiny hybrid model on the paged pool: what a real model's forward looks like under graphkv.

Same weights and maths as :func:`graphkv.models.tiny_hybrid.dense_forward`, but for a packed
batch of many requests at once, reading everything per-step from the forward context
(:class:`graphkv.runtime.step.StepContext`) and keeping all state in the shared pool:

- attention layers write the step's K/V into their paged cache with the KV-write kernel (at the
  step's slot mapping) and attend through :func:`paged_flex_attention` with the step's mask;
- recurrence layers read each request's conv and recurrent state from its state page (zero for
  a request's first chunk), process the packed tokens and write the new states back.

The forward has fixed shapes for a given token count and no host syncs, so it can be captured
in a CUDA graph. The recurrence uses the parallel (quadratic) form of the gated linear
recurrence over the step's packed tokens: ``[state_heads, T, T]`` scores, fine for a demo model
whose steps are a few hundred tokens.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask

from graphkv.models.tiny_hybrid import TinyHybridWeights, rms_norm, split_qkv
from graphkv.runtime.flex.attention import paged_flex_attention
from graphkv.runtime.step.context import StepContext, current_context
from graphkv.runtime.ops.choice import write_kv
from graphkv.runtime.pool.allocate import KVPool

__all__ = ["PagedTinyHybrid"]


class PagedTinyHybrid(torch.nn.Module):
    """The tiny hybrid model over ``pool`` (allocated from a plan of
    :func:`graphkv.models.tiny_hybrid.model_kv` with the flex backend).

    ``forward(input_ids [T] int64) -> logits [T, vocab]`` runs inside a step's forward context.
    ``compile_attention``: wrap :func:`paged_flex_attention` in ``torch.compile`` (default: on a
    GPU pool).
    """

    def __init__(self, weights: TinyHybridWeights, pool: KVPool, *, compile_attention: bool | None = None) -> None:
        super().__init__()
        self.weights = weights
        self.config = weights.config
        self.pool = pool
        self.layer_names = [f"layers.{i}" for i in range(len(self.config.pattern))]
        # Compiled flex reads only the blocks the mask lists and runs the fused Triton kernel;
        # the default compiles on a GPU and stays eager on a CPU (compiling takes seconds there).
        if compile_attention is None:
            compile_attention = pool.device.type == "cuda"
        self._attend: Callable[..., torch.Tensor] = (torch.compile(paged_flex_attention, fullgraph=True)
                                                     if compile_attention else paged_flex_attention)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits of every packed token of the step (padding tokens give unused rows)."""
        ctx: StepContext = current_context()
        w, c = self.weights, self.config
        x = w["embed"][input_ids]
        masks = ctx.build_masks(input_ids.shape[0])  # once per forward: replayed inside a graph
        for name, kind in zip(self.layer_names, c.pattern):
            h = rms_norm(x)
            if kind == "A":
                x = x + self._attention(ctx, name, h, masks[ctx.group(name)])
            else:
                x = x + self._recurrence(ctx, name, h)
        return rms_norm(x) @ w["lm_head"]

    def _attention(self, ctx: StepContext, name: str, h: torch.Tensor, mask: BlockMask) -> torch.Tensor:
        q, k, v = split_qkv(self.weights, name + ".", h)
        g = ctx.group(name)
        cache = self.pool.kv_cache(name)
        write_kv(k.contiguous(), v.contiguous(), cache, ctx.slot_mappings[g], layout=self.pool.layout(name))
        out = self._attend(q.contiguous(), cache, mask, scale=self.config.head_size ** -0.5)
        return out.reshape(h.shape[0], -1) @ self.weights[name + ".wo"]

    def _recurrence(self, ctx: StepContext, name: str, h: torch.Tensor) -> torch.Tensor:
        w, c = self.weights, self.config
        num_tokens, seqs, taps = h.shape[0], ctx.row_valid.shape[0], c.conv_kernel - 1
        conv_pool, ssm_pool = self.pool.mamba_states(name)
        pages = ctx.state_indices[ctx.group(name)]
        row = ctx.token_row[:num_tokens]
        offset = ctx.token_offset[:num_tokens]
        real = row >= 0
        row0 = row.clamp(min=0)
        has_state = (ctx.context_lens > 0).to(h.dtype)  # a request's first chunk starts from zero state
        conv0 = conv_pool.index_select(0, pages) * has_state[:, None, None]  # [S, K-1, C]
        ssm0 = ssm_pool.index_select(0, pages) * has_state[:, None, None, None]  # [S, Hs, dk, dv]

        # Causal depthwise conv: tap m of token t reads the input `taps - m` tokens back in its
        # request, from this step's inputs or, before the query, from the request's conv state.
        u = h @ w[name + ".w_in"]  # [T, C]
        source = torch.cat([conv0.reshape(seqs * taps, -1), u])  # [S*(K-1) + T, C]
        tap = torch.arange(c.conv_kernel, device=h.device)
        back = offset[:, None] - taps + tap  # index inside the query of the tap's input
        tokens = torch.arange(num_tokens, device=h.device)
        from_step = seqs * taps + tokens[:, None] - taps + tap
        from_state = row0[:, None] * taps + taps + back
        index = torch.where(back >= 0, from_step, from_state).clamp(0, source.shape[0] - 1)
        frames = source[index]  # [T, K, C]
        mixed = torch.nn.functional.silu((frames * w[name + ".conv"].t()).sum(1))
        hs, dk, dv = c.state_heads, c.state_key_size, c.state_value_size
        q = mixed[:, :hs * dk].view(-1, hs, dk)
        k = mixed[:, hs * dk:2 * hs * dk].view(-1, hs, dk) / math.sqrt(dk)
        v = mixed[:, 2 * hs * dk:].view(-1, hs, dv)
        log_decay = torch.nn.functional.logsigmoid(h @ w[name + ".w_gate"]).double()  # [T, Hs]

        # Decay from token s to token t of one request: exp(G_t - G_s), G a running sum of log
        # decays (float64: differences of long sums keep their precision).
        cum = log_decay.cumsum(0)  # [T, Hs]
        q_start = ctx.query_start_loc[:-1].long().clamp(max=max(num_tokens - 1, 0))
        before = cum[q_start] - log_decay[q_start]  # [S, Hs]: G just before each request's query
        same = (row[:, None] == row[None, :]) & real[:, None] & (tokens[None, :] <= tokens[:, None])
        gap = (cum[:, None, :] - cum[None, :, :]).masked_fill(~same[:, :, None], -math.inf)  # [T, T, Hs]
        scores = torch.einsum("thk,shk->hts", q, k) * gap.permute(2, 0, 1).exp().to(q.dtype)
        from_start = (cum - before[row0]).exp().to(q.dtype)  # [T, Hs]: decay since the query began
        out = torch.einsum("hts,shv->thv", scores, v)
        out = out + from_start[:, :, None] * torch.einsum("thk,thkv->thv", q, ssm0[row0])

        # New states: the recurrent state after each request's last query token, and the last
        # `taps` conv inputs (from this step, or still from the old state for short queries).
        last = (ctx.query_start_loc[1:].long() - 1).clamp(0, max(num_tokens - 1, 0))  # [S]
        in_row = (row[None, :] == torch.arange(seqs, device=h.device)[:, None]) & real[None, :]  # [S, T]
        to_end = (cum[last][:, None, :] - cum[None, :, :]).masked_fill(~in_row[:, :, None], -math.inf)
        weight = to_end.exp().to(q.dtype)  # [S, T, Hs]
        decay_all = (cum[last] - before).exp().to(q.dtype)  # [S, Hs]
        ssm1 = decay_all[:, :, None, None] * ssm0 + torch.einsum("sth,thk,thv->shkv", weight, k, v)
        slot = torch.arange(taps, device=h.device)
        back_new = ctx.query_lens[:, None] - taps + slot  # [S, K-1]
        new_from_step = seqs * taps + ctx.query_start_loc[:-1].long()[:, None] + back_new
        new_from_state = torch.arange(seqs, device=h.device)[:, None] * taps + taps + back_new
        new_index = torch.where(back_new >= 0, new_from_step, new_from_state).clamp(0, source.shape[0] - 1)
        conv1 = source[new_index]  # [S, K-1, C]
        # Rows past the step have page 0 (the null page): their writes land there, unread.
        conv_pool.index_copy_(0, pages, conv1.to(conv_pool.dtype))
        ssm_pool.index_copy_(0, pages, ssm1.to(ssm_pool.dtype))
        return out.reshape(num_tokens, -1) @ w[name + ".w_out"]
