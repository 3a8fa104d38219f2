"""Flex-attention block masks built straight from gathered block tables, into persistent buffers.

One :class:`FlexMaskBuilder` per KV-cache group that uses the ``flex`` backend. It binds the
step's persistent inputs once (the group's gathered block table, ``query_start_loc``,
``seq_lens``) and, per step, rewrites its persistent buffers in place with vectorized torch ops
(every op writes into a preallocated tensor: no allocation, no host sync, no data-dependent
shape, no ``create_block_mask``), then wraps them in a ``BlockMask`` of views.

Semantics: query token ``i`` of batch row ``r`` at position ``p`` attends cache token ``j`` (in
kernel block ``b = j // kbs``; flex key ``b * kv_block_stride * kbs + j % kbs`` of the flat K/V
view, see :mod:`graphkv.runtime.flex.views`) iff ``b`` sits in row ``r``'s table at logical
index ``L``, the logical position ``x = L * kbs + j % kbs`` satisfies ``x <= p`` and, with a
window ``W``, ``x > p - W``. The null page (kernel blocks ``0 .. bpk-1``) is never attended.

Physical -> logical happens in exactly one place, the per-step inverse map
``kernel_block_logical[b]`` (:meth:`FlexMaskBuilder.build`, step 3), read by the mask_mod. A
kernel block listed at several logical indices of live rows maps to the highest one: it was
written last, so its contents belong there (a page reused inside one sequence after its first
use left the window). A block shared by several rows (prefix sharing) must sit at one logical
index in all of them. The mask_mod then checks ``table[r, L] == b``, so a query never reads
another row's blocks even when both rows share a query tile.

Each query tile lists its blocks in two lists (``BlockMask`` semantics, a block in at most one):
*full* blocks, seen whole by every query of the tile, which flex attends without evaluating the
mask_mod, and *partial* ones, on which it does (:mod:`graphkv.runtime.flex.full_blocks` says which
blocks are full). ``mark_full_blocks=False`` lists every block as partial (for comparisons).

Example (one step)::

    builder = FlexMaskBuilder.from_plan(plan, 0, block_table=tables[0], query_start_loc=qsl,
                                        seq_lens=seq_lens)          # once
    ...fill tables[0], qsl, seq_lens (and the 0-d num_reqs tensor) in place for the step...
    mask = builder.build(num_reqs, num_tokens_padded=q.shape[0])  # per step
    out = paged_flex_attention(q, kv_cache, mask, scale=head_size ** -0.5)  # per layer

The build is capture-safe and compiles on its own; the attention call compiles with the mask as
an input (one graph per padded size, no recompilation when the batch changes). On CPU, torch
2.13 cannot compile the build and flex attention into *one* graph (the CPU flex template rejects
mask buffers computed in the same graph), so build outside the compiled model, as vLLM does.
"""

from __future__ import annotations

from typing import Callable

import attrs
import torch
from torch.nn.attention.flex_attention import BlockMask

from graphkv.errors import PlanError, Problem, SpecError
from graphkv.plan.allocations.flex import FlexSizes, flex_allocations
from graphkv.plan.plan import Plan
from graphkv.runtime.buffers import LedgerBuffers
from graphkv.runtime.flex.full_blocks import FullBlockMarker
from graphkv.runtime.flex.geometry import FlexMaskGeometry

__all__ = ["FlexMaskBuilder", "paged_mask_mod"]

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_INT32_MAX = 2**31 - 1


def paged_mask_mod(*, token_row: torch.Tensor, token_pos: torch.Tensor, kernel_block_logical: torch.Tensor,
                   block_table: torch.Tensor, kernel_block_size: int, window: int | None,
                   kv_block_stride: int = 1) -> MaskMod:
    """The paged causal (optionally sliding-window) mask over the flat physical K/V view.

    ``token_row`` / ``token_pos``: ``[max_padded_tokens] int32`` batch row and position of each
    packed query token (position -1 for padding); ``kernel_block_logical``: ``[num_kernel_blocks]
    int32`` logical index of each kernel block (-1: not live); ``block_table``: ``[max_num_seqs,
    width] int32``. Key ``kv_idx`` is token ``kv_idx % kbs`` of kernel block ``kv_idx // (kbs *
    kv_block_stride)``; keys between kernel blocks (``kv_idx % (kbs * kv_block_stride) >= kbs``:
    V or other layers' bytes of a page-local cache) are always masked. The tensors are read when
    the mask is evaluated, so in-place updates apply.
    """
    kbs, span = kernel_block_size, kernel_block_size * kv_block_stride

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        row = token_row[q_idx]
        pos = token_pos[q_idx]
        kernel_block = kv_idx // span
        logical = kernel_block_logical[kernel_block]
        x = logical * kbs + kv_idx % kbs
        owned = block_table[row, logical.clamp(min=0)] == kernel_block
        keep = (logical >= 0) & owned & (x <= pos)
        if span != kbs:
            keep = keep & (kv_idx % span < kbs)
        if window is not None:
            keep = keep & (pos - x < window)
        return keep

    return mask_mod


@attrs.define(kw_only=True, eq=False)
class _Workspace:
    """Scratch tensors the build overwrites every step (named after what they hold last).

    Sizes: ``S = max_num_seqs``, ``T = max_padded_tokens``, ``W`` = block table width, ``Q =
    num_q_tiles``, ``N = num_kernel_blocks``. Dtypes are chosen so that no op converts (a
    conversion would allocate, on a CPU a whole temporary); scatter indices are int64, the dtype
    torch's scatter ops take (``index_reduce_`` takes int32 but is ~3x slower on a CPU and
    allocates). Bytes: ``18 * S * W + 4 * (Q + 2) * N`` plus per-row and per-token scratch (the
    plan's ``flex.{g}.*`` ledger entries list each)."""

    num_reqs: torch.Tensor  # [] int32
    row_valid: torch.Tensor  # [S] bool
    row_ctx: torch.Tensor  # [S] int32: position of the row's first query token
    row_ends: torch.Tensor  # [S] int32: query end, INT32_MAX past num_reqs
    row_last: torch.Tensor  # [S] int32: query end - 1
    token_tmp: torch.Tensor  # [T] int32
    token_pad: torch.Tensor  # [T] bool
    entry_live: torch.Tensor  # [S, W] bool
    entry_tmp: torch.Tensor  # [S, W] bool
    entry_lo: torch.Tensor  # [S, W] int32
    entry_hi: torch.Tensor  # [S, W] int32
    entry_index: torch.Tensor  # [S, W] int64
    tile_counts: torch.Tensor  # [Q + 2, N] int32: difference array, then ranks; a step over t tiles uses rows
    #                             0 .. t + 1, row t + 1 being its dump row


class FlexMaskBuilder:
    """Persistent flex-attention buffers of one KV-cache group and the per-step mask build.

    Persistent buffers (allocated once, see :meth:`named_buffers`): ``kv_num_blocks
    [num_q_tiles] int32``, ``kv_indices [num_q_tiles, kv_indices_width] int32`` (the plan's
    ``flex.{g}.*``: the partial blocks of each query tile), ``full_kv_num_blocks [num_q_tiles]`` /
    ``full_kv_indices [num_q_tiles, kv_indices_width] int32`` (its full blocks), ``token_row`` /
    ``token_pos [max_padded_tokens] int32``, ``kernel_block_logical [num_kernel_blocks] int32``
    and scratch (``_Workspace``). ``kv_indices`` holds flex kv blocks of the flat K/V view (kernel
    block ``b`` times :attr:`kv_block_stride`); on CPU it has ``num_kv_blocks`` columns
    (:meth:`FlexMaskGeometry.for_device`). Bound inputs, read at every build: ``block_table
    [max_num_seqs, width] int32`` in kernel blocks, ``query_start_loc [max_num_seqs + 1] int32``,
    ``seq_lens [max_num_seqs] int32``. ``mark_full_blocks=False``: every block is listed as partial
    (the full lists stay empty), e.g. to compare outputs with and without full blocks.
    """

    def __init__(self, geometry: FlexMaskGeometry, *, block_table: torch.Tensor, query_start_loc: torch.Tensor,
                 seq_lens: torch.Tensor, kv_num_blocks: torch.Tensor | None = None,
                 kv_indices: torch.Tensor | None = None, mark_full_blocks: bool = True) -> None:
        g = geometry.for_device(block_table.device)
        g.check_inputs(block_table=block_table, query_start_loc=query_start_loc, seq_lens=seq_lens,
                       kv_num_blocks=kv_num_blocks, kv_indices=kv_indices)
        self.geometry = g
        self.mark_full_blocks = mark_full_blocks
        self.block_table, self.query_start_loc, self.seq_lens = block_table, query_start_loc, seq_lens
        device = block_table.device
        seqs, width, tiles, nkb = g.max_num_seqs, block_table.shape[1], g.num_q_tiles, g.num_kernel_blocks
        tokens = g.max_padded_tokens
        if (tiles + 2) * nkb >= _INT32_MAX:  # step 5 indexes (tile, kernel block) pairs in int32
            raise PlanError(Problem(field="num_kernel_blocks", value=nkb,
                                    limit=f"(num_q_tiles {tiles} + 2) x num_kernel_blocks must stay below 2**31",
                                    fix="lower max_num_batched_tokens or the pool size"))

        # Every tensor is one of flex_allocations' entries — the same list the plan's ledger holds as
        # flex.{g}.* — so what the builder allocates is what the plan says.
        sizes = FlexSizes(max_num_seqs=seqs, max_padded_tokens=tokens, block_table_width=width, num_q_tiles=tiles,
                          num_kernel_blocks=nkb, kv_indices_width=g.kv_indices_width, searched_width=g.searched_width)
        given = {"kv_num_blocks": kv_num_blocks, "kv_indices": kv_indices}
        prefix = f"flex.{g.group_index}"
        b = LedgerBuffers((a for a in flex_allocations(prefix, sizes) if given.get(a.name.rsplit(".", 1)[1]) is None),
                          device)

        def new(name: str) -> torch.Tensor:
            return b.tensor(f"{prefix}.{name}")

        def part(name: str, view: str) -> torch.Tensor:
            return b.part(f"{prefix}.{name}", view)

        self.kv_num_blocks = new("kv_num_blocks") if kv_num_blocks is None else kv_num_blocks
        self.kv_indices = new("kv_indices") if kv_indices is None else kv_indices
        self.full_kv_num_blocks = new("full_kv_num_blocks")
        self.full_kv_indices = new("full_kv_indices")
        self.token_row = new("token_row")
        self.token_pos = new("token_pos")
        self.kernel_block_logical = new("kernel_block_logical")
        row_valid, token_tmp, token_pad = new("row_valid"), new("token_tmp"), new("token_pad")
        new("row_ints")
        new("scalars")
        self._ws = _Workspace(
            num_reqs=part("scalars", "num_reqs"), row_valid=row_valid, row_ctx=part("row_ints", "row_ctx"),
            row_ends=part("row_ints", "row_ends"), row_last=part("row_ints", "row_last"), token_tmp=token_tmp,
            token_pad=token_pad, entry_live=new("entry_live"), entry_tmp=new("entry_tmp"), entry_lo=new("entry_lo"),
            entry_hi=new("entry_hi"), entry_index=new("entry_index"), tile_counts=new("tile_counts"))
        # Constants, so that no op needs a scalar of another dtype.
        self._row_ids = new("row_ids")
        self._row_ids.copy_(torch.arange(seqs, dtype=torch.int32))
        self._token_ids = new("token_ids")
        self._token_ids.copy_(torch.arange(tokens, dtype=torch.int32))
        new("logical_ids")
        self._logical_ids, self._logical_start = part("logical_ids", "logical_ids"), part("logical_ids", "logical_start")
        self._logical_ids.copy_(torch.arange(width, dtype=torch.int32))
        self._logical_start.copy_(torch.arange(width, dtype=torch.int32) * g.kernel_block_size)
        self._ranks = new("ranks")
        searched = g.kv_indices_width if g.searched_width is None else g.searched_width
        self._ranks.copy_(torch.arange(1, searched + 1, dtype=torch.int32).expand(tiles, -1))
        # Where the search writes: kv_indices itself, or (a CPU's wider kv_indices) a scratch copied into
        # its first columns.
        self._searched = new("kv_indices_searched") if g.searched_width is not None else self.kv_indices
        # The dump row of a step over t tiles is row t + 1: its first (tile, kernel block) index, per t.
        self._dump_index = new("dump_index")
        self._dump_index.copy_(torch.arange(tiles + 2, dtype=torch.int32) * nkb)
        self._plus_one, self._minus_one, self._int32_max = (part("scalars", n) for n in ("plus_one", "minus_one",
                                                                                         "int32_max"))
        self._plus_one.fill_(1)
        self._minus_one.fill_(-1)
        self._int32_max.fill_(_INT32_MAX)
        self._full = FullBlockMarker(
            take=new, part=part, kernel_block_size=g.kernel_block_size, q_tile_tokens=g.q_tile_tokens,
            window=g.window, kv_block_stride=g.kv_block_stride, full_kv_num_blocks=self.full_kv_num_blocks,
            full_kv_indices=self.full_kv_indices, token_row=self.token_row, token_pos=self.token_pos,
            row_last=self._ws.row_last, kernel_block_logical=self.kernel_block_logical, block_table=block_table,
            ranks=self._ranks, tile_offsets=self._dump_index, tile_counts=self._ws.tile_counts)
        # No block is whole to a query whose window is narrower than a kernel block: nothing to mark.
        self._full_possible = g.window is None or g.window >= g.kernel_block_size
        assert not b.untaken(), b.untaken()
        self.allocations = b.taken()  # what this builder allocated: flex.{g}.* entries, as in the plan's ledger
        self.mask_mod = paged_mask_mod(token_row=self.token_row, token_pos=self.token_pos,
                                       kernel_block_logical=self.kernel_block_logical, block_table=block_table,
                                       kernel_block_size=g.kernel_block_size, window=g.window,
                                       kv_block_stride=g.kv_block_stride)

    @property
    def kv_block_stride(self) -> int:
        """Flex kv blocks per kernel block of the cache view this builder's masks are for (``r``:
        1 for a split kv-first cache, 2 for a page-local one)."""
        return self.geometry.kv_block_stride

    @classmethod
    def from_plan(cls, plan: Plan, group_index: int, *, block_table: torch.Tensor, query_start_loc: torch.Tensor,
                  seq_lens: torch.Tensor, kv_num_blocks: torch.Tensor | None = None,
                  kv_indices: torch.Tensor | None = None, mark_full_blocks: bool = True) -> "FlexMaskBuilder":
        """A builder for ``plan.groups[group_index]`` (a ``flex`` group) whose masks fit the group's
        caches in ``allocate(plan)`` (split or page-local); buffers default to new ones shaped as
        the plan's ``flex.{g}.kv_num_blocks`` / ``flex.{g}.kv_indices``."""
        builder = cls(FlexMaskGeometry.from_plan(plan, group_index), block_table=block_table,
                      query_start_loc=query_start_loc, seq_lens=seq_lens, kv_num_blocks=kv_num_blocks,
                      kv_indices=kv_indices, mark_full_blocks=mark_full_blocks)
        if kv_num_blocks is None and kv_indices is None:  # all its own: exactly the plan's flex.{g}.* entries
            assert builder.allocations == tuple(a for a in plan.ledger.allocations(block_table.device.type)
                                                if a.name.startswith(f"flex.{group_index}.")), "flex ledger drift"
        return builder

    def named_buffers(self) -> dict[str, torch.Tensor]:
        """Every persistent tensor the build writes or the mask reads (for ``data_ptr`` checks)."""
        out = {name: getattr(self, name) for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                                      "full_kv_indices", "token_row", "token_pos",
                                                      "kernel_block_logical")}
        out.update({f"workspace.{f.name}": getattr(self._ws, f.name) for f in attrs.fields(_Workspace)})
        out.update({f"full.{name}": t for name, t in self._full.named_buffers().items()})
        return out

    def build(self, num_reqs: int | torch.Tensor, *, num_tokens_padded: int) -> BlockMask:
        """Rewrite the persistent buffers for this step and return a ``BlockMask`` of views.

        ``num_reqs``: live batch rows, a Python int or a 0-d integer tensor (under
        ``torch.compile`` or CUDA-graph capture pass a persistent 0-d tensor: an int is baked into
        the graph). ``num_tokens_padded``: the query length the attention call will use (``<=
        max_padded_tokens``); only the ``cdiv(num_tokens_padded, q_tile)`` query tiles covering it
        are rebuilt (the rest of the buffers keep what they held, and the mask never reads them), so
        the work follows the step, not ``max_num_batched_tokens``. Capture-safe: in-place ops only,
        no host sync, shapes fixed by ``num_tokens_padded``. Rows ``>= num_reqs`` and tokens past
        ``query_start_loc[num_reqs]`` are ignored whatever they hold. Live rows must be consistent
        (``query_start_loc`` non-decreasing, ``seq_lens[r] >= query length <= max_model_len``, table
        entries below the pool size); that is not checked on the hot path.
        """
        g, ws = self.geometry, self._ws
        if not 0 < num_tokens_padded <= g.max_padded_tokens:
            raise SpecError(Problem(field="num_tokens_padded", value=num_tokens_padded,
                                    limit=f"must be in 1..{g.max_padded_tokens} (cdiv(max_num_batched_tokens="
                                          f"{g.max_num_batched_tokens}, q_tile={g.q_tile_tokens}) whole tiles)",
                                    fix="pad the step to at most max_num_batched_tokens rounded up to a tile"))
        kbs, tile, nkb = g.kernel_block_size, g.q_tile_tokens, g.num_kernel_blocks
        # Only the query tiles that cover this step's (padded) tokens are rebuilt: a decode step under a
        # large token budget costs what it costs under a small one. The sizes are Python ints fixed by
        # the padded size, so a graph captured for that size replays the same ops.
        tiles = -(-num_tokens_padded // tile)
        tokens = tiles * tile
        q_start, q_end = self.query_start_loc[:-1], self.query_start_loc[1:]
        table, seq_lens = self.block_table, self.seq_lens
        if isinstance(num_reqs, torch.Tensor):
            ws.num_reqs.copy_(num_reqs)
        else:
            ws.num_reqs.fill_(num_reqs)

        # 1. Per batch row: validity, position of the first query token, masked query ends.
        torch.lt(self._row_ids, ws.num_reqs, out=ws.row_valid)
        torch.sub(seq_lens, q_end, out=ws.row_ctx).add_(q_start)
        torch.where(ws.row_valid, q_end, self._int32_max, out=ws.row_ends)
        torch.sub(q_end, 1, out=ws.row_last)

        # 2. Per packed query token of the step's tiles: its batch row and position (-1 for padding).
        token_ids, token_row, token_pos = self._token_ids[:tokens], self.token_row[:tokens], self.token_pos[:tokens]
        token_pad, token_tmp = ws.token_pad[:tokens], ws.token_tmp[:tokens]
        torch.searchsorted(ws.row_ends, token_ids, right=True, out_int32=True, out=token_row)
        torch.ge(token_row, ws.num_reqs, out=token_pad)
        token_row.clamp_(max=g.max_num_seqs - 1)
        torch.index_select(ws.row_ctx, 0, token_row, out=token_pos)
        torch.index_select(q_start, 0, token_row, out=token_tmp)
        token_pos.sub_(token_tmp).add_(token_ids).masked_fill_(token_pad, -1)

        # 3. Per table entry (row r, logical L -> kernel block b): live entries hold tokens
        # [L*kbs, ...) below seq_lens[r]. The inverse map keeps the highest live L per block:
        # the only physical -> logical mapping of the backend.
        live, tmp, lo, hi, index = ws.entry_live, ws.entry_tmp, ws.entry_lo, ws.entry_hi, ws.entry_index
        torch.lt(self._logical_start, seq_lens[:, None], out=live)
        live.logical_and_(ws.row_valid[:, None])
        live.logical_and_(torch.ge(table, g.bpk, out=tmp)).logical_and_(torch.lt(table, nkb, out=tmp))
        index.copy_(table).clamp_(0, nkb - 1)
        torch.where(live, self._logical_ids, self._minus_one, out=hi)
        self.kernel_block_logical.fill_(-1).scatter_reduce_(0, index.view(-1), hi.view(-1), "amax")

        # 4. Packed query tokens [lo, hi] that need entry (r, L): from the first whose position
        # reaches L*kbs to the last whose window still touches the kernel block.
        torch.sub(self._logical_start, ws.row_ctx[:, None], out=lo).clamp_(min=0).add_(q_start[:, None])
        if g.window is None:
            hi.copy_(ws.row_last[:, None].expand_as(hi))
        else:
            torch.sub(self._logical_start, ws.row_ctx[:, None], out=hi).add_(q_start[:, None])
            torch.minimum(hi.add_(kbs + g.window - 2), ws.row_last[:, None], out=hi)
        live.logical_and_(torch.le(lo, hi, out=tmp))

        # 5. Difference array over the step's query tiles: +1 at the first tile needing (r, L), -1 after
        # the last; dead entries go to the dump row (row tiles + 1). A prefix sum over tiles counts, per
        # (tile, kernel block), the entries that need it (prefix sharing just counts twice).
        counts = ws.tile_counts[:tiles + 2]
        counts.zero_()
        for bound, step in ((lo, self._plus_one), (hi, self._minus_one)):
            bound.div_(tile, rounding_mode="floor")
            if step is self._minus_one:
                bound.add_(1)
            bound.clamp_(0, tiles).mul_(nkb).add_(table)
            index.copy_(torch.where(live, bound, self._dump_index[tiles + 1], out=bound))
            counts.view(-1).scatter_add_(0, index.view(-1), step.expand(index.numel()))
        ranks = counts[:tiles]
        ranks.cumsum_(0)
        if self.mark_full_blocks and self._full_possible:  # full blocks go to the full lists; their counts are cleared
            self._full.mark(tiles=tiles, num_tokens_padded=num_tokens_padded)
        else:
            self.full_kv_num_blocks[:tiles].zero_()
        ranks.clamp_(0, 1).cumsum_(1)

        # 6. ranks[t, b] now counts the partial kernel blocks <= b of tile t, so the k-th one
        # (ascending ids) is the first b whose rank reaches k + 1: one batched binary search
        # writes kv_indices; columns past kv_num_blocks are clamped into range and never read.
        # Kernel block b is flex kv block b * r of the flat K/V view.
        kv_num_blocks, kv_indices = self.kv_num_blocks[:tiles], self._searched[:tiles]
        kv_num_blocks.copy_(ranks[:, -1])
        torch.searchsorted(ranks, self._ranks[:tiles], out_int32=True, out=kv_indices).clamp_(max=nkb - 1)
        if g.kv_block_stride != 1:
            kv_indices.mul_(g.kv_block_stride)
        if self._searched is not self.kv_indices:
            self.kv_indices[:tiles, :kv_indices.shape[1]].copy_(kv_indices)

        return BlockMask.from_kv_blocks(
            self.kv_num_blocks[None, None, :tiles], self.kv_indices[None, None, :tiles],
            self.full_kv_num_blocks[None, None, :tiles], self.full_kv_indices[None, None, :tiles],
            BLOCK_SIZE=(tile, kbs), mask_mod=self.mask_mod,
            seq_lengths=(num_tokens_padded, g.kv_tokens), compute_q_blocks=False)
