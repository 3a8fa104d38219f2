"""Step 6: CUDA-graph support, the resolved capture mode and the capture sizes.

Support is the minimum over groups: a mixed prefill+decode step can be captured whole only when
every backend says ``ALWAYS``; uniform decode needs ``UNIFORM_SINGLE_TOKEN_DECODE``, or
``UNIFORM_BATCH`` with speculative tokens (queries of ``1 + k`` tokens).
"""

from __future__ import annotations

from typing import Sequence

from graphkv.errors import CaptureError, Problem
from graphkv.plan.groups import GroupDraft
from graphkv.plan.cudagraph_plan import CaptureSizes, CudaGraphPlan
from graphkv.spec.backends import CudaGraphSupport
from graphkv.spec.limits import CudaGraphMode, Limits

__all__ = ["FULL_DECODE_MODES", "MIXED_MODES", "capture_ladder", "decode_support_needed", "plan_cudagraph"]

FULL_DECODE_MODES = (CudaGraphMode.FULL, CudaGraphMode.FULL_DECODE_ONLY, CudaGraphMode.FULL_AND_PIECEWISE)
"""Modes that capture full (uniform) decode graphs."""
MIXED_MODES = (CudaGraphMode.PIECEWISE, CudaGraphMode.FULL, CudaGraphMode.FULL_AND_PIECEWISE)
"""Modes that capture mixed (prefill + decode) graphs."""


def decode_support_needed(limits: Limits) -> CudaGraphSupport:
    """The support full decode graphs need: ``UNIFORM_BATCH`` with speculative tokens (queries of
    ``1 + k`` tokens), else ``UNIFORM_SINGLE_TOKEN_DECODE``."""
    if limits.num_speculative_tokens:
        return CudaGraphSupport.UNIFORM_BATCH
    return CudaGraphSupport.UNIFORM_SINGLE_TOKEN_DECODE


def capture_ladder(maximum: int) -> tuple[int, ...]:
    """1, 2, 4, then every 8 to 256, every 16 to 512, then powers of two — up to and always
    including ``maximum``."""
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, 513, 16)]
    p = 1024
    while p < maximum:
        sizes.append(p)
        p *= 2
    return tuple(sorted({s for s in sizes if s < maximum} | {maximum}))


def _resolve(requested: CudaGraphMode, support: CudaGraphSupport, decode_ok: bool, why_not_decode: str,
             limited_by: str) -> tuple[CudaGraphMode, list[str]]:
    notes: list[str] = []
    mode = requested
    if mode is CudaGraphMode.FULL and support is not CudaGraphSupport.ALWAYS:
        mode = CudaGraphMode.FULL_AND_PIECEWISE
        notes.append(f"FULL -> FULL_AND_PIECEWISE: mixed steps need ALWAYS but {limited_by} supports {support.name}; "
                     "mixed steps run piecewise")
    if mode is CudaGraphMode.FULL_AND_PIECEWISE and not decode_ok:
        mode = CudaGraphMode.PIECEWISE
        notes.append(f"FULL_AND_PIECEWISE -> PIECEWISE: {why_not_decode}")
    if mode is CudaGraphMode.FULL_DECODE_ONLY and not decode_ok:
        raise CaptureError(Problem(field="cudagraph_mode", value=mode.value, limit=why_not_decode,
                                   fix="use cudagraph_mode='PIECEWISE' or 'NONE', or a backend with higher support"))
    return mode, notes


def plan_cudagraph(groups: Sequence[GroupDraft], limits: Limits) -> CudaGraphPlan:
    """Resolve the requested mode against the groups' support and list the capture sizes.

    ``groups`` are the whole model's (every pipeline stage captures the same sizes). Support is
    read from the layers' own :class:`Backend` descriptors, so custom backends that are not built
    in are planned like the built-in ones.
    """
    support, limited_by = CudaGraphSupport.ALWAYS, "all groups"
    for index, g in enumerate(groups):
        for layer in g.layers:
            backend = layer.backend
            if backend.cudagraph_support < support:
                support, limited_by = backend.cudagraph_support, f"group {index} ({backend.name})"
    k = limits.num_speculative_tokens
    decode_needs = decode_support_needed(limits)
    decode_ok = support >= decode_needs
    why = (f"full decode graphs need {decode_needs.name}"
           + (f" (speculative decoding: queries of 1 + {k} tokens)" if k else "")
           + f" but {limited_by} supports {support.name}")
    mode, notes = _resolve(limits.cudagraph_mode, support, decode_ok, why, limited_by)

    query_len = 1 + k
    decode: tuple[int, ...] = ()
    if mode in FULL_DECODE_MODES:
        max_reqs = min(limits.max_num_seqs, limits.max_num_batched_tokens // query_len)
        if max_reqs < limits.max_num_seqs:
            notes.append(f"decode graphs stop at {max_reqs} requests: {max_reqs} x {query_len} tokens fill "
                         f"max_num_batched_tokens={limits.max_num_batched_tokens}")
        decode = tuple(r * query_len for r in capture_ladder(max_reqs))
    mixed: tuple[int, ...] = ()
    if mode in MIXED_MODES:
        mixed = capture_ladder(limits.max_num_batched_tokens)
    return CudaGraphPlan(support=support, limited_by=limited_by, requested_mode=limits.cudagraph_mode, mode=mode,
                         downgrades=tuple(notes), capture_sizes=CaptureSizes(decode=decode, mixed=mixed))
