"""PyTorch's CUDA caching allocator as arithmetic: what ``torch.cuda.memory_allocated`` and
``torch.cuda.memory_reserved`` grow by when the runtime allocates its tensors (pure, no torch).

A model of the native allocator of ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``)
in its default configuration, ``PYTORCH_CUDA_ALLOC_CONF`` unset: backend ``native`` (not
``cudaMallocAsync``), ``expandable_segments:False``, no ``max_split_size_mb`` (every block may be
split), no ``roundup_power2_divisions`` (plain 512 B rounding), no garbage-collection threshold and
no per-process memory fraction. The rules, each from the function named:

1. ``round_size``: a request of ``n > 0`` bytes becomes a block of ``n`` rounded up to a multiple of
   512 B (``kMinBlockSize``). A 0-byte request allocates nothing (``NativeCachingAllocator::allocate``
   skips ``malloc`` for size 0).
2. ``get_pool``: a block of at most 1 MiB (``kSmallSize``) comes from the small pool, a larger one
   from the large pool.
3. ``get_free_block``: the smallest cached free block of that pool (and stream) that holds the block
   (best fit; ``BlockComparatorSize`` orders by size, then address).
4. ``get_allocation_size`` (via ``alloc_block``): when none does, a new segment is ``cudaMalloc``-ed —
   2 MiB (``kSmallBuffer``) for a small block, 20 MiB (``kLargeBuffer``) for a large block under 10 MiB
   (``kMinLargeAlloc``), else the block rounded up to a multiple of 2 MiB (``kRoundLarge``);
   ``memory_reserved`` grows by the segment.
5. ``should_split`` (applied in ``malloc``, carried out by ``alloc_found_block``): the block found is
   split when what remains is at least 512 B (small pool) or more than 1 MiB (large pool); the
   remainder goes back to the pool as a free block. Otherwise the whole block is handed out, and
   ``memory_allocated`` grows by all of it (``alloc_found_block`` counts ``block->size``).

Consequences: a small request is charged exactly its 512-rounded size (small blocks are multiples of
512 B, so a remainder is 0 or at least 512 B); a large one its 512-rounded size, or up to 1 MiB more
when the block it lands in is not split (``10 MiB + 1 B`` is a 10 MiB + 512 B block in a 12 MiB
segment whose 2 MiB - 512 B remainder splits off, charged 10 MiB + 512 B; ``11 MiB + 1 B`` is an
11 MiB + 512 B block in a 12 MiB segment whose remainder is under 1 MiB, charged 12 MiB).

:func:`charge_in_order` replays a sequence of allocations, so later small ones fill the remainders of
earlier segments. It is exact for allocations on one stream, with nothing freed in between, starting
from an allocator that caches no free block (a fresh process, or after ``torch.cuda.empty_cache()``
with no live tensor in a split segment); the address tie-break of rule 3 cannot change a byte count
when nothing is freed. Other configurations (``expandable_segments:True`` maps 2 MiB / 20 MiB pages,
``max_split_size_mb`` keeps large blocks whole, ``roundup_power2_divisions`` rounds to power-of-two
divisions) are not modelled.
"""

from __future__ import annotations

import bisect
import enum
from typing import Iterable

import attrs

__all__ = ["AllocatorCharge", "AllocatorPool", "KIB", "LARGE_BUFFER_BYTES", "MIB", "MIN_BLOCK_BYTES",
           "MIN_LARGE_ALLOC_BYTES", "ROUND_LARGE_BYTES", "SMALL_BUFFER_BYTES", "SMALL_SIZE_BYTES", "charge_alone",
           "charge_in_order", "new_segment_bytes", "pool_for", "rounded_bytes", "splits"]

KIB, MIB = 1 << 10, 1 << 20
MIN_BLOCK_BYTES = 512  # kMinBlockSize: every block is a multiple of it
SMALL_SIZE_BYTES = 1 * MIB  # kSmallSize: the largest block of the small pool
SMALL_BUFFER_BYTES = 2 * MIB  # kSmallBuffer: a small-pool segment
MIN_LARGE_ALLOC_BYTES = 10 * MIB  # kMinLargeAlloc: large blocks below it share a 20 MiB segment
LARGE_BUFFER_BYTES = 20 * MIB  # kLargeBuffer: that shared segment
ROUND_LARGE_BYTES = 2 * MIB  # kRoundLarge: larger blocks get a segment rounded up to it


class AllocatorPool(enum.Enum):
    """The caching allocator's two block pools (``get_pool``)."""

    SMALL = "small"  # blocks of at most 1 MiB, carved from 2 MiB segments
    LARGE = "large"  # larger blocks


def rounded_bytes(nbytes: int) -> int:
    """The block a request of ``nbytes`` occupies (``round_size``): a multiple of 512 B, at least 512 B;
    0 for 0 bytes (no allocation).

    >>> [rounded_bytes(n) for n in (0, 1, 512, 513, 1 << 20)]
    [0, 512, 512, 1024, 1048576]
    """
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes}: must be >= 0")
    return -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def pool_for(block_bytes: int) -> AllocatorPool:
    """The pool a block of ``block_bytes`` (already rounded) comes from (``get_pool``)."""
    return AllocatorPool.SMALL if block_bytes <= SMALL_SIZE_BYTES else AllocatorPool.LARGE


def new_segment_bytes(block_bytes: int) -> int:
    """The segment ``cudaMalloc``-ed for a block of ``block_bytes`` when no cached block holds it
    (``get_allocation_size``).

    >>> [new_segment_bytes(b) // MIB for b in (512, 1 * MIB, 1 * MIB + 512, 10 * MIB - 512, 10 * MIB, 10 * MIB + 512)]
    [2, 2, 20, 20, 10, 12]
    """
    if block_bytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if block_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-block_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def splits(found_bytes: int, block_bytes: int) -> bool:
    """Whether a free block of ``found_bytes`` handed out for a block of ``block_bytes`` is split, its
    remainder going back to the pool (``should_split``: at least 512 B left in the small pool, more than
    1 MiB in the large pool); when not, the whole ``found_bytes`` count as allocated."""
    remaining = found_bytes - block_bytes
    assert remaining >= 0, (found_bytes, block_bytes)
    if pool_for(block_bytes) is AllocatorPool.SMALL:
        return remaining >= MIN_BLOCK_BYTES
    return remaining > SMALL_SIZE_BYTES


@attrs.frozen(kw_only=True)
class AllocatorCharge:
    """What one allocation of ``nbytes`` costs in the caching allocator: ``block_bytes`` (rounded),
    ``allocated_bytes`` (what ``memory_allocated`` grows by: the block, or the whole free block it took
    when that was not split), ``reserved_bytes`` (what ``memory_reserved`` grows by: the new segment, 0
    when a cached block held it), its ``pool`` (``None`` for 0 bytes) and whether the block it took was
    ``split``."""

    nbytes: int
    block_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    pool: AllocatorPool | None
    split: bool

    @property
    def rounding_bytes(self) -> int:
        """``allocated_bytes - nbytes``: what the allocator counts beyond the tensor."""
        return self.allocated_bytes - self.nbytes


def charge_alone(nbytes: int) -> AllocatorCharge:
    """One allocation of ``nbytes`` into an allocator that caches no free block.

    >>> c = charge_alone(1)  # a 512 B block carved from a new 2 MiB small segment
    >>> (c.block_bytes, c.allocated_bytes, c.reserved_bytes, c.pool, c.split)
    (512, 512, 2097152, <AllocatorPool.SMALL: 'small'>, True)
    >>> c = charge_alone(11 * MIB + 1)  # a 12 MiB segment; under 1 MiB would remain: handed out whole
    >>> (c.allocated_bytes // MIB, c.reserved_bytes // MIB, c.split)
    (12, 12, False)
    """
    return charge_in_order([nbytes])[0]


def charge_in_order(sizes: Iterable[int]) -> tuple[AllocatorCharge, ...]:
    """The charge of each allocation of ``sizes`` (bytes), made in that order into an allocator that
    caches no free block, nothing freed in between (see the module docstring for when this is exact).

    >>> [(c.allocated_bytes, c.reserved_bytes) for c in charge_in_order([1, 1000, 1 << 20])]
    [(512, 2097152), (1024, 0), (1048576, 0)]
    """
    free: dict[AllocatorPool, list[int]] = {AllocatorPool.SMALL: [], AllocatorPool.LARGE: []}  # sorted sizes
    out = []
    for nbytes in sizes:
        block = rounded_bytes(nbytes)
        if block == 0:
            out.append(AllocatorCharge(nbytes=nbytes, block_bytes=0, allocated_bytes=0, reserved_bytes=0, pool=None,
                                       split=False))
            continue
        pool = pool_for(block)
        cached = free[pool]
        i = bisect.bisect_left(cached, block)  # best fit; equal sizes differ only in address
        if i < len(cached):
            found, reserved = cached.pop(i), 0
        else:
            found = reserved = new_segment_bytes(block)
        split = splits(found, block)
        if split:
            bisect.insort(cached, found - block)
        out.append(AllocatorCharge(nbytes=nbytes, block_bytes=block, allocated_bytes=block if split else found,
                                   reserved_bytes=reserved, pool=pool, split=split))
    return tuple(out)
