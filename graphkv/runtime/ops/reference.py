"""Pure-torch references for the runtime kernels: slow, obvious, one per kernel.

Every kernel test compares against these (and nothing else), so a reference is written once.
They index the *logical* cache views (never raw strides), so they check the kernels' stride
arithmetic rather than repeat it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from graphkv.runtime.padding import PAD_SLOT_ID
from graphkv.spec.backends import CacheOrder, KVLayout

__all__ = ["PAD_SLOT_ID", "causal_conv_ref", "expand_pages_ref", "gather_ref", "gated_delta_ref", "linear_ref",
           "paged_decode_attention_ref", "reshape_and_cache_ref", "slot_mapping_ref", "ssd_ref", "write_pages_ref"]


def expand_pages_ref(page_ids: Sequence[int], bpk: int) -> list[int]:
    """Kernel blocks of ``page_ids``: page ``b`` -> ``b*bpk .. b*bpk + bpk - 1``."""
    return [b * bpk + k for b in page_ids for k in range(bpk)]


def write_pages_ref(flat: torch.Tensor, dst: Sequence[int], first: Sequence[int], bpk: Sequence[int]) -> torch.Tensor:
    """A copy of ``flat`` with page entry ``e`` written: ``first[e] + k`` (0 when ``first[e] < 0``,
    the null page) at ``dst[e] + k`` for ``k < bpk[e]``."""
    out = flat.cpu().clone()
    for d, f, b in zip(dst, first, bpk):
        for k in range(b):
            out[d + k] = 0 if f < 0 else f + k
    return out


def gather_ref(tables: Sequence[torch.Tensor], idx_mapping: torch.Tensor, num_reqs_padded: int) -> list[torch.Tensor]:
    """Per group ``[num_reqs_padded, width] int32``: rows of ``idx_mapping``, then null-page rows."""
    out = []
    for t in tables:
        rows = torch.zeros(num_reqs_padded, t.shape[1], dtype=t.dtype)
        rows[:idx_mapping.shape[0]] = t.cpu()[idx_mapping.cpu().long()]
        out.append(rows)
    return out


def slot_mapping_ref(query_start_loc: torch.Tensor, positions: torch.Tensor, tables: Sequence[torch.Tensor],
                     kernel_block_sizes: Sequence[int], num_reqs: int, max_num_tokens: int,
                     state_groups: Sequence[bool] = ()) -> torch.Tensor:
    """``[num_groups, max_num_tokens] int64``: ``table[r, p // kbs] * kbs + p % kbs`` for each
    token of batch row ``r``; ``PAD_SLOT_ID`` past the last token and for state groups. Passing
    page tables with ``kbs = block_size`` gives the whole-page slots."""
    qsl = query_start_loc.cpu().long()
    pos = positions.cpu().long()
    out = torch.full((len(tables), max_num_tokens), PAD_SLOT_ID, dtype=torch.int64)
    for g, (table, kbs) in enumerate(zip(tables, kernel_block_sizes)):
        if g < len(state_groups) and state_groups[g]:
            continue
        table = table.cpu().long()
        for r in range(num_reqs):
            for t in range(int(qsl[r]), int(qsl[r + 1])):
                p = int(pos[t])
                out[g, t] = table[r, p // kbs] * kbs + p % kbs
    return out


def _kv_index(layout: KVLayout, kv: int, kernel_block: int, offset: int) -> tuple[int, ...]:
    if layout.order is CacheOrder.BLOCKS_FIRST:
        return (kernel_block, kv, offset)
    if layout.order is CacheOrder.KV_FIRST:
        return (kv, kernel_block, offset)
    return (kernel_block, offset)  # LATENT


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` in float64 on the CPU, each output a sum of exact products (one float64 rounding)."""
    out = x.cpu().double() @ weight.cpu().double().T
    return out if bias is None else out + bias.cpu().double()


def reshape_and_cache_ref(key: torch.Tensor, value: torch.Tensor | None, kv_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, *, layout: KVLayout) -> None:
    """Write token ``t``'s K/V at slot ``s = slot_mapping[t]`` (skip ``s < 0``) through the
    logical view: kernel block ``s // kbs``, offset ``s % kbs``. In place."""
    kbs = kv_cache.shape[1] if layout.order is CacheOrder.LATENT else kv_cache.shape[2]
    for t in range(key.shape[0]):
        s = int(slot_mapping[t])
        if s < 0:
            continue
        kv_cache[_kv_index(layout, 0, s // kbs, s % kbs)] = key[t].reshape(kv_cache.shape[-1]) \
            if layout.order is CacheOrder.LATENT else key[t]
        if value is not None:
            kv_cache[_kv_index(layout, 1, s // kbs, s % kbs)] = value[t]


def paged_decode_attention_ref(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                               seq_lens: torch.Tensor, *, layout: KVLayout, scale: float | None = None,
                               sliding_window: int | None = None, sinks: torch.Tensor | None = None,
                               softcap: float | None = None) -> torch.Tensor:
    """``[num_seqs, Hq, D]`` float64: per sequence, gather K/V of positions ``0 .. seq_len-1``
    through the table and attend the query at position ``seq_len - 1`` (only keys ``x`` with
    ``seq_len - 1 - x < sliding_window`` if given); sequences of length 0 give zeros. Scores are
    ``scale * q.k``, then ``softcap * tanh(score / softcap)`` if given; ``sinks`` ``[Hq]`` adds one
    logit per head to the softmax that attends no value (its weight is dropped)."""
    num_seqs, num_q_heads, dim = query.shape
    kbs = kv_cache.shape[2]
    scale = dim ** -0.5 if scale is None else scale
    out = torch.zeros(query.shape, dtype=torch.float64)
    k_of = kv_cache[:, 0] if layout.order is CacheOrder.BLOCKS_FIRST else kv_cache[0]
    v_of = kv_cache[:, 1] if layout.order is CacheOrder.BLOCKS_FIRST else kv_cache[1]
    for s in range(num_seqs):
        n = int(seq_lens[s])
        if n == 0:
            continue
        x = torch.arange(n)
        if sliding_window is not None:
            x = x[(n - 1) - x < sliding_window]
        blocks = block_table[s].cpu().long()[x // kbs]
        k = k_of.cpu()[blocks, x % kbs].double()  # [n, Hkv, D]
        v = v_of.cpu()[blocks, x % kbs].double()
        group = num_q_heads // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", query[s].cpu().double(), k) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        if sinks is not None:
            scores = torch.cat([scores, sinks.cpu().double()[:, None]], dim=1)
        weights = scores.softmax(dim=-1)[:, :k.shape[0]]
        out[s] = torch.einsum("hn,nhd->hd", weights, v)
    return out


def causal_conv_ref(inputs: torch.Tensor, state: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's causal depthwise convolution, token by token, in float64: ``inputs`` ``[n,
    C]`` after ``state`` ``[K - 1, C]`` (the inputs before them, oldest first); ``weight`` ``[C,
    K]`` (tap ``K - 1`` on the current token). Returns outputs ``[n, C]`` and the new state (the
    last ``K - 1`` inputs)."""
    window = torch.cat([state.double(), inputs.double()])
    taps = weight.shape[1]
    out = torch.stack([(window[t:t + taps].t() * weight.double()).sum(1) for t in range(inputs.shape[0])]) \
        if inputs.shape[0] else window.new_zeros(0, inputs.shape[1])
    if bias is not None:
        out = out + bias.double()
    return out, window[window.shape[0] - (taps - 1):]


def gated_delta_ref(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, log_decay: torch.Tensor,
                    beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's gated delta rule, token by token, in float64: per head ``S <- exp(g) S``, then
    ``S <- S + k (beta (v - S^T k))^T`` and ``o = S^T q``. ``query`` / ``key`` ``[n, H, dk]``,
    ``value`` ``[n, H, dv]``, ``log_decay`` / ``beta`` ``[n, H]``, ``state`` ``[H, dk, dv]``.
    Returns outputs ``[n, H, dv]`` and the final state."""
    s = state.double().clone()
    outs = []
    for t in range(query.shape[0]):
        s = s * log_decay[t].double().exp()[:, None, None]
        k, v, q = key[t].double(), value[t].double(), query[t].double()
        delta = (v - torch.einsum("hkv,hk->hv", s, k)) * beta[t].double()[:, None]
        s = s + k[:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", s, q))
    return (torch.stack(outs) if outs else value.new_zeros(0, *value.shape[1:]).double()), s


def ssd_ref(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
            state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's Mamba2 scan, token by token, in float64: per head ``S <- exp(dt a) S + dt x
    b^T`` and ``y = S c``. ``x`` ``[n, H, P]``, ``dt`` ``[n, H]``, ``a`` ``[H]``, ``b`` / ``c``
    ``[n, H, N]``, ``state`` ``[H, P, N]``. Returns outputs ``[n, H, P]`` and the final state."""
    s = state.double().clone()
    outs = []
    for t in range(x.shape[0]):
        step = dt[t].double()
        s = s * (step * a.double()).exp()[:, None, None] + step[:, None, None] * x[t].double()[:, :, None] \
            * b[t].double()[:, None, :]
        outs.append(torch.einsum("hpn,hn->hp", s, c[t].double()))
    return (torch.stack(outs) if outs else x.new_zeros(0, *x.shape[1:]).double()), s
