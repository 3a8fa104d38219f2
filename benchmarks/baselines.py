"""The peers graphkv's runtime benchmarks measure against, written here from the algorithms they follow.

Nothing is imported from vLLM or nano-vllm (importing vLLM needs its whole dependency tree); each
class follows the host-side algorithm of its peer step for step, on CPU tensors standing in for the
device (the runtime benchmarks run on a CPU, where a "device" op is real work):

- :class:`V1BlockTable` — vLLM V1's ``BlockTable`` (``v1/worker/block_table.py``): a preallocated
  numpy table in pages, a per-row count array, ``append_row`` as one slice write per row, a commit
  that copies the table's first ``num_reqs`` rows to the device in one copy, and the kernel-block
  table made on the device with one broadcast add (``map_to_kernel_block_table``) when pages are
  split.
- :class:`MRV2BlockTables` — Model Runner V2's staged writes (``v1/worker/gpu/block_table.py``,
  ``buffer_utils.py``): ``append_block_ids`` stages (row, start, ids) in Python lists,
  ``apply_staged_writes`` copies the lists into preallocated numpy staging arrays, builds the
  contents tensor with ``torch.tensor`` and scatters them on the device (one torch scatter stands in
  for its Triton kernel), then the per-step gather (``index_select`` for its gather kernel) and the
  same kernel-block add.
- :class:`ListTables` — the list-to-tensor path small engines use (nano-vllm's
  ``prepare_block_tables``): each request's pages in a Python list, the step's table built with
  ``torch.tensor`` of the padded lists, then the kernel-block add.
- :func:`list_to_tensor_decode` / :class:`V1DecodeInputs` — a decode step's inputs built from Python
  lists with ``torch.tensor`` (nano-vllm's ``prepare_decode``) and with V1's preallocated numpy
  buffers and one copy each (its ``_prepare_inputs``).
- :class:`ListBlockManager` / :class:`V1Finish` — a finished request's pages given back: nano-vllm's
  ``BlockManager.deallocate`` (a Python reference count per page, a free list and a used set), and
  vLLM V1's ``KVCacheManager.free`` (per group: the request's block list popped, each block's
  ``ref_cnt`` lowered, the freed ones linked onto the free-block queue, a doubly linked list) with
  ``InputBatch.remove_request`` (the request's index and per-request sampling entries dropped; the
  table row is left for the next condense).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

__all__ = ["ListBlockManager", "ListTables", "MRV2BlockTables", "V1BlockTable", "V1DecodeInputs", "V1Finish",
           "list_to_tensor_decode"]


def kernel_block_table(pages: torch.Tensor, bpk: int, out: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``out[r, c * bpk + k] = pages[r, c] * bpk + k``: V1's ``map_to_kernel_block_table`` (one add)."""
    rows, cols = pages.shape
    view = out[:rows, :cols * bpk]
    torch.add(offsets, pages.unsqueeze(-1), alpha=bpk, out=view.unflatten(1, (cols, -1)))
    return view


class V1BlockTable:
    """vLLM V1's block table of one group: numpy pages + counts, one copy per commit, one add for kernel blocks."""

    def __init__(self, max_num_reqs: int, max_pages: int, bpk: int) -> None:
        self.cpu = torch.zeros(max_num_reqs, max_pages, dtype=torch.int32)  # pinned on a GPU host
        self.np = self.cpu.numpy()
        self.gpu = torch.zeros(max_num_reqs, max_pages, dtype=torch.int32)
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)
        self.bpk = bpk
        self.kernel = torch.zeros(max_num_reqs, max_pages * bpk, dtype=torch.int32)
        self.offsets = torch.arange(bpk, dtype=torch.int32)

    def append_row(self, block_ids: list[int], row_idx: int) -> None:
        """Append ``block_ids`` to row ``row_idx`` (one slice write)."""
        if not block_ids:
            return
        num_blocks = len(block_ids)
        start = self.num_blocks_per_row[row_idx]
        self.num_blocks_per_row[row_idx] += num_blocks
        self.np[row_idx, start:start + num_blocks] = block_ids

    def commit_and_map(self, num_reqs: int) -> torch.Tensor:
        """Copy the first ``num_reqs`` rows to the device; the kernel-block table when pages are split."""
        self.gpu[:num_reqs].copy_(self.cpu[:num_reqs], non_blocking=True)
        if self.bpk == 1:
            return self.gpu[:num_reqs]
        return kernel_block_table(self.gpu[:num_reqs], self.bpk, self.kernel, self.offsets)

    def truncate(self, rows: Sequence[int], keep: int) -> None:
        """Reset rows to ``keep`` pages (between benchmark rounds, untimed)."""
        for r in rows:
            self.np[r, keep:self.num_blocks_per_row[r]] = 0
            self.num_blocks_per_row[r] = keep


class MRV2BlockTables:
    """Model Runner V2's block tables of one group: staged (row, start, ids) lists, one scatter, a gather."""

    def __init__(self, max_num_reqs: int, max_pages: int, bpk: int) -> None:
        self.gpu = torch.zeros(max_num_reqs, max_pages, dtype=torch.int32)
        self.input = torch.zeros(max_num_reqs, max_pages, dtype=torch.int32)
        self.num_blocks = np.zeros((1, max_num_reqs), dtype=np.int32)
        self.num_blocks_uva = np.zeros((1, max_num_reqs), dtype=np.int32)
        self._indices: list[int] = []
        self._starts: list[int] = []
        self._contents: list[int] = []
        self._cu_lens: list[int] = []
        self.write_indices = np.zeros(max_num_reqs, dtype=np.int32)  # UVA staging buffers
        self.write_starts = np.zeros(max_num_reqs, dtype=np.int32)
        self.write_cu_lens = np.zeros(max_num_reqs, dtype=np.int32)
        self.bpk = bpk
        self.kernel = torch.zeros(max_num_reqs, max_pages * bpk, dtype=torch.int32)
        self.offsets = torch.arange(bpk, dtype=torch.int32)
        self.row_capacity = max_pages

    def append_block_ids(self, req_index: int, new_block_ids: tuple[list[int], ...]) -> None:
        """Stage ``new_block_ids[0]`` after the row's pages (one group)."""
        start = int(self.num_blocks[0, req_index])
        block_ids = new_block_ids[0]
        end = start + len(block_ids)
        if end > self.row_capacity:
            raise RuntimeError("row capacity exceeded")
        if block_ids:
            self._indices.append(req_index)
            self._starts.append(start)
            self._contents.extend(block_ids)
            self._cu_lens.append(len(self._contents))
        self.num_blocks[0, req_index] = end

    def apply_and_gather(self, idx_mapping: torch.Tensor, num_reqs: int) -> torch.Tensor:
        """Apply the staged writes, gather the step's rows and make the kernel-block table."""
        n = len(self._indices)
        if n:
            self.write_indices[:n] = self._indices
            self.write_starts[:n] = self._starts
            self.write_cu_lens[:n] = self._cu_lens
            contents = torch.tensor(self._contents, dtype=torch.int32)  # async_tensor_h2d
            # The apply kernel, as one scatter: value j of write i goes to row i, column start_i + j.
            cu = torch.from_numpy(self.write_cu_lens[:n]).long()
            lens = torch.diff(cu, prepend=torch.zeros(1, dtype=torch.long))
            rows = torch.from_numpy(self.write_indices[:n]).long().repeat_interleave(lens)
            shift = torch.from_numpy(self.write_starts[:n]).long() - (cu - lens)
            cols = shift.repeat_interleave(lens) + torch.arange(contents.shape[0])
            self.gpu.view(-1).index_copy_(0, rows * self.gpu.shape[1] + cols, contents)
            self._indices.clear()
            self._starts.clear()
            self._contents.clear()
            self._cu_lens.clear()
        self.num_blocks_uva[:] = self.num_blocks  # copy_to_uva
        torch.index_select(self.gpu, 0, idx_mapping, out=self.input[:num_reqs])  # the gather kernel
        if self.bpk == 1:
            return self.input[:num_reqs]
        return kernel_block_table(self.input[:num_reqs], self.bpk, self.kernel, self.offsets)

    def truncate(self, rows: Sequence[int], keep: int) -> None:
        """Reset rows to ``keep`` pages (between benchmark rounds, untimed)."""
        for r in rows:
            self.gpu[r, keep:] = 0
            self.num_blocks[0, r] = keep


class ListTables:
    """Block tables as Python lists per request; each step's table built with ``torch.tensor``."""

    def __init__(self, max_num_reqs: int, max_pages: int, bpk: int) -> None:
        self.tables: list[list[int]] = [[] for _ in range(max_num_reqs)]
        self.bpk = bpk
        self.kernel = torch.zeros(max_num_reqs, max_pages * bpk, dtype=torch.int32)
        self.offsets = torch.arange(bpk, dtype=torch.int32)

    def append(self, row: int, block_ids: list[int]) -> None:
        """Extend the request's page list."""
        self.tables[row].extend(block_ids)

    def prepare(self, rows: Sequence[int]) -> torch.Tensor:
        """nano-vllm's ``prepare_block_tables``: pad the lists and convert once; kernel blocks by one add."""
        tables = [self.tables[r] for r in rows]
        width = max(len(t) for t in tables)
        pages = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        if self.bpk == 1:
            return pages
        return kernel_block_table(pages, self.bpk, self.kernel, self.offsets)

    def truncate(self, rows: Sequence[int], keep: int) -> None:
        """Reset rows to ``keep`` pages (between benchmark rounds, untimed)."""
        for r in rows:
            del self.tables[r][keep:]


class Seq:
    """A running request as small engines keep it: its tokens and its pages per group in lists."""

    def __init__(self, tokens: list[int], block_tables: list[list[int]]) -> None:
        self.token_ids = tokens
        self.block_tables = block_tables  # per group; a state group's list holds its one page

    def __len__(self) -> int:
        return len(self.token_ids)


def list_to_tensor_decode(seqs: Sequence[Seq], attention_groups: Sequence[int], state_groups: Sequence[int],
                          block_size: int) -> tuple[torch.Tensor, ...]:
    """nano-vllm's ``prepare_decode`` for a hybrid model: per-request Python lists, one ``torch.tensor``
    each (input ids, positions, context lengths, per-group slot mappings, state pages, block tables)."""
    input_ids, positions, context_lens = [], [], []
    slots: list[list[int]] = [[] for _ in attention_groups]
    states: list[list[int]] = [[] for _ in state_groups]
    for seq in seqs:
        n = len(seq)
        input_ids.append(seq.token_ids[-1])
        positions.append(n - 1)
        context_lens.append(n)
        for i, g in enumerate(attention_groups):
            table = seq.block_tables[g]
            slots[i].append(table[-1] * block_size + (n - 1) % block_size)
        for i, g in enumerate(state_groups):
            states[i].append(seq.block_tables[g][0])
    out = [torch.tensor(input_ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64),
           torch.tensor(context_lens, dtype=torch.int32)]
    out += [torch.tensor(s, dtype=torch.int64) for s in slots]
    out += [torch.tensor(s, dtype=torch.int64) for s in states]
    for g in attention_groups:
        width = max(len(seq.block_tables[g]) for seq in seqs)
        out.append(torch.tensor([seq.block_tables[g] + [-1] * (width - len(seq.block_tables[g])) for seq in seqs],
                                dtype=torch.int32))
    return tuple(out)


class V1DecodeInputs:
    """vLLM V1's ``_prepare_inputs`` for a decode step: preallocated numpy buffers, vectorized index
    math, the block table committed by one copy, slot mappings from the numpy table, one copy per buffer."""

    def __init__(self, max_num_reqs: int, max_num_tokens: int, max_pages: Sequence[int], max_model_len: int,
                 block_size: int, attention_groups: Sequence[int], state_groups: Sequence[int]) -> None:
        self.tables = [V1BlockTable(max_num_reqs, p, 1) for p in max_pages]
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_computed = np.zeros(max_num_reqs, dtype=np.int32)
        self.arange = np.arange(max(max_num_reqs, max_num_tokens) + 1, dtype=np.int64)
        self.block_size = block_size
        self.attention, self.state = list(attention_groups), list(state_groups)

        def pair(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype)

        self.input_ids = pair(max_num_tokens, torch.int32)
        self.positions = pair(max_num_tokens, torch.int64)
        self.query_start_loc = pair(max_num_reqs + 1, torch.int32)
        self.seq_lens = pair(max_num_reqs, torch.int32)
        self.slots = [pair(max_num_tokens, torch.int64) for _ in attention_groups]
        self.states = [pair(max_num_reqs, torch.int32) for _ in state_groups]

    def prepare(self, num_reqs: int, num_scheduled: np.ndarray) -> None:
        """One step's inputs for requests in rows ``0 .. num_reqs - 1`` (the persistent batch)."""
        total = int(num_scheduled.sum())
        req_indices = np.repeat(self.arange[:num_reqs], num_scheduled)
        cu = np.cumsum(num_scheduled)
        offsets = self.arange[:total] - np.repeat(cu - num_scheduled, num_scheduled)
        positions = self.positions[0].numpy()[:total]
        np.add(self.num_computed[req_indices], offsets, out=positions)
        token_index = positions + req_indices * self.token_ids.shape[1]
        np.take(self.token_ids.ravel(), token_index, out=self.input_ids[0].numpy()[:total])
        qsl = self.query_start_loc[0].numpy()
        qsl[0] = 0
        qsl[1:num_reqs + 1] = cu
        np.add(self.num_computed[:num_reqs], num_scheduled, out=self.seq_lens[0].numpy()[:num_reqs])
        for table in self.tables:
            table.commit_and_map(num_reqs)
        for i, g in enumerate(self.attention):
            np_table = self.tables[g].np
            block_numbers = np_table.ravel()[req_indices * np_table.shape[1] + positions // self.block_size]
            np.add(block_numbers * self.block_size, positions % self.block_size, out=self.slots[i][0].numpy()[:total])
        for i, g in enumerate(self.state):
            self.states[i][0].numpy()[:num_reqs] = self.tables[g].np[:num_reqs, 0]
        for (host, dev), used in ((self.input_ids, total), (self.positions, total), (self.query_start_loc, num_reqs + 1),
                                  (self.seq_lens, num_reqs), *((s, total) for s in self.slots),
                                  *((s, num_reqs) for s in self.states)):
            dev[:used].copy_(host[:used], non_blocking=True)  # CpuGpuBuffer.copy_to_gpu(n)


class ListBlockManager:
    """nano-vllm's ``BlockManager`` for the pages of one request per group: ``deallocate`` lowers each
    page's reference count (last page first) and frees those at zero (off the used set, onto the free list)."""

    def __init__(self, num_blocks: int) -> None:
        self.ref_count = [0] * num_blocks
        self.free_ids: list[int] = []
        self.used_ids: set[int] = set()

    def allocate(self, seq: Seq, pages_per_group: Sequence[Sequence[int]]) -> None:
        """Untimed set-up: ``seq`` holds ``pages_per_group`` (taken off the free list)."""
        seq.block_tables = [list(p) for p in pages_per_group]
        for pages in pages_per_group:
            for page in pages:
                self.ref_count[page] = 1
                self.used_ids.add(page)
        self.free_ids.clear()

    def deallocate(self, seq: Seq) -> None:
        """The request finished: its pages lose a reference; unreferenced ones are free again."""
        for table in seq.block_tables:
            for page in reversed(table):
                self.ref_count[page] -= 1
                if self.ref_count[page] == 0:
                    self.used_ids.remove(page)
                    self.free_ids.append(page)
            table.clear()


class _V1Block:
    __slots__ = ("block_id", "is_null", "next_free", "prev_free", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id, self.ref_cnt, self.is_null = block_id, 0, block_id == 0
        self.prev_free: "_V1Block | None" = None
        self.next_free: "_V1Block | None" = None


class V1Finish:
    """vLLM V1's host work when a request finishes: ``KVCacheManager.free`` over its groups (the
    request's blocks popped from ``req_to_blocks``, ``ref_cnt`` lowered last block first, the freed
    blocks appended to the doubly linked free-block queue, ``num_cached_block`` dropped) and
    ``InputBatch.remove_request`` (its index and per-request sampling state dropped)."""

    _SAMPLING_SETS = ("greedy_reqs", "random_reqs", "top_p_reqs", "top_k_reqs", "min_p_reqs", "frequency_penalties_reqs",
                      "presence_penalties_reqs", "repetition_penalties_reqs", "has_allowed_token_ids", "spec_decode_reqs")

    def __init__(self, num_blocks: int, num_groups: int, max_num_reqs: int) -> None:
        self.blocks = [_V1Block(i) for i in range(num_blocks)]
        self.head, self.tail = _V1Block(-1), _V1Block(-1)
        self.head.next_free, self.tail.prev_free = self.tail, self.head
        self.num_free = 0
        self.req_to_blocks: list[dict[str, list[_V1Block]]] = [{} for _ in range(num_groups)]
        self.num_cached_block: list[dict[str, int]] = [{} for _ in range(num_groups)]
        self.req_id_to_index: dict[str, int] = {}
        self.req_ids: list[str | None] = [None] * max_num_reqs
        self.req_output_token_ids: list[list[int] | None] = [None] * max_num_reqs
        self.sampling = {name: set() for name in self._SAMPLING_SETS}
        self.generators: dict[int, object] = {}
        self.num_logprobs: dict[str, int] = {}
        self.removed: list[int] = []

    def allocate(self, req_id: str, row: int, pages_per_group: Sequence[Sequence[int]]) -> None:
        """Untimed set-up: ``req_id`` in batch row ``row`` holds ``pages_per_group`` (the queue emptied)."""
        self.head.next_free, self.tail.prev_free, self.num_free = self.tail, self.head, 0
        for g, pages in enumerate(pages_per_group):
            blocks = [self.blocks[p] for p in pages]
            for b in blocks:
                b.ref_cnt, b.prev_free, b.next_free = 1, None, None
            self.req_to_blocks[g][req_id] = blocks
            self.num_cached_block[g][req_id] = len(blocks)
        self.req_id_to_index[req_id] = row
        self.req_ids[row] = req_id
        self.req_output_token_ids[row] = []
        self.sampling["greedy_reqs"].add(req_id)
        self.removed.clear()

    def _append_n(self, blocks: list[_V1Block]) -> None:
        if not blocks:
            return
        last = self.tail.prev_free
        for b in blocks:
            b.prev_free = last
            last.next_free = b
            last = b
        last.next_free = self.tail
        self.tail.prev_free = last
        self.num_free += len(blocks)

    def finish(self, req_id: str) -> None:
        """``KVCacheManager.free(request)`` then ``InputBatch.remove_request(req_id)``."""
        for g, req_to_blocks in enumerate(self.req_to_blocks):
            blocks = list(reversed(req_to_blocks.pop(req_id, [])))
            for b in blocks:
                b.ref_cnt -= 1
            self._append_n([b for b in blocks if b.ref_cnt == 0 and not b.is_null])
            self.num_cached_block[g].pop(req_id, None)
        index = self.req_id_to_index.pop(req_id)
        self.req_ids[index] = None
        self.req_output_token_ids[index] = None
        for reqs in self.sampling.values():
            reqs.discard(req_id)
        self.generators.pop(index, None)
        self.num_logprobs.pop(req_id, None)
        self.removed.append(index)
