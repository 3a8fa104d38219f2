"""Read the memory of one CUDA-graph capture pool, and what each capture key adds to it.

Every key of a :class:`~graphkv.runtime.capture.CapturedForward` is captured into one private pool
(``torch.cuda.graph_pool_handle()``). The caching allocator lists that pool's segments in
``torch.cuda.memory_snapshot()``: each segment dict carries ``"segment_pool_id"`` (the handle),
``"total_size"`` (bytes reserved from the driver) and ``"allocated_size"`` (bytes of its blocks in
use), as ``torch._inductor.cudagraph_trees`` reads them. :func:`pool_usage` sums them for one pool
— a pure function of the snapshot, so a CPU test covers it with recorded segments.

Around each key's capture :class:`CapturePoolReader` reads (after a synchronize):

- **kept**: ``torch.cuda.memory_allocated`` after minus before — what the graph holds between
  replays. Graph outputs are weak views (:mod:`graphkv.runtime.capture.weak`), so their blocks go
  back to the pool for the next key and are not counted; what stays is what a capture keeps owned,
  e.g. the PIECEWISE staging arena that the first key's capture allocates outside the pool
  (:mod:`graphkv.runtime.capture.staging`);
- **peak**: ``torch.cuda.max_memory_allocated`` (reset just before the capture) minus the bytes
  allocated before it — the capture's high-water mark, so ``peak - kept`` is the workspace the
  forward used and freed, which later keys reuse from the same pool;
- **reserved**: the pool's segment bytes after minus before (2 MiB granules or more).

The driver's own memory for an instantiated graph is not in any allocator segment, so none of these
see it (NVML does). Only ``torch.cuda.memory_snapshot()`` without arguments, ``memory_allocated``,
``max_memory_allocated``, ``reset_peak_memory_stats`` and ``synchronize`` are called (torch 2.4+).
The live reader has run on an H200 for the demo (2026-11-25); the arithmetic is tested on a CPU.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import attrs

from graphkv.errors import MeasurementError, Problem

__all__ = ["CaptureMemory", "CapturePoolReader", "KeyMemory", "KeyStart", "PoolUsage", "pool_usage"]

_SNAPSHOT = "torch.cuda.memory_snapshot() segment"
_ALLOCATED_STATE = "active_allocated"  # a block's "state" while a tensor holds it


@attrs.frozen(kw_only=True)
class PoolUsage:
    """Bytes of one allocator pool: ``reserved_bytes`` in its segments, ``allocated_bytes`` in blocks in use."""

    reserved_bytes: int
    allocated_bytes: int


def pool_usage(segments: Iterable[Mapping[str, Any]], pool: Any) -> PoolUsage:
    """Sum the segments of ``pool`` (a ``torch.cuda.graph_pool_handle()``, a pair of ints) in
    ``segments`` (``torch.cuda.memory_snapshot()``'s list). Segments of other pools and of no pool
    (``segment_pool_id`` ``(0, 0)``, the default pools) are skipped. A segment without
    ``"allocated_size"`` counts its blocks whose state is ``"active_allocated"``. Pure; no torch.

    Raises :class:`MeasurementError` for a segment without ``"segment_pool_id"`` or ``"total_size"``
    (a snapshot format this reader does not know).

    >>> pool_usage([{"segment_pool_id": (1, 7), "total_size": 2097152, "allocated_size": 1024},
    ...             {"segment_pool_id": (0, 0), "total_size": 20971520, "allocated_size": 0}], (1, 7))
    PoolUsage(reserved_bytes=2097152, allocated_bytes=1024)
    """
    wanted = tuple(pool)
    reserved = allocated = 0
    for segment in segments:
        missing = [k for k in ("segment_pool_id", "total_size") if k not in segment]
        if missing:
            raise MeasurementError(Problem(field=_SNAPSHOT, value=sorted(segment), limit=f"has no {missing[0]!r}",
                                           fix="read the graph pool with torch >= 2.4 (its snapshot names each "
                                               "segment's pool and size)"))
        if tuple(segment["segment_pool_id"]) != wanted:
            continue
        reserved += int(segment["total_size"])
        if "allocated_size" in segment:
            allocated += int(segment["allocated_size"])
        else:
            allocated += sum(int(b["size"]) for b in segment.get("blocks", ()) if b.get("state") == _ALLOCATED_STATE)
    return PoolUsage(reserved_bytes=reserved, allocated_bytes=allocated)


@attrs.frozen(kw_only=True)
class KeyStart:
    """What :meth:`CapturePoolReader.start` read just before a key's capture."""

    allocated_bytes: int  # torch.cuda.memory_allocated (the peak counter was reset to it)
    pool: PoolUsage


@attrs.frozen(kw_only=True)
class KeyMemory:
    """One capture key's memory, read through its pool (see the module docstring)."""

    num_tokens: int
    uniform: bool
    peak_bytes: int  # the capture's high-water mark above what was allocated before it
    kept_bytes: int  # memory_allocated after the capture minus before (the pool's growth and what is held outside it)
    reserved_bytes: int  # the pool's segment bytes after the capture minus before
    pool_kept_bytes: int = 0  # the pool's allocated bytes after the capture minus before (kept inside the pool)

    @classmethod
    def between(cls, *, num_tokens: int, uniform: bool, start: KeyStart, after: PoolUsage, allocated_bytes: int,
                max_allocated_bytes: int) -> "KeyMemory":
        """A key's memory from the reads before (``start``) and after its capture: the pool ``after``,
        ``allocated_bytes`` (``torch.cuda.memory_allocated``) and ``max_allocated_bytes``
        (``torch.cuda.max_memory_allocated``, never below ``start.allocated_bytes``, where it was reset)."""
        return cls(num_tokens=num_tokens, uniform=uniform,
                   peak_bytes=max(max_allocated_bytes - start.allocated_bytes, 0),
                   kept_bytes=allocated_bytes - start.allocated_bytes,
                   reserved_bytes=after.reserved_bytes - start.pool.reserved_bytes,
                   pool_kept_bytes=after.allocated_bytes - start.pool.allocated_bytes)

    @property
    def workspace_bytes(self) -> int:
        """What the capture used and freed: ``peak - kept`` (at least 0)."""
        return max(self.peak_bytes - self.kept_bytes, 0)

    @property
    def outside_kept_bytes(self) -> int:
        """What the capture keeps outside its pool (e.g. the PIECEWISE staging arena): kept minus kept in the pool."""
        return max(self.kept_bytes - self.pool_kept_bytes, 0)

    @property
    def footprint_bytes(self) -> int:
        """What the capture took from the GPU: its peak, or the pool segments it opened plus what it keeps
        outside the pool where those are more (the caching allocator rounds a capture's blocks into 2 MiB and
        larger segments: on the H100, llama-3.1-8b's 8192-token key peaked at 977 MB at 2 layers, opened
        1,197 MB of segments and kept its 64 MiB staging arena outside them)."""
        return max(self.peak_bytes, self.reserved_bytes + self.outside_kept_bytes)

    def pool_bytes(self, *, first: bool) -> int:
        """What this key adds to the pool: its kept bytes; captured ``first``, its footprint (the
        workspace and segments later keys reuse), so the keys' sum is what the pool holds."""
        return max(self.footprint_bytes, self.kept_bytes) if first else self.kept_bytes


@attrs.frozen(kw_only=True)
class CaptureMemory:
    """Everything one capture of every key measured: each key (capture order, largest first), the lazy
    workspaces allocated before the first capture, the pool after the last, and this process's device
    memory growth over it all by the process meter (``None`` without one)."""

    keys: tuple[KeyMemory | None, ...]  # None: that key was not captured (``not_captured``)
    lazy_workspace_bytes: int  # torch.cuda.memory_allocated growth over the workspace warm-up and every key's warm-up
    pool: PoolUsage  # the capture pool after every key
    process_bytes: int | None = None  # e.g. NVML: the pool, lazy workspaces and the graphs' driver-side memory
    not_captured: str | None = None  # why the keys measured None were not captured (e.g. no piecewise runners)

    @property
    def pool_bytes(self) -> int:
        """What the captured keys add: the first captured key's footprint and every later one's kept bytes
        (the first in segments, the later ones in allocated bytes: about what the pool and the arena hold)."""
        captured = [k for k in self.keys if k is not None]
        return sum(k.pool_bytes(first=i == 0) for i, k in enumerate(captured))


class CapturePoolReader:
    """Reads one capture pool on a GPU (``pool``: the handle the keys are captured into), synchronising
    ``device`` before every read. Not capture-safe: call it between captures, never inside one."""

    def __init__(self, pool: Any, device: Any) -> None:
        self.pool = tuple(pool)
        self.device = device

    def allocated_bytes(self) -> int:
        """``torch.cuda.memory_allocated`` of the device now (every pool), after a synchronize."""
        import torch

        torch.cuda.synchronize(self.device)
        return int(torch.cuda.memory_allocated(self.device))

    def read(self) -> PoolUsage:
        """The pool's bytes now, after a synchronize."""
        import torch

        torch.cuda.synchronize(self.device)
        return pool_usage(torch.cuda.memory_snapshot(), self.pool)

    def start(self) -> KeyStart:
        """Read before a key's capture and reset the peak counter to what is allocated now."""
        import torch

        pool = self.read()
        allocated = self.allocated_bytes()
        torch.cuda.reset_peak_memory_stats(self.device)
        return KeyStart(allocated_bytes=allocated, pool=pool)

    def finish(self, start: KeyStart, *, num_tokens: int, uniform: bool) -> KeyMemory:
        """The key's :class:`KeyMemory`, read after its capture."""
        import torch

        after = self.read()
        return KeyMemory.between(num_tokens=num_tokens, uniform=uniform, start=start, after=after,
                                 allocated_bytes=self.allocated_bytes(),
                                 max_allocated_bytes=int(torch.cuda.max_memory_allocated(self.device)))
