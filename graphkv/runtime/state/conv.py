"""The depthwise causal convolution of a state layer over a packed step, its state in the pool."""

from __future__ import annotations

import torch

from graphkv.runtime.state.rows import PackedRows

__all__ = ["packed_causal_conv"]


def packed_causal_conv(inputs: torch.Tensor, conv_state: torch.Tensor, pages: torch.Tensor, rows: PackedRows, *,
                       weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Causal depthwise convolution of every request's tokens, continuing from its conv state.

    ``inputs``: ``[T, C]`` the convolution's inputs of the step's packed tokens. ``conv_state``:
    the layer's pool view ``[num_blocks, K - 1, C]`` (the last ``K - 1`` inputs of each request,
    oldest first); ``pages``: ``[S]`` int64 state page of each batch row (the null page 0 past the
    step). ``weight``: ``[C, K]`` (tap ``K - 1`` multiplies the current token), ``bias`` ``[C]``.
    Token ``t`` of a request reads the ``K - 1`` inputs before it — from this step, or before its
    query from the state page (zeros for a request's first chunk). Returns ``[T, C]`` (before any
    activation) in ``inputs``' dtype and writes each row's last ``K - 1`` inputs back to its page
    (rows past the step write the null page). Capture-safe.
    """
    num_tokens, channels = inputs.shape
    taps = weight.shape[1] - 1
    seqs = rows.num_rows
    old = conv_state.index_select(0, pages).to(inputs.dtype)  # [S, K-1, C]
    old = old * rows.has_state.to(inputs.dtype)[:, None, None]
    # One source of K - 1 state inputs per row, then the step's inputs: tap m of token t reads
    # the input `taps - m` tokens back in its request.
    source = torch.cat([old.reshape(seqs * taps, channels), inputs])  # [S*(K-1) + T, C]
    tap = torch.arange(taps + 1, device=inputs.device)
    back = rows.offset[:, None] - taps + tap  # [T, K]: index inside the query of each tap's input
    tokens = torch.arange(num_tokens, device=inputs.device)
    from_step = seqs * taps + tokens[:, None] - taps + tap
    from_state = rows.row0[:, None] * taps + taps + back
    index = torch.where(back >= 0, from_step, from_state).clamp(0, source.shape[0] - 1)
    out = (source[index] * weight.t().to(inputs.dtype)).sum(1)  # [T, C]
    if bias is not None:
        out = out + bias.to(inputs.dtype)
    # New state: each row's last K - 1 inputs, from this step or (short queries) the old state.
    slot = torch.arange(taps, device=inputs.device)
    back_new = rows.query_lens[:, None] - taps + slot  # [S, K-1]
    new_from_step = seqs * taps + rows.first[:, None] + back_new
    new_from_state = torch.arange(seqs, device=inputs.device)[:, None] * taps + taps + back_new
    new_index = torch.where(back_new >= 0, new_from_step, new_from_state).clamp(0, source.shape[0] - 1)
    conv_state.index_copy_(0, pages, source[new_index].to(conv_state.dtype))
    return out
