"""Frozen descriptors: layer specs, backends, the model declaration, limits and budget."""

from graphkv.spec.backends import (BUILTIN_BACKENDS, Backend, CacheOrder, CudaGraphSupport, KVLayout, MultipleOf,
                                   StrideOrder, get_backend)
from graphkv.spec.budget import GPU, KNOWN_GPUS, Budget, format_bytes, get_gpu, parse_bytes
from graphkv.spec.dtypes import DType, parse_dtype
from graphkv.spec.layers import (ChunkedLocalSpec, FullAttentionSpec, IndexerKeySpec, KVSharedSpec, LayerKind, LayerSpec,
                                 MambaCacheMode, MambaSpec, MLASpec, NoCacheSpec, PageDemand, SlidingWindowSpec)
from graphkv.spec.limits import AUTO, CudaGraphMode, Limits
from graphkv.spec.model import CachelessDecl, LayerDecl, ModelKV

__all__ = [
    "AUTO", "BUILTIN_BACKENDS", "Backend", "Budget", "CacheOrder", "CachelessDecl", "ChunkedLocalSpec", "CudaGraphMode",
    "CudaGraphSupport", "DType", "FullAttentionSpec", "GPU", "IndexerKeySpec", "KNOWN_GPUS", "KVLayout", "KVSharedSpec",
    "LayerDecl", "LayerKind", "LayerSpec", "Limits", "MLASpec", "MambaCacheMode", "MambaSpec", "ModelKV", "MultipleOf",
    "NoCacheSpec", "PageDemand",
    "SlidingWindowSpec", "StrideOrder", "format_bytes", "get_backend", "get_gpu", "parse_bytes", "parse_dtype",
]
