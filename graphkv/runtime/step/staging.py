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
from graphkv.runtime.buffers import LedgerBuffers
from graphkv.runtime.capture.shape import StepShape
from graphkv.runtime.padding import PAD_SLOT_ID
from graphkv.runtime.tables.block_tables import BlockTables
from graphkv.runtime.tables.slots import host_slot_mappings

__all__ = ["StepStaging"]

_INT32_PARTS = ("query_start_loc", "seq_lens", "row_valid", "num_reqs")  # views of staging.int32; the rest int64


class StepStaging:
    """Host staging arrays of a plan's step metadata, their device twins and named views of both.

    The arrays are the plan's ``staging.*`` ledger entries and their views the entries' parts: the
    ledger decides the layout, this class names it. ``layout``: the device kind whose layout to
    use (default ``device``'s; ``"cuda"`` on a CPU stages through host twins and copies them, as a
    GPU does)."""

    def __init__(self, plan: Plan, device: torch.device, *, layout: str | None = None) -> None:
        seqs, tokens = plan.limits.max_num_seqs, plan.limits.max_num_batched_tokens
        self.max_num_seqs, self.max_num_tokens = seqs, tokens
        self.device = device
        groups = plan.groups
        self.ssm_groups = tuple(g.index for g in groups if g.is_ssm)
        layout = device.type if layout is None else layout
        b = LedgerBuffers.of_plan(plan, device, ("staging.",), layout=layout)
        self.dev32, self.dev64 = b.tensor("staging.int32"), b.tensor("staging.int64")
        if layout == "cpu":  # the buffers the forward reads are the host arrays
            self.host32, self.host64, host = self.dev32, self.dev64, ("staging.int32", "staging.int64")
        else:
            self.host32, self.host64 = b.tensor("staging.int32_host"), b.tensor("staging.int64_host")
            host = ("staging.int32_host", "staging.int64_host")
        assert not b.untaken(), b.untaken()

        def h(name: str) -> np.ndarray:  # a host (numpy) view, written per step
            t = b.part(host[0] if name in _INT32_PARTS else host[1], name)
            return t.numpy()

        def d(name: str) -> torch.Tensor:  # a device view: a persistent buffer the forward reads
            return b.part("staging.int32" if name in _INT32_PARTS else "staging.int64", name)

        self.qsl, self.seq_lens, self.row_valid, self.num_reqs = (h(n) for n in _INT32_PARTS)
        self.query_lens, self.context_lens = h("query_lens"), h("context_lens")
        self.state_pages = {g: h(f"state_pages.{g}") for g in self.ssm_groups}
        self.positions, self.token_row, self.token_offset = h("positions"), h("token_row"), h("token_offset")
        self.slot_mappings = h("slot_mappings")
        self.slot_mappings[:] = PAD_SLOT_ID
        self.query_start_loc_dev, self.seq_lens_dev, self.row_valid_dev = d("query_start_loc"), d("seq_lens"), \
            d("row_valid")
        self.num_reqs_dev = d("num_reqs")[0]
        self.query_lens_dev, self.context_lens_dev = d("query_lens"), d("context_lens")
        self.state_pages_dev = {g: d(f"state_pages.{g}") for g in self.ssm_groups}
        self.positions_dev, self.token_row_dev, self.token_offset_dev = d("positions"), d("token_row"), d("token_offset")
        self.slot_mappings_dev = d("slot_mappings")
        if device.type != "cpu":
            self.dev64.copy_(self.host64)  # the device's slot mappings start as PAD_SLOT_ID too
        self.last_reqs = 0  # batch rows the staging arrays hold values for (write_step)
        self._copied: torch.cuda.Event | None = None
        if device.type == "cuda":
            with torch.cuda.device(device):
                self._copied = torch.cuda.Event()

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

    def write_lengths(self, tables: BlockTables, num_reqs: int, num_tokens: int, slens: np.ndarray, ctx: np.ndarray,
                      rows: np.ndarray | None) -> list[tuple[int, np.ndarray]]:
        """Write what a step changes when its layout (``token_row`` / ``token_offset`` of its
        ``num_tokens`` tokens) is staged already: the ``num_reqs`` requests' sequence and context lengths
        (``slens``, ``ctx``: ``[num_reqs] int64``), every token's position, and the attention groups' slots
        from ``tables``' host mirror for requests in table ``rows`` (``None``: a dummy step holding
        no pages, whose slots are ``PAD_SLOT_ID``). Returns, per attention group, the page each
        token is written into (numpy only, nothing allocated but temporaries)."""
        self.seq_lens[:num_reqs] = slens
        self.context_lens[:num_reqs] = ctx
        pos = self.positions[:num_tokens]
        decode = num_tokens == num_reqs
        if decode:
            pos[:] = ctx
        else:
            token_row = self.token_row[:num_tokens]
            np.add(self.token_offset[:num_tokens], ctx[token_row], out=pos)
        if rows is None:
            self.slot_mappings[:, :num_tokens] = PAD_SLOT_ID
            return []
        return host_slot_mappings(tables, rows if decode else rows[token_row], pos, self.slot_mappings)

    def write_step(self, tables: BlockTables, shape: StepShape, qlens: np.ndarray, slens: np.ndarray,
                   ctx: np.ndarray, rows: np.ndarray | None, *, same: bool) -> list[tuple[int, np.ndarray]]:
        """Write the step's metadata and slot mappings (from ``tables``' host mirror) into the staging arrays for
        ``shape`` (numpy only; ``rows`` ``None``: a dummy step whose requests hold no pages). With ``same`` (the last
        step had these requests, query lengths and shape) only lengths, positions and slots are
        rewritten. Returns, per attention group, the page each token is written into."""
        num_reqs, num_tokens, num_tokens_padded = shape.num_reqs, shape.num_tokens, shape.num_tokens_padded
        st, arange = self, tables.mirror.arange
        st.wait_until_read()
        decode = num_tokens == num_reqs
        if not same:
            st.qsl[0] = 0
            np.cumsum(qlens, out=st.qsl[1:num_reqs + 1])
            st.qsl[num_reqs + 1:] = num_tokens
            st.num_reqs[0] = num_reqs
            st.query_lens[:num_reqs] = qlens
            st.row_valid[:num_reqs] = 1
            stale = self.last_reqs  # rows [num_reqs, stale) hold the last step's values
            if stale > num_reqs:
                for array in (st.seq_lens, st.row_valid, st.query_lens, st.context_lens, *st.state_pages.values()):
                    array[num_reqs:stale] = 0
            for g, pages in st.state_pages.items():
                pages[:num_reqs] = tables.state_pages(g, rows) if rows is not None else 0
            if decode:
                st.token_row[:num_reqs] = arange[:num_reqs]
                st.token_offset[:num_reqs] = 0
            else:
                st.token_row[:num_tokens] = np.repeat(arange[:num_reqs], qlens)
                np.subtract(arange[:num_tokens], st.qsl[st.token_row[:num_tokens]],
                            out=st.token_offset[:num_tokens])
            if num_tokens_padded > num_tokens:
                st.token_row[num_tokens:num_tokens_padded] = -1
                st.token_offset[num_tokens:num_tokens_padded] = 0
                st.positions[num_tokens:num_tokens_padded] = 0
                st.slot_mappings[:, num_tokens:num_tokens_padded] = PAD_SLOT_ID
        self.last_reqs = num_reqs
        return st.write_lengths(tables, num_reqs, num_tokens, slens, ctx, rows)
