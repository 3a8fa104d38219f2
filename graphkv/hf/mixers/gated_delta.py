"""Qwen3-Next's gated delta net on the pool: ``Qwen3NextGatedDeltaNet`` with its states paged."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from graphkv.hf.mixers.base import PagedMixer
from graphkv.runtime.state.conv import packed_causal_conv
from graphkv.runtime.state.gated_delta import packed_gated_delta
from graphkv.runtime.state.rows import PackedRows

__all__ = ["PagedGatedDeltaNet"]


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # as the model's kernel, in float32


class PagedGatedDeltaNet(PagedMixer):
    """The model's projections (``in_proj_qkvz``, ``in_proj_ba`` and its head ordering), causal
    convolution, gated RMS norm and ``out_proj``, around :func:`packed_causal_conv` and
    :func:`packed_gated_delta`. States: conv ``(K - 1, 2 * key_dim + value_dim)``, recurrent
    ``(value_heads, value_head_dim, key_head_dim)`` (the plan's layout, vLLM's)."""

    def mix(self, x: torch.Tensor, pages: torch.Tensor, rows: PackedRows) -> torch.Tensor:
        """``[T, hidden] -> [T, hidden]``. Capture-safe."""
        m = self.mixer
        num_tokens = x.shape[0]
        query, key, value, z, b, a = m.fix_query_key_value_ordering(m.in_proj_qkvz(x[None]), m.in_proj_ba(x[None]))
        mixed = torch.cat([t.reshape(num_tokens, -1) for t in (query, key, value)], dim=-1)  # [T, conv_dim]
        mixed = ACT2FN[m.activation](packed_causal_conv(mixed, self.conv_state, pages, rows,
                                                        weight=m.conv1d.weight.squeeze(1), bias=m.conv1d.bias))
        query, key, value = mixed.split([m.key_dim, m.key_dim, m.value_dim], dim=-1)
        repeat = m.num_v_heads // m.num_k_heads
        query, key = (t.reshape(num_tokens, m.num_k_heads, m.head_k_dim).float().repeat_interleave(repeat, dim=1)
                      for t in (query, key))
        query = _l2norm(query) * m.head_k_dim ** -0.5
        key = _l2norm(key)
        value = value.reshape(num_tokens, m.num_v_heads, m.head_v_dim)
        beta = b[0].sigmoid()
        log_decay = -m.A_log.float().exp() * F.softplus(a[0].float() + m.dt_bias)
        out = packed_gated_delta(query, key, value, log_decay, beta, self.ssm_state, pages, rows).to(x.dtype)
        out = m.norm(out.reshape(-1, m.head_v_dim), z.reshape(-1, m.head_v_dim))
        return m.out_proj(out.reshape(num_tokens, -1))
