"""Mamba2's selective state-space scan over a packed step, each request's state in its state page.

Per head ``h`` with state ``[head_dim, state_size]``: ``S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t
B_t^T`` and ``y_t = S_t C_t`` (Dao & Gu, "Transformers are SSMs"). With a scalar decay per head the
step's outputs are one masked ``[H, T, T]`` product (the "attention" form of the duality), the
mask keeping each request to itself.
"""

from __future__ import annotations

import torch

from graphkv.runtime.state.rows import PackedRows, segment_cumsum

__all__ = ["packed_ssd"]


def packed_ssd(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
               state: torch.Tensor, pages: torch.Tensor, rows: PackedRows) -> torch.Tensor:
    """Outputs ``[T, H, head_dim]`` (float32) of the scan, without the ``D`` skip term.

    ``x``: ``[T, H, head_dim]``; ``dt``: ``[T, H]`` time steps (bias, softplus and limits already
    applied); ``a``: ``[H]``, or ``[T, H]`` per token (negative); ``b`` / ``c``: ``[T, H, state_size]`` (groups already
    repeated to heads). ``state``: the layer's pool view ``[num_blocks, H, head_dim, state_size]``;
    ``pages``: ``[S]`` int64 state page per batch row. A request with context starts from its page,
    a first chunk from zeros; each row's final state is written back (rows past the step write the
    null page). Computed in float32, decays in float64. Capture-safe.
    """
    f32 = torch.float32
    x, dt, b, c = x.to(f32), dt.to(f32), b.to(f32), c.to(f32)
    cum = segment_cumsum(dt * a.to(f32), rows)  # [T, H] float64
    within = (cum.t()[:, :, None] - cum.t()[:, None, :]).masked_fill(~rows.causal, float("-inf"))
    decay = within.exp().to(f32)  # [H, T, T]
    old = state.index_select(0, pages).to(f32) * rows.has_state.to(f32)[:, None, None, None]  # [S, H, P, N]
    scores = torch.einsum("thn,shn->hts", c, b) * decay  # [H, T(target), T(source)]
    y = torch.einsum("hts,sh,shp->thp", scores, dt, x)
    y = y + cum.exp().to(f32)[..., None] * torch.einsum("thn,thpn->thp", c, old[rows.row0])

    to_end = (cum[rows.last][:, None, :] - cum[None, :, :]).masked_fill(~rows.member[:, :, None], float("-inf"))
    weight = to_end.exp().to(f32) * dt[None]  # [S, T, H]
    new = cum[rows.last].exp().to(f32)[:, :, None, None] * old + torch.einsum("sth,thp,thn->shpn", weight, x, b)
    state.index_copy_(0, pages, new.to(state.dtype))
    return y
