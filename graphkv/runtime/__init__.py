"""The runtime: allocate a Plan once, fill persistent buffers per step.

``allocate(plan, device)`` -> :class:`KVPool` (raw slots + per-layer views);
``BlockTables(plan, device)`` (per-group tables, staged edits, gather, slot mapping).
Names are imported lazily, so importing ``graphkv.runtime.capture`` does not import Triton.
On a CPU the runtime kernels run as torch code (:mod:`graphkv.runtime.torch_kernels`, chosen by
``kernels="auto"``); to run the Triton kernels there, in Triton's interpreter, set
``TRITON_INTERPRET=1`` before the first kernel import and pass ``kernels="triton"``.
"""

from __future__ import annotations

import importlib
from typing import Any

from graphkv.extras import require

require("runtime", "torch", needed_by="graphkv.runtime")

__all__ = ["PAD_SLOT_ID", "Batch", "BlockTables", "KVPool", "Step", "allocate"]

_LAZY = {
    "KVPool": "graphkv.runtime.kv_pool",
    "allocate": "graphkv.runtime.kv_pool",
    "BlockTables": "graphkv.runtime.block_tables",
    "PAD_SLOT_ID": "graphkv.runtime.padding",
    "Step": "graphkv.runtime.step",
    "Batch": "graphkv.runtime.step",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graphkv.runtime' has no attribute {name!r}")
