"""Greedy tokens sampled on the device and read on the host one step later.

A serving loop that launches step n+1 before reading step n's tokens (the overlap of
:class:`~graphkv.models.demo_engine.DemoEngine`) needs step n's tokens twice: on the device, as step
n+1's input ids, and on the host, to extend its requests. :class:`GreedySampler` writes each step's
argmax into one of two persistent device buffers, queues its copy into a pinned host buffer behind
it and records an event; :meth:`SampledTokens.read` waits for that event only. The two buffers are
used in turn, so step n+1 samples into one while step n's tokens (the other) are its input and are
read. A buffer is written again two samples later, after the sample in between was read: its event
covers every copy queued before it, so no copy still pending reads a buffer being rewritten.

On a CPU every copy is synchronous and there is no event; the logic is the same.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import torch

from graphkv.errors import Problem, SpecError

__all__ = ["GreedySampler", "SampledTokens"]


@attrs.define
class SampledTokens:
    """One step's greedy tokens: ``tokens`` on the device (``[n] int64``, a view of a persistent
    buffer: the next step's input ids), their copy to the host (``host``; complete once ``ready``
    is, at once on a CPU) and ``owners``, what each row's token belongs to (the caller's, in row
    order)."""

    owners: list[Any]
    tokens: torch.Tensor
    host: torch.Tensor
    ready: "torch.cuda.Event | None"

    def read(self) -> list[int]:
        """The tokens on the host, waiting for their copy (the one sync of a step)."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


class GreedySampler:
    """Greedy sampling into two device buffers of ``max_rows`` tokens and their pinned host twins,
    used in turn (see the module docstring). Buffers are allocated at the first :meth:`sample`, on
    the logits' device: ``4 * max_rows`` int64 on each side, a few KiB."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._tokens: list[torch.Tensor] = []
        self._tokens_host: list[torch.Tensor] = []
        self._rows: list[torch.Tensor] = []
        self._rows_host: list[torch.Tensor] = []
        self._ready: list[torch.cuda.Event | None] = [None, None]
        self._flip = 0

    def sample(self, logits: torch.Tensor, rows: Sequence[int], owners: list[Any]) -> SampledTokens:
        """The argmax of ``logits[rows]`` (``rows``: at most ``max_rows`` row indices) into the next
        buffer, its copy to the host queued behind it; nothing is waited for. ``owners``: one per row.
        Raises :class:`SpecError` for no rows, more than ``max_rows``, an owner count that differs or a
        row outside the logits."""
        n = len(rows)
        if not 0 < n <= self.max_rows or len(owners) != n:
            raise SpecError(Problem(field="rows", value=f"{n} rows, {len(owners)} owners",
                                    limit=f"must be 1..{self.max_rows} rows (max_rows), one owner each",
                                    fix="sample the rows of the step's requests, with one owner per row"))
        if not self._tokens:
            self._allocate(logits.device)
        self._flip ^= 1
        tokens, host = self._tokens[self._flip][:n], self._tokens_host[self._flip][:n]
        if (isinstance(rows, range) and rows.start == 0 and rows.step == 1) or list(rows) == list(range(n)):
            picked = logits[:n]  # the first n rows: no index
        else:  # the rows through pinned memory: a pageable copy would wait for the forward
            if min(rows) < 0 or max(rows) >= logits.shape[0]:
                raise SpecError(Problem(field="rows", value=[r for r in rows if not 0 <= r < logits.shape[0]],
                                        limit=f"must be row indices of the logits (0..{logits.shape[0] - 1})",
                                        fix="pass the rows of the step's logits to sample"))
            index, index_host = self._rows[self._flip][:n], self._rows_host[self._flip][:n]
            index_host.numpy()[:] = rows
            index.copy_(index_host, non_blocking=index.device.type == "cuda")
            picked = logits.index_select(0, index)
        torch.argmax(picked, dim=-1, out=tokens)
        ready = None
        if tokens.device.type == "cuda":
            host.copy_(tokens, non_blocking=True)
            ready = self._ready[self._flip]
            ready.record(torch.cuda.current_stream(tokens.device))
        else:
            host.copy_(tokens)
        return SampledTokens(owners=owners, tokens=tokens, host=host, ready=ready)

    def _allocate(self, device: torch.device) -> None:
        rows, pinned = self.max_rows, device.type == "cuda"
        self._tokens = [torch.zeros(rows, dtype=torch.int64, device=device) for _ in range(2)]
        self._tokens_host = [torch.zeros(rows, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self._rows = [torch.zeros(rows, dtype=torch.int64, device=device) for _ in range(2)]
        self._rows_host = [torch.zeros(rows, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        if device.type == "cuda":
            with torch.cuda.device(device):
                self._ready = [torch.cuda.Event() for _ in range(2)]
