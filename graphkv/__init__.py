"""graphkv: plan, allocate and capture paged KV caches for hybrid models.

spec (frozen descriptors) --compile--> Plan --allocate--> runtime buffers --capture--> graphs.
Importing graphkv does not import torch; only the runtime does.
"""

from graphkv.errors import CapacityError, CaptureError, ConsensusError, GraphkvError, PlanError, Problem, SpecError
from graphkv.plan import Plan, compile_plan
from graphkv.spec import (AUTO, BUILTIN_BACKENDS, Backend, Budget, CacheOrder, CachelessDecl, ChunkedLocalSpec,
                          CudaGraphMode, CudaGraphSupport, DType, FullAttentionSpec, IndexerKeySpec, KVLayout,
                          KVSharedSpec, LayerDecl, LayerKind, Limits, MambaCacheMode, MambaSpec, MLASpec, ModelKV,
                          MultipleOf, NoCacheSpec, SlidingWindowSpec, StrideOrder, get_backend)

compile = compile_plan  # noqa: A001 — the verb of the architecture: spec --compile--> plan

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The runtime needs torch; import it only when a runtime name is asked for.
    if name == "capture":
        from graphkv.runtime.capture.graphs import capture
        return capture
    raise AttributeError(f"module 'graphkv' has no attribute {name!r}")

__all__ = [
    "AUTO", "BUILTIN_BACKENDS", "Backend", "Budget", "CacheOrder", "CachelessDecl", "CapacityError", "CaptureError",
    "ConsensusError",
    "ChunkedLocalSpec", "CudaGraphMode", "CudaGraphSupport", "DType", "FullAttentionSpec", "GraphkvError",
    "IndexerKeySpec", "KVLayout", "KVSharedSpec", "LayerDecl", "LayerKind", "Limits", "MLASpec", "MambaCacheMode",
    "MambaSpec", "ModelKV", "MultipleOf", "NoCacheSpec", "Plan", "PlanError", "Problem", "SlidingWindowSpec",
    "SpecError", "StrideOrder", "capture", "compile", "compile_plan", "get_backend",
]
