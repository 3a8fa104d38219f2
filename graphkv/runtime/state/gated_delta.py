"""The gated delta rule over a packed step, each request's recurrent state in its state page.

Per head, with ``S`` the ``[key_dim, value_dim]`` state: ``S_t = exp(g_t) S_{t-1} + k_t^T
(beta_t (v_t - k_t exp(g_t) S_{t-1}))`` and ``o_t = q_t S_t`` (Yang et al., "Gated Delta
Networks"). The step is solved as one chunk in the WY form: the delta corrections of all its tokens
come from one unit-lower-triangular solve whose matrix is block diagonal by request, so requests
never mix. A state page holds ``S`` transposed, ``[value_dim, key_dim]`` per head: the layout the plan
lays out (:meth:`graphkv.spec.layers.state_split.StateSplit.gated_delta`, vLLM's
``gated_delta_net_state_shape``), read and written here through a transposed view.
"""

from __future__ import annotations

import torch

from graphkv.runtime.state.rows import PackedRows, segment_cumsum

__all__ = ["packed_gated_delta"]


def packed_gated_delta(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, log_decay: torch.Tensor,
                       beta: torch.Tensor, state: torch.Tensor, pages: torch.Tensor, rows: PackedRows) -> torch.Tensor:
    """Outputs ``[T, H, value_dim]`` (float32) of the gated delta rule for every packed token.

    ``query`` / ``key``: ``[T, H, key_dim]``, already normalized and (the query) scaled as the
    model does; ``value``: ``[T, H, value_dim]``; ``log_decay``: ``[T, H]`` (``g <= 0``);
    ``beta``: ``[T, H]``. ``state``: the layer's pool view ``[num_blocks, H, value_dim, key_dim]`` (each
    page holds ``S`` transposed, the plan's layout);
    ``pages``: ``[S]`` int64 state page per batch row. A request with context starts from its page,
    a first chunk from zeros; each row's final state is written back (rows past the step write the
    null page). Computed in float32, decays in float64. Capture-safe.
    """
    f32 = torch.float32
    assert state.shape[-2:] == (value.shape[-1], key.shape[-1]), "a state page is [H, value_dim, key_dim]"
    state_kv = state.transpose(-1, -2)  # [num_blocks, H, dk, dv]: S as the recurrence reads it (a view)
    q, k, v = (x.to(f32).transpose(0, 1) for x in (query, key, value))  # [H, T, D]
    beta = beta.to(f32).t()  # [H, T]
    cum = segment_cumsum(log_decay, rows)  # [T, H] float64, from each request's start
    within = (cum.t()[:, :, None] - cum.t()[:, None, :]).masked_fill(~rows.causal, float("-inf"))
    decay = within.exp().to(f32)  # [H, T, T]: exp(G_i - G_j) for j <= i in one request, else 0
    from_start = cum.t().exp().to(f32)  # [H, T]: decay since the request's query began
    old = state_kv.index_select(0, pages).to(f32) * rows.has_state.to(f32)[:, None, None, None]  # [S, H, dk, dv]
    old_of_token = old[rows.row0].transpose(0, 1)  # [H, T, dk, dv]

    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(1, 2)) * decay  # its strict lower triangle; the solve adds the unit diagonal
    new_values = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(system, k_beta * from_start[..., None], upper=False,
                                               unitriangular=True)
    # The part of each token's value its request's old state already predicts is taken out.
    v_new = new_values - torch.einsum("htk,htkv->htv", k_cumdecay, old_of_token)
    out = torch.einsum("htk,htkv->htv", q * from_start[..., None], old_of_token)
    out = out + ((q @ k.transpose(1, 2)) * decay) @ v_new

    # Final state of each row: the old state decayed over the query, plus every token's update
    # decayed from that token to the row's last token.
    to_end = (cum[rows.last][:, None, :] - cum[None, :, :]).masked_fill(~rows.member[:, :, None], float("-inf"))
    weight = to_end.exp().to(f32)  # [S, T, H]
    decay_all = cum[rows.last].exp().to(f32)  # [S, H]
    new = decay_all[:, :, None, None] * old + torch.einsum("sth,htk,htv->shkv", weight, k, v_new)
    state_kv.index_copy_(0, pages, new.to(state.dtype))  # into the pages, through the view
    return out.transpose(0, 1)
