"""A capture pool read from torch.cuda.memory_snapshot() segments, and each key's peak, kept and reserved bytes."""

from __future__ import annotations

import pytest
import torch

from graphkv.errors import MeasurementError
from graphkv.memory.graph_pool_reader import (CaptureMemory, CapturePoolReader, KeyMemory, KeyStart, PoolUsage,
                                              pool_usage)

from fake_cuda_memory import MIB, POOL, FakeAllocator, segment

SEGMENTS = [
    segment((0, 0), 20 * MIB, [(8 * MIB, "active_allocated"), (12 * MIB, "inactive")]),  # no pool: the default pools
    segment(POOL, 2 * MIB, [(1024, "active_allocated"), (512, "active_allocated"), (2 * MIB - 1536, "inactive")]),
    segment((1, 8), 2 * MIB, [(2 * MIB, "active_allocated")]),  # another graph pool
    segment([1, 7], 20 * MIB, [(4 * MIB, "active_allocated"), (16 * MIB, "inactive")], allocated_size=False,
             stream=94_000_000),  # the same pool, id as a list, no allocated_size: its blocks count
]


def test_pool_usage_sums_only_the_pools_own_segments():
    """Two segments of pool (1, 7): 22 MiB reserved, 1,536 B + 4 MiB allocated; the default and another pool skipped."""
    assert pool_usage(SEGMENTS, POOL) == PoolUsage(reserved_bytes=22 * MIB, allocated_bytes=1536 + 4 * MIB)
    assert pool_usage(SEGMENTS, [1, 8]) == PoolUsage(reserved_bytes=2 * MIB, allocated_bytes=2 * MIB)
    assert pool_usage(SEGMENTS, (9, 9)) == PoolUsage(reserved_bytes=0, allocated_bytes=0)
    assert pool_usage([], POOL) == PoolUsage(reserved_bytes=0, allocated_bytes=0)


def test_a_segment_without_its_pool_id_is_a_measurement_error():
    """A snapshot format without segment_pool_id: MeasurementError naming the missing key and the fix."""
    unknown = {k: v for k, v in SEGMENTS[1].items() if k != "segment_pool_id"}
    with pytest.raises(MeasurementError, match="has no 'segment_pool_id'; read the graph pool with torch >= 2.4"):
        pool_usage([unknown], POOL)


def test_key_memory_is_the_pools_growth_and_the_peak_above_what_was_allocated():
    """Before 5 MiB allocated (1 MiB in the pool, 2 MiB reserved), after 1.5 MiB kept of 4 MiB reserved, peak 9 MiB."""
    start = KeyStart(allocated_bytes=5 * MIB, pool=PoolUsage(reserved_bytes=2 * MIB, allocated_bytes=MIB))
    key = KeyMemory.between(num_tokens=8, uniform=True, start=start,
                            after=PoolUsage(reserved_bytes=4 * MIB, allocated_bytes=MIB + 1536 * 1024),
                            allocated_bytes=5 * MIB + 1536 * 1024, max_allocated_bytes=9 * MIB)
    assert key == KeyMemory(num_tokens=8, uniform=True, peak_bytes=4 * MIB, kept_bytes=1536 * 1024,
                            reserved_bytes=2 * MIB, pool_kept_bytes=1536 * 1024)
    assert key.workspace_bytes == 4 * MIB - 1536 * 1024
    assert key.pool_bytes(first=True) == 4 * MIB and key.pool_bytes(first=False) == 1536 * 1024


def test_a_peak_below_kept_is_no_workspace_and_the_capture_sums_first_footprint_and_later_kept():
    """A peak read below what the capture kept gives no workspace; the first key's footprint is its peak or the
    segments it opened, whichever is more; the pool's sum is the 2 MiB segment + 600 + 300 B."""
    low = KeyMemory(num_tokens=4, uniform=True, peak_bytes=100, kept_bytes=600, reserved_bytes=0)
    assert low.workspace_bytes == 0 and low.pool_bytes(first=True) == 600
    first = KeyMemory(num_tokens=8, uniform=True, peak_bytes=9000, kept_bytes=1200, reserved_bytes=2 * MIB,
                      pool_kept_bytes=1200)
    assert first.footprint_bytes == 2 * MIB and first.pool_bytes(first=True) == 2 * MIB
    in_open_segments = KeyMemory(num_tokens=8, uniform=True, peak_bytes=9000, kept_bytes=1200, reserved_bytes=0,
                                 pool_kept_bytes=1200)
    assert in_open_segments.footprint_bytes == 9000 and in_open_segments.pool_bytes(first=False) == 1200
    arena = KeyMemory(num_tokens=8, uniform=False, peak_bytes=9000, kept_bytes=5000, reserved_bytes=2 * MIB,
                      pool_kept_bytes=1000)  # 4000 B kept outside the pool (a staging arena)
    assert (arena.outside_kept_bytes, arena.footprint_bytes) == (4000, 2 * MIB + 4000)
    later = KeyMemory(num_tokens=2, uniform=True, peak_bytes=400, kept_bytes=300, reserved_bytes=0)
    captured = CaptureMemory(keys=(first, low, later), lazy_workspace_bytes=0,
                             pool=PoolUsage(reserved_bytes=2 * MIB, allocated_bytes=2100))
    assert captured.pool_bytes == 2 * MIB + 600 + 300 and captured.process_bytes is None


def test_the_live_reader_synchronises_resets_the_peak_and_reads_each_capture(monkeypatch):
    """start() reads the pool and resets the peak after a synchronize; finish() gives the key's peak, kept, reserved."""
    fake = FakeAllocator()
    fake.install(monkeypatch)
    reader = CapturePoolReader([1, 7], torch.device("cpu"))
    start = reader.start()
    assert start == KeyStart(allocated_bytes=3 * MIB, pool=PoolUsage(reserved_bytes=0, allocated_bytes=0))
    assert fake.calls == ["synchronize", "snapshot", "synchronize", "reset"]
    fake.capture(workspace_bytes=64 * 1024, kept_bytes=4096)
    assert reader.finish(start, num_tokens=8, uniform=True) == KeyMemory(
        num_tokens=8, uniform=True, peak_bytes=64 * 1024 + 4096, kept_bytes=4096, reserved_bytes=2 * MIB,
        pool_kept_bytes=4096)
    second = reader.start()
    fake.capture(workspace_bytes=0, kept_bytes=2048)
    assert reader.finish(second, num_tokens=4, uniform=True) == KeyMemory(
        num_tokens=4, uniform=True, peak_bytes=2048, kept_bytes=2048, reserved_bytes=2 * MIB, pool_kept_bytes=2048)
    assert reader.read() == PoolUsage(reserved_bytes=4 * MIB, allocated_bytes=6144)
    assert reader.allocated_bytes() == 3 * MIB + 6144


def test_kept_counts_what_a_piecewise_capture_holds_outside_the_pool():
    """A PIECEWISE capture whose piece runners hold 64 KiB of attention output from the default pool (static inputs)
    beside 16 KiB kept in the graph pool: the key keeps 80 KiB, not the pool's 16 KiB."""
    start = KeyStart(allocated_bytes=5 * MIB, pool=PoolUsage(reserved_bytes=2 * MIB, allocated_bytes=MIB))
    key = KeyMemory.between(num_tokens=64, uniform=False, start=start,
                            after=PoolUsage(reserved_bytes=2 * MIB, allocated_bytes=MIB + 16 * 1024),
                            allocated_bytes=5 * MIB + 80 * 1024, max_allocated_bytes=5 * MIB + 80 * 1024)
    assert (key.kept_bytes, key.peak_bytes, key.workspace_bytes, key.reserved_bytes) == (80 * 1024, 80 * 1024, 0, 0)
    assert (key.pool_kept_bytes, key.outside_kept_bytes, key.footprint_bytes) == (16 * 1024, 64 * 1024, 80 * 1024)
