"""Which batch row each packed token belongs to, derived once per forward for every state layer."""

from __future__ import annotations

import attrs
import torch

__all__ = ["PackedRows", "segment_cumsum"]


@attrs.frozen(kw_only=True, eq=False)
class PackedRows:
    """The packing of one step's ``num_tokens`` tokens into ``S = max_num_seqs`` batch rows.

    Built by :meth:`from_context` from the step's persistent buffers with fixed-shape torch ops (no
    host sync), so it is capture-safe. Per token ``[T]``: ``row`` (int64, -1 for padding), ``row0``
    (``row`` clamped to 0, safe to index with), ``offset`` (index inside its request's query).
    Per row ``[S]``: ``first`` / ``last`` (index of the row's first / last token, clamped into the
    step), ``query_lens`` (int64) and ``has_state`` (bool: the request has context, so its state
    page holds its state; a first chunk starts from zeros). ``causal`` ``[T, T]`` bool: token ``j``
    is token ``i`` or comes before it in the same request; ``member`` ``[S, T]`` bool: token ``t``
    belongs to row ``s``.
    """

    num_tokens: int
    row: torch.Tensor
    row0: torch.Tensor
    offset: torch.Tensor
    first: torch.Tensor
    last: torch.Tensor
    query_lens: torch.Tensor
    has_state: torch.Tensor
    causal: torch.Tensor
    member: torch.Tensor

    @property
    def num_rows(self) -> int:
        """Batch rows ``S`` (the plan's ``max_num_seqs``; rows past the step have no tokens)."""
        return self.first.shape[0]

    @classmethod
    def from_context(cls, ctx: "object", num_tokens_padded: int) -> "PackedRows":
        """The packing of a forward over ``num_tokens_padded`` tokens of ``ctx``, a
        :class:`~graphkv.runtime.step.context.StepContext`. Capture-safe."""
        row = ctx.token_row[:num_tokens_padded]
        offset = ctx.token_offset[:num_tokens_padded]
        qsl = ctx.query_start_loc.long()
        top = max(num_tokens_padded - 1, 0)
        first = qsl[:-1].clamp(max=top)
        last = (qsl[1:] - 1).clamp(0, top)
        real = row >= 0
        tokens = torch.arange(num_tokens_padded, device=row.device)
        causal = (row[:, None] == row[None, :]) & real[:, None] & (tokens[None, :] <= tokens[:, None])
        rows = torch.arange(first.shape[0], device=row.device)
        member = (row[None, :] == rows[:, None]) & real[None, :]
        return cls(num_tokens=num_tokens_padded, row=row, row0=row.clamp(min=0), offset=offset, first=first, last=last,
                   query_lens=ctx.query_lens, has_state=ctx.context_lens > 0, causal=causal, member=member)


def segment_cumsum(log_decay: torch.Tensor, rows: PackedRows) -> torch.Tensor:
    """``[T, H]`` float64: the running sum of ``log_decay`` ``[T, H]`` from the start of each
    token's request to the token (inclusive). float64, so that differences of long sums keep their
    precision. Capture-safe."""
    x = log_decay.double()
    total = x.cumsum(0)
    before = total[rows.first] - x[rows.first]  # [S, H]: the sum just before each row's first token
    return total - before[rows.row0]
