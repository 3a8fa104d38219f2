"""PyTorch's CUDA caching allocator as the ledger models it: 512 B blocks, 2 MiB small segments, 20 MiB or
2 MiB-rounded large ones, split only when enough remains; one table checked against the model everywhere and
against the real allocator where there is a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from graphkv.plan.allocations.rounding import (MIB, AllocatorPool, charge_alone, charge_in_order, new_segment_bytes,
                                               rounded_bytes, splits)

S, L = AllocatorPool.SMALL, AllocatorPool.LARGE

# One allocation into an allocator with no cached free block:
# (bytes requested, memory_allocated grows by, memory_reserved grows by, pool, block split).
ALONE = [
    (1, 512, 2 * MIB, S, True),  # the smallest block, carved from a 2 MiB small segment
    (512, 512, 2 * MIB, S, True),
    (513, 1024, 2 * MIB, S, True),
    (1000, 1024, 2 * MIB, S, True),
    (MIB - 1, MIB, 2 * MIB, S, True),
    (MIB, MIB, 2 * MIB, S, True),  # the largest small block: half a small segment
    (MIB + 1, MIB + 512, 20 * MIB, L, True),  # large: a 20 MiB segment, split
    (10 * MIB - 513, 10 * MIB - 512, 20 * MIB, L, True),  # the largest block below kMinLargeAlloc
    (10 * MIB - 1, 10 * MIB, 10 * MIB, L, False),  # rounded to 10 MiB: a segment of exactly its size
    (10 * MIB, 10 * MIB, 10 * MIB, L, False),  # a segment of exactly its size
    (10 * MIB + 1, 10 * MIB + 512, 12 * MIB, L, True),  # 2 MiB - 512 B remain (> 1 MiB): split
    (11 * MIB, 12 * MIB, 12 * MIB, L, False),  # exactly 1 MiB would remain, not more: handed out whole
    (11 * MIB + 1, 12 * MIB, 12 * MIB, L, False),  # under 1 MiB would remain: the whole 12 MiB segment
    (659_881_984, 660_602_880, 660_602_880, L, False),  # a llama-3.1-8b pool slot (10069 pages): +704 KiB
]

# Allocations in order, nothing freed: each one's (memory_allocated, memory_reserved) growth.
SEQUENCES = {
    "small buffers share one 2 MiB segment": (
        [1, 1000, 4096, MIB - 512], [(512, 2 * MIB), (1024, 0), (4096, 0), (MIB - 512, 0)]),
    "a small buffer past the segment's remainder opens another": (
        [MIB, MIB - 512, 1024], [(MIB, 2 * MIB), (MIB - 512, 0), (1024, 2 * MIB)]),
    "the remainder fits exactly: no split, nothing left": (
        [MIB, MIB], [(MIB, 2 * MIB), (MIB, 0)]),
    "best fit takes the smaller remainder, keeping the larger one for a larger buffer": (
        [MIB, 960 * 1024, MIB, 64 * 1024, MIB], [(MIB, 2 * MIB), (960 * 1024, 0), (MIB, 2 * MIB), (64 * 1024, 0),
                                                 (MIB, 0)]),
    "large buffers below 10 MiB share a 20 MiB segment": (
        [2 * MIB, 3 * MIB, 4 * MIB], [(2 * MIB, 20 * MIB), (3 * MIB, 0), (4 * MIB, 0)]),
    "a large remainder of 1 MiB or less is handed out whole": (
        [4 * MIB, 15 * MIB + 512], [(4 * MIB, 20 * MIB), (16 * MIB, 0)]),
    "small and large pools do not share segments": (
        [1024, 2 * MIB, 2048], [(1024, 2 * MIB), (2 * MIB, 20 * MIB), (2048, 0)]),
    "zero bytes allocate nothing": (
        [0, 1, 0], [(0, 0), (512, 2 * MIB), (0, 0)]),
}


@pytest.mark.parametrize("nbytes, allocated, reserved, pool, split", ALONE, ids=[str(c[0]) for c in ALONE])
def test_one_allocation_is_charged_as_the_allocator_documents(nbytes, allocated, reserved, pool, split):
    """round_size to 512 B; a 2 MiB, 20 MiB or 2 MiB-rounded segment; split only when enough remains."""
    charge = charge_alone(nbytes)
    assert (charge.allocated_bytes, charge.reserved_bytes, charge.pool, charge.split) == (allocated, reserved, pool,
                                                                                          split)
    assert charge.block_bytes == rounded_bytes(nbytes) and charge.rounding_bytes == allocated - nbytes


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_allocations_in_order_fill_earlier_segments(name):
    """Later allocations take the smallest cached remainder that holds them before a new segment."""
    sizes, want = SEQUENCES[name]
    assert [(c.allocated_bytes, c.reserved_bytes) for c in charge_in_order(sizes)] == want


def test_the_rules_at_their_boundaries():
    """512 B blocks; segments 2 MiB up to 1 MiB blocks, 20 MiB below 10 MiB, 2 MiB multiples from 10 MiB; a
    small block splits from 512 B left, a large one only from more than 1 MiB left."""
    assert [rounded_bytes(n) for n in (0, 1, 511, 512, 513, 1024, 1025)] == [0, 512, 512, 512, 1024, 1024, 1536]
    assert [new_segment_bytes(b) for b in (512, MIB, MIB + 512, 10 * MIB - 512, 10 * MIB, 10 * MIB + 512, 12 * MIB)] \
        == [2 * MIB, 2 * MIB, 20 * MIB, 20 * MIB, 10 * MIB, 12 * MIB, 12 * MIB]
    assert splits(MIB + 512, MIB) and not splits(MIB, MIB)
    assert not splits(12 * MIB, 11 * MIB) and splits(12 * MIB, 11 * MIB - 512)


def test_small_requests_are_charged_their_rounded_size_in_any_order():
    """A small block is a multiple of 512 B, so what remains is 0 or splits: allocated == round512, any order."""
    sizes = [1, 700, 4096, 100_000, MIB, 3, MIB - 1, 65_536, 513] * 3
    for order in (sizes, sorted(sizes), sorted(sizes, reverse=True)):
        assert [c.allocated_bytes for c in charge_in_order(order)] == [rounded_bytes(n) for n in order]


def test_a_large_request_is_charged_at_most_1_mib_beyond_its_rounded_size():
    """Not split means at most 1 MiB remained: the bound the ledger states for large blocks."""
    sizes = [MIB + k * 333_333 for k in range(120)]
    for c in charge_in_order(sizes):
        assert rounded_bytes(c.nbytes) <= c.allocated_bytes <= rounded_bytes(c.nbytes) + MIB


def test_negative_bytes_are_refused():
    """A negative request is a programming error, named."""
    with pytest.raises(ValueError, match="nbytes=-1: must be >= 0"):
        rounded_bytes(-1)


# The real allocator: the same tables, measured in a fresh process with the default settings.
_MEASURE = """
import json, sys, torch
out = []
torch.empty(0, device="cuda")  # a CUDA context; 0 bytes allocate nothing
for sizes in json.loads(sys.argv[1]):
    torch.cuda.synchronize(); torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == 0 and torch.cuda.memory_allocated() == 0, "allocator not empty"
    kept, deltas = [], []
    for n in sizes:
        a, r = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        kept.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
        deltas.append([torch.cuda.memory_allocated() - a, torch.cuda.memory_reserved() - r])
    out.append(deltas)
    del kept
print(json.dumps(out))
"""


def _measure(sequences: list[list[int]]) -> list[list[tuple[int, int]]]:
    """(memory_allocated, memory_reserved) growth of each allocation, each sequence from an empty allocator."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}  # the default allocator
    proc = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(sequences)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [[tuple(d) for d in seq] for seq in json.loads(proc.stdout)]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU: the real caching allocator (the model is checked on a CPU "
                                        "by the tests above)")
def test_the_real_allocator_charges_what_the_model_says():
    """On a GPU, in a fresh process: every single allocation and every sequence above grows memory_allocated and
    memory_reserved by the model's numbers, to the byte."""
    sequences = [[c[0]] for c in ALONE] + [sizes for sizes, _ in SEQUENCES.values()]
    measured = _measure(sequences)
    want = [[(c[1], c[2])] for c in ALONE] + [w for _, w in SEQUENCES.values()]
    assert measured == want
