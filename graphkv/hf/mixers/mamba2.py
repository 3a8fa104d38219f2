"""Nemotron-H's Mamba2 mixer on the pool: ``NemotronHMamba2Mixer`` with its states paged."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graphkv.hf.mixers.base import PagedMixer
from graphkv.runtime.state.conv import packed_causal_conv
from graphkv.runtime.state.rows import PackedRows
from graphkv.runtime.state.ssd import packed_ssd

__all__ = ["PagedMamba2Mixer"]


class PagedMamba2Mixer(PagedMixer):
    """The model's ``in_proj``, causal convolution, ``A_log`` / ``D`` / ``dt_bias``, gated group
    RMS norm and ``out_proj``, around :func:`packed_causal_conv` and :func:`packed_ssd`. States:
    conv ``(K - 1, intermediate + 2 * groups * state_size)``, ssm ``(heads, head_dim, state_size)``.

    Time steps are clamped to the model's ``time_step_limit`` where transformers' own chunked path
    clamps them — tokens of multi-token queries and of a request's first chunk — and not for
    single-token continuations, which its decode path leaves unclamped (vLLM clamps neither)."""

    def mix(self, x: torch.Tensor, pages: torch.Tensor, rows: PackedRows) -> torch.Tensor:
        """``[T, hidden] -> [T, hidden]``. Capture-safe."""
        m = self.mixer
        num_tokens = x.shape[0]
        gate, xbc, dt = m.in_proj(x).split([m.intermediate_size, m.conv_dim, m.num_heads], dim=-1)
        xbc = m.act(packed_causal_conv(xbc, self.conv_state, pages, rows, weight=m.conv1d.weight.squeeze(1),
                                       bias=m.conv1d.bias))
        groups_size = m.n_groups * m.ssm_state_size
        hidden, b, c = xbc.split([m.intermediate_size, groups_size, groups_size], dim=-1)
        dt = F.softplus(dt + m.dt_bias.to(dt.dtype))
        low, high = m.time_step_limit
        chunked = ((rows.query_lens > 1) | ~rows.has_state)[rows.row0]  # [T]: the model's chunked path
        dt = torch.where(chunked[:, None], dt.clamp(low, high), dt)
        hidden = hidden.reshape(num_tokens, m.num_heads, m.head_dim)
        per_group = m.num_heads // m.n_groups
        b, c = (t.reshape(num_tokens, m.n_groups, m.ssm_state_size).repeat_interleave(per_group, dim=1)
                for t in (b, c))
        y = packed_ssd(hidden, dt, -torch.exp(m.A_log.float()), b, c, self.ssm_state, pages, rows)
        y = y + m.D.float()[:, None] * hidden.float()
        y = m.norm(y.reshape(1, num_tokens, -1), gate[None])
        return m.out_proj(y[0].to(x.dtype))
