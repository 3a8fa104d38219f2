"""The device copies of the block tables, and the two ways they are written.

Two packings of every group's ``[max_num_seqs, width_g] int32`` table (kernel blocks) share one
buffer: the *persistent* rows (row = a request's table row) and the *per-step* rows (row = batch
row, what attention reads). Sharing one buffer lets one :func:`write_pages` launch update a
request's persistent row and its per-step row together, so a step whose requests keep their batch
rows needs no gather at all.

- On a CUDA device (or ``kernels="triton"`` anywhere) page entries are staged in pinned memory,
  copied in one transfer and written by one kernel (Triton, or its torch twin); a gather is one
  kernel too.
- On a CPU with the default kernels the buffer *is* host memory: entries are written with numpy
  straight into it (:func:`~graphkv.runtime.tables.expansion.write_pages_host`) and a gather is a
  numpy ``take`` — no staging, no copy, no torch dispatch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from graphkv.kernels.block_tables import PackedTables, gather_rows, write_pages
from graphkv.runtime.ops import torch_ops
from graphkv.runtime.tables.expansion import write_pages_host

__all__ = ["DeviceTables"]


class DeviceTables:
    """Persistent and per-step device tables of ``max_num_seqs`` rows and ``widths`` kernel blocks
    per group, in one int32 buffer; ``kernels`` is ``"triton"`` or ``"torch"`` (resolved)."""

    def __init__(self, max_num_seqs: int, widths: Sequence[int], device: torch.device, kernels: str) -> None:
        total = max_num_seqs * sum(widths)
        self.device = device
        self.storage = torch.zeros(2 * total, dtype=torch.int32, device=device)
        self.persistent = PackedTables.view_of(self.storage[:total], max_num_seqs, widths)
        self.inputs = PackedTables.view_of(self.storage[total:], max_num_seqs, widths)
        self.inputs_offset = total  # storage offset of the per-step rows
        self.on_host = device.type == "cpu" and kernels == "torch"
        self._kernels = kernels
        if self.on_host:
            flat = self.storage.numpy()
            self._flat_np = flat
            self._persistent_np = tuple(t.numpy() for t in self.persistent.tables)
            self._inputs_np = tuple(t.numpy() for t in self.inputs.tables)
            return
        self._staged = torch.empty(0, dtype=torch.int64, device=device)  # grows, never shrinks
        self._staged_host = torch.empty(0, dtype=torch.int64)
        self._idx = torch.zeros(max_num_seqs, dtype=torch.int32, device=device)
        self._idx_host = torch.zeros(max_num_seqs, dtype=torch.int32, pin_memory=device.type == "cuda")
        self._copied: torch.cuda.Event | None = None
        if device.type == "cuda":
            with torch.cuda.device(device):
                self._copied = torch.cuda.Event()

    def write(self, dst: np.ndarray, first: np.ndarray, bpk: np.ndarray) -> None:
        """Write page entries (``[n] int64`` storage offsets, first kernel blocks with ``-1`` for the
        null page, kernel blocks per page) into the buffer: numpy on host memory, else one copy and
        one launch."""
        n = dst.shape[0]
        if n == 0:
            return
        if self.on_host:
            write_pages_host(self._flat_np, dst, first, bpk)
            return
        staged = np.concatenate([dst, first, bpk.astype(np.int64, copy=False)])
        self._wait_for_last_copy()
        if self._staged.numel() < staged.size:
            size = max(staged.size, 2 * self._staged.numel())
            self._staged = torch.empty(size, dtype=torch.int64, device=self.device)
            self._staged_host = torch.empty(size, dtype=torch.int64, pin_memory=self.device.type == "cuda")
        host = self._staged_host[:staged.size]
        host.copy_(torch.from_numpy(staged))
        self._staged[:staged.size].copy_(host, non_blocking=True)
        self._record_copy()
        write = write_pages if self._kernels == "triton" else torch_ops.write_pages
        write(self.storage, self._staged, n, int(bpk.max()))

    def gather(self, rows: np.ndarray, num_reqs_padded: int) -> None:
        """Per-step row ``i`` := persistent row ``rows[i]`` for ``i < len(rows)``, and the null page
        for ``len(rows) <= i < num_reqs_padded``, in every group (one launch off the host)."""
        n = rows.shape[0]
        if self.on_host:
            for src, dst in zip(self._persistent_np, self._inputs_np):
                np.take(src, rows, axis=0, out=dst[:n])
                dst[n:num_reqs_padded] = 0
            return
        self._wait_for_last_copy()
        self._idx_host[:n].copy_(torch.from_numpy(rows.astype(np.int32, copy=False)))
        self._idx[:n].copy_(self._idx_host[:n], non_blocking=True)
        self._record_copy()
        gather = gather_rows if self._kernels == "triton" else torch_ops.gather_rows
        gather(self.persistent, self.inputs, self._idx[:n], num_reqs_padded)

    def zero_inputs(self, start: int, stop: int) -> None:
        """Per-step rows ``start .. stop - 1`` := the null page, every group."""
        if stop <= start:
            return
        if self.on_host:
            for dst in self._inputs_np:
                dst[start:stop] = 0
            return
        for table in self.inputs.tables:
            table[start:stop].zero_()

    def _wait_for_last_copy(self) -> None:
        if self._copied is not None:
            self._copied.synchronize()  # the last transfer has read the pinned staging buffers

    def _record_copy(self) -> None:
        if self._copied is not None:
            self._copied.record()
