"""The runtime: allocate a Plan once, fill persistent buffers per step.

One folder per idea:

- :mod:`~graphkv.runtime.pool` — ``allocate(plan, device)`` -> :class:`KVPool` (raw slots, per-layer views);
- :mod:`~graphkv.runtime.tables` — :class:`BlockTables`: the host mirror of every request's pages (the
  single source of truth) and its device copies, written only where they changed;
- :mod:`~graphkv.runtime.step` — :class:`Step` / :class:`Batch`: a serving loop's step, with page
  ownership enforced and every failure undone;
- :mod:`~graphkv.runtime.flex` — paged flex attention and its in-place mask builds;
- :mod:`~graphkv.runtime.capture` — graph keys, captured forwards, PIECEWISE splitting;
- :mod:`~graphkv.runtime.ops` — the runtime kernels by device and their one reference;
- :mod:`~graphkv.runtime.buffers` — every persistent tensor and array above is allocated from the
  plan's ledger entries (``plan.ledger.allocations(device)``), so the ledger is what the runtime holds.

Names are imported lazily (``from graphkv.runtime import allocate, KVPool, BlockTables, Step, Batch,
PAD_SLOT_ID``; the capture decorator is ``graphkv.capture``), so importing ``graphkv.runtime.capture.keys``
does not import Triton. On a CPU the runtime's device work runs as numpy / torch code (``kernels="auto"``);
``kernels="triton"`` runs the GPU path there instead — the same Triton kernels (in Triton's interpreter, no
environment variable needed), the staged table sync and, with ``capture(rehearse=True)``, every step padded to
its graph key — so a CPU run catches the GPU path's bugs.
"""

from __future__ import annotations

from graphkv._lazy import lazy_exports
from graphkv.extras import require

require("runtime", "torch", needed_by="graphkv.runtime")

__all__ = ["PAD_SLOT_ID", "Batch", "BlockTables", "KVPool", "Step", "StepContext", "StepShape", "allocate"]

_LAZY = {
    "KVPool": "graphkv.runtime.pool.allocate",
    "allocate": "graphkv.runtime.pool.allocate",
    "BlockTables": "graphkv.runtime.tables.block_tables",
    "Batch": "graphkv.runtime.step.batch",
    "Step": "graphkv.runtime.step.step",
    "StepContext": "graphkv.runtime.step.context",
    "StepShape": "graphkv.runtime.capture.shape",
    "PAD_SLOT_ID": "graphkv.runtime.padding",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
