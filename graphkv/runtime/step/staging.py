"""The step's metadata buffers: two host staging arrays and their device twins.

Everything the forward reads per step besides the block tables lives in one int32 and one int64
array, written on the host with numpy and copied to the device in two transfers (none on a CPU,
where the persistent buffers *are* the staging arrays). Layout, in entries (``S =
max_num_seqs``, ``T = max_num_batched_tokens``, ``G`` groups, ``M`` of them Mamba groups)::

    int32: query_start_loc [S + 1] | seq_lens [S] | row_valid [S] | num_reqs [1]
    int64: query_lens [S] | context_lens [S] | state page [S] x M | positions [T] | token_row [T]
           | token_offset [T] | slot_mappings [G, T]

Slot mappings are computed here, on the host, from the block tables' host mirror: the slot of a
token at position ``p`` is ``page[p // block_size] * block_size + p % block_size`` (equal to the
kernel-block formula, since page ``b`` is kernel blocks ``b * bpk ..``). State groups have no
per-token slots: their rows hold ``PAD_SLOT_ID`` from construction on.
"""

from __future__ import annotations

import numpy as np
import torch

from graphkv.plan.plan import Plan
from graphkv.runtime.padding import PAD_SLOT_ID

__all__ = ["StepStaging"]

_I64 = np.int64


class StepStaging:
    """Host staging arrays of a plan's step metadata, their device twins and named views of both."""

    def __init__(self, plan: Plan, device: torch.device) -> None:
        seqs, tokens = plan.limits.max_num_seqs, plan.limits.max_num_batched_tokens
        self.max_num_seqs, self.max_num_tokens = seqs, tokens
        self.device = device
        groups = plan.groups
        self.ssm_groups = tuple(g.index for g in groups if g.is_ssm)
        o32 = {"qsl": (0, seqs + 1), "seq": (seqs + 1, seqs), "valid": (2 * seqs + 1, seqs), "nreq": (3 * seqs + 1, 1)}
        o_pos = (2 + len(self.ssm_groups)) * seqs
        o64 = {"qlen": (0, seqs), "ctx": (seqs, seqs),
               **{f"state{g}": ((2 + i) * seqs, seqs) for i, g in enumerate(self.ssm_groups)},
               "pos": (o_pos, tokens), "row": (o_pos + tokens, tokens), "off": (o_pos + 2 * tokens, tokens),
               "slots": (o_pos + 3 * tokens, len(groups) * tokens)}
        self.host32, self.dev32 = self._pair(3 * seqs + 2, torch.int32)
        self.host64, self.dev64 = self._pair(o_pos + (3 + len(groups)) * tokens, torch.int64)
        np32, np64 = self.host32.numpy(), self.host64.numpy()
        # Host (numpy) views, written per step.
        self.qsl, self.seq_lens, self.row_valid = (np32[a:a + n] for a, n in (o32["qsl"], o32["seq"], o32["valid"]))
        self.num_reqs = np32[o32["nreq"][0]:o32["nreq"][0] + 1]
        self.query_lens, self.context_lens = (np64[a:a + n] for a, n in (o64["qlen"], o64["ctx"]))
        self.state_pages = {g: np64[o64[f"state{g}"][0]:o64[f"state{g}"][0] + seqs] for g in self.ssm_groups}
        self.positions, self.token_row, self.token_offset = (np64[a:a + n] for a, n in
                                                              (o64["pos"], o64["row"], o64["off"]))
        self.slot_mappings = np64[o64["slots"][0]:o64["slots"][0] + len(groups) * tokens].reshape(len(groups), tokens)
        self.slot_mappings[:] = PAD_SLOT_ID

        # Device views: the persistent buffers the forward reads (the same tensors every step).
        def d32(name: str) -> torch.Tensor:
            a, n = o32[name]
            return self.dev32[a:a + n]

        def d64(name: str) -> torch.Tensor:
            a, n = o64[name]
            return self.dev64[a:a + n]

        self.query_start_loc_dev, self.seq_lens_dev, self.row_valid_dev = d32("qsl"), d32("seq"), d32("valid")
        self.num_reqs_dev = self.dev32[o32["nreq"][0]]
        self.query_lens_dev, self.context_lens_dev = d64("qlen"), d64("ctx")
        self.state_pages_dev = {g: d64(f"state{g}") for g in self.ssm_groups}
        self.positions_dev, self.token_row_dev, self.token_offset_dev = d64("pos"), d64("row"), d64("off")
        self.slot_mappings_dev = d64("slots").view(len(groups), tokens)
        self._copied: torch.cuda.Event | None = None
        if device.type == "cuda":
            with torch.cuda.device(device):
                self._copied = torch.cuda.Event()

    def _pair(self, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """A host staging tensor (pinned on CUDA) and its device twin (the same tensor on a CPU)."""
        if self.device.type == "cpu":
            host = torch.zeros(n, dtype=dtype)
            return host, host
        return torch.zeros(n, dtype=dtype, pin_memory=True), torch.zeros(n, dtype=dtype, device=self.device)

    @property
    def on_host(self) -> bool:
        """True when the device buffers are the host arrays (a CPU step: no copies)."""
        return self.dev32 is self.host32

    def wait_until_read(self) -> None:
        """Block until the last transfer has read the host arrays (before overwriting them)."""
        if self._copied is not None:
            self._copied.synchronize()

    def copy_to_device(self) -> None:
        """Two non-blocking host-to-device copies (nothing on a CPU)."""
        if self.on_host:
            return
        self.dev32.copy_(self.host32, non_blocking=True)
        self.dev64.copy_(self.host64, non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def record_copy(self) -> None:
        """Mark a transfer out of pinned memory made after :meth:`copy_to_device` (e.g. token ids)."""
        if self._copied is not None:
            self._copied.record()
