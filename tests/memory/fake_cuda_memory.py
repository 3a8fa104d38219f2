"""torch.cuda's memory counters and snapshot, faked on a CPU: what graphkv's capture-pool reader reads on a GPU."""

from __future__ import annotations

import torch

MIB = 1 << 20
POOL = (1, 7)  # what torch.cuda.graph_pool_handle() returns: a pair of ints


def segment(pool, total_size, blocks, *, allocated_size=True, stream=0):
    """One segment as torch.cuda.memory_snapshot() lists it (blocks: (size, state) pairs)."""
    out = {"device": 0, "address": 0x7F0000000000, "total_size": total_size, "stream": stream,
           "segment_type": "small" if total_size == 2 * MIB else "large", "segment_pool_id": pool,
           "is_expandable": False, "frames": [],
           "blocks": [{"address": 0, "size": size, "requested_size": size, "state": state, "frames": []}
                      for size, state in blocks]}
    if allocated_size:
        out["allocated_size"] = sum(size for size, state in blocks if state == "active_allocated")
        out["active_size"] = out["allocated_size"]
    return out


class FakeAllocator:
    """The caching allocator's counters (allocated, peak) and the snapshot's segments, with a call log."""

    def __init__(self, allocated_bytes=3 * MIB):
        self.allocated, self.peak, self.segments, self.calls = allocated_bytes, allocated_bytes, [], []
        self.num_graphs = 0

    def install(self, monkeypatch):
        """Route torch.cuda's synchronize, memory counters and memory_snapshot() here."""
        fakes = {"synchronize": lambda device=None: self.calls.append("synchronize"),
                 "memory_allocated": lambda device=None: self.allocated,
                 "max_memory_allocated": lambda device=None: self.peak,
                 "reset_peak_memory_stats": lambda device=None: self._reset(),
                 "memory_snapshot": lambda: self.calls.append("snapshot") or list(self.segments)}
        for name, fn in fakes.items():
            monkeypatch.setattr(torch.cuda, name, fn)
        return self

    def _reset(self):
        self.calls.append("reset")
        self.peak = self.allocated

    def allocate(self, nbytes):
        """A lazy allocation outside any graph pool (e.g. a cuBLAS workspace)."""
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def capture(self, *, workspace_bytes, kept_bytes, pool=POOL, new_segment=True):
        """A capture into ``pool``: a workspace used and freed, outputs kept in a new 2 MiB segment, or (not
        ``new_segment``) in the pool's last one, as a later key reusing the first key's freed workspace."""
        self.peak = max(self.peak, self.allocated + workspace_bytes + kept_bytes)
        self.allocated += kept_bytes
        self.num_graphs += 1
        if new_segment:
            self.segments.append(segment(pool, 2 * MIB, [(kept_bytes, "active_allocated"),
                                                         (2 * MIB - kept_bytes, "inactive")]))
            return
        last = self.segments[-1]
        last["allocated_size"] += kept_bytes
        last["active_size"] = last["allocated_size"]
        free = last["blocks"].pop()
        last["blocks"] += [{**free, "size": kept_bytes, "state": "active_allocated"},
                           {**free, "size": free["size"] - kept_bytes}]
