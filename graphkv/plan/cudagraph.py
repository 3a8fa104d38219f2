"""Step 6: CUDA-graph support, the resolved capture mode and the capture sizes.

Support is the minimum over groups: a mixed prefill+decode step can be captured whole only when
every backend says ``ALWAYS``; uniform decode needs ``UNIFORM_SINGLE_TOKEN_DECODE``, or
``UNIFORM_BATCH`` with speculative tokens (queries of ``1 + k`` tokens).

The capture sizes are the ones vLLM picks by itself (``VllmConfig._set_cudagraph_sizes`` in
config/vllm.py and ``CudagraphDispatcher``, commit 000fc94b), so a plan's graphs, its graph-pool
estimate and ``--emit vllm`` agree with the engine: mixed sizes are vLLM's grid up to the ceiling,
plus ``max_num_batched_tokens`` and, with speculative decoding, the uniform decode steps
``n x (1 + k)``. ``max_num_seqs`` is no size of its own. Without speculative tokens the full decode
graphs are the sizes up to ``max_num_seqs`` (1, 2, 4, 8, 16 at 20 sequences): a decode step of
17..20 requests runs on the 24-token mixed graph (PIECEWISE under FULL_AND_PIECEWISE), as in vLLM.
"""

from __future__ import annotations

from typing import Sequence

from graphkv.errors import CaptureError, Problem
from graphkv.plan.groups import GroupDraft
from graphkv.plan.cudagraph_plan import CaptureSizes, CudaGraphPlan
from graphkv.spec.backends import CudaGraphSupport
from graphkv.spec.limits import CudaGraphMode, Limits

__all__ = ["FULL_DECODE_MODES", "MIXED_MODES", "VLLM_MAX_CAPTURE_SIZE", "capture_ceiling",
           "decode_support_needed", "engine_capture_sizes", "plan_cudagraph", "request_counts",
           "vllm_uniform_decode_sizes"]

VLLM_MAX_CAPTURE_SIZE = 512
"""vLLM 0.33's cap on its default ``max_cudagraph_capture_size`` (``VllmConfig._set_cudagraph_sizes``)."""

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


def capture_ceiling(limits: Limits) -> tuple[int, str]:
    """The largest step (tokens) to capture, and why: ``limits.max_cudagraph_capture_size`` when set,
    else vLLM 0.33's default ``min(2 x max_num_seqs x (1 + num_speculative_tokens), 512)`` (at least
    one request's decode step, ``1 + num_speculative_tokens``); never more than
    ``max_num_batched_tokens``. Steps above it run uncaptured (vLLM runs them piecewise-compiled,
    without graphs): they are large, so their launches are a small part of their time, and every size
    captured costs capture time and graph memory."""
    query_len = 1 + limits.num_speculative_tokens
    if limits.max_cudagraph_capture_size is not None:
        ceiling = limits.max_cudagraph_capture_size
        why = f"max_cudagraph_capture_size={ceiling}"
    else:
        ceiling = min(2 * limits.max_num_seqs * query_len, VLLM_MAX_CAPTURE_SIZE)
        spec = f" x (1 + {limits.num_speculative_tokens})" if limits.num_speculative_tokens else ""
        why = f"max_cudagraph_capture_size: vLLM's default min(2 x max_num_seqs{spec}, {VLLM_MAX_CAPTURE_SIZE})"
        if ceiling < query_len:  # 512 speculative tokens or more: at least one request's decode step
            ceiling, why = query_len, f"one decode step of 1 + {limits.num_speculative_tokens} tokens, above {why}"
    if ceiling > limits.max_num_batched_tokens:
        ceiling = limits.max_num_batched_tokens
        why = f"max_num_batched_tokens={ceiling}, below {why}"
    return ceiling, why


def _grid(ceiling: int) -> list[int]:
    """vLLM's default grid up to ``ceiling``: 1, 2, 4, every 8 below 256, every 16 from 256."""
    return ([s for s in (1, 2, 4) if s <= ceiling] + list(range(8, min(ceiling + 1, 256), 8))
            + list(range(256, ceiling + 1, 16)))


def request_counts(max_reqs: int) -> tuple[int, ...]:
    """vLLM's ``request_counts``: the grid over request counts up to ``min(max_reqs, 512)``, plus that maximum
    itself (the decode batch sizes it captures with speculative decoding)."""
    max_reqs = min(max_reqs, VLLM_MAX_CAPTURE_SIZE)
    return tuple(sorted({*_grid(max_reqs), max_reqs}))


def vllm_uniform_decode_sizes(max_num_seqs: int, num_speculative_tokens: int) -> tuple[int, ...]:
    """The uniform decode steps vLLM adds to its default capture sizes with speculative decoding: ``n x (1 + k)``
    tokens for ``n`` in :func:`request_counts` ``(max_num_seqs)``, within its default ceiling
    ``min(2 x max_num_seqs x (1 + k), 512)`` (before the ``max_num_batched_tokens`` cap); none without speculative
    tokens. Only when the ceiling is vLLM's default (``max_cudagraph_capture_size`` unset). Pure."""
    query_len = 1 + num_speculative_tokens
    if query_len == 1:
        return ()
    default_ceiling = min(2 * max_num_seqs * query_len, VLLM_MAX_CAPTURE_SIZE)
    return tuple(n * query_len for n in request_counts(max_num_seqs) if n * query_len <= default_ceiling)


def engine_capture_sizes(ceiling: int, max_num_batched_tokens: int, *,
                         uniform_decode_sizes: Sequence[int] = ()) -> tuple[int, ...]:
    """vLLM's capture sizes up to ``ceiling`` tokens (``VllmConfig._set_cudagraph_sizes``, config/vllm.py at
    commit 000fc94b): 1, 2, 4, every 8 below 256, every 16 from 256, plus ``max_num_batched_tokens`` where it is
    within the ceiling, plus the ``uniform_decode_sizes`` (:func:`vllm_uniform_decode_sizes`) of at most
    ``max_num_batched_tokens`` tokens. ``max_num_seqs`` is not a size of its own: a decode step of more requests
    than the last size below it pads to the next size. Pure.

    >>> engine_capture_sizes(40, 8192)
    (1, 2, 4, 8, 16, 24, 32, 40)
    """
    sizes = set(_grid(ceiling))
    if max_num_batched_tokens <= ceiling:
        sizes.add(max_num_batched_tokens)
    sizes |= {s for s in uniform_decode_sizes if s <= max_num_batched_tokens}
    return tuple(sorted(sizes))


def _decode_sizes(limits: Limits, ceiling: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Full decode graphs' token counts. Without speculative tokens, vLLM's: the capture ``sizes`` up to
    ``max_num_seqs`` (``CudagraphDispatcher`` keys no decode graph above it; a larger decode step runs on a mixed
    graph). With them, ``n x (1 + k)`` over the request grid up to the most requests whose tokens fit the ceiling
    and the step budget, ending at ``max_num_seqs`` or the budget's requests where they end it."""
    query_len = 1 + limits.num_speculative_tokens
    if query_len == 1:
        return tuple(s for s in sizes if s <= limits.max_num_seqs)
    budget_reqs = limits.max_num_batched_tokens // query_len
    max_reqs = min(limits.max_num_seqs, budget_reqs, ceiling // query_len)
    ends = {r for r in (limits.max_num_seqs, budget_reqs) if r <= max_reqs}
    return tuple(r * query_len for r in sorted({*_grid(max_reqs), *ends}))


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
    ceiling, ceiling_why = capture_ceiling(limits)
    uniform = vllm_uniform_decode_sizes(limits.max_num_seqs, k) if limits.max_cudagraph_capture_size is None else ()
    sizes = engine_capture_sizes(ceiling, limits.max_num_batched_tokens, uniform_decode_sizes=uniform)
    decode: tuple[int, ...] = ()
    if mode in FULL_DECODE_MODES:
        decode = _decode_sizes(limits, ceiling, sizes)
        max_reqs = min(limits.max_num_seqs, limits.max_num_batched_tokens // query_len, ceiling // query_len)
        if max_reqs < limits.max_num_seqs and decode:
            last = decode[-1] // query_len
            notes.append(f"decode graphs stop at {last} request{'s' if last != 1 else ''} ({decode[-1]} tokens): steps "
                         f"above {ceiling} tokens are not captured ({ceiling_why}); larger decode steps run uncaptured")
    mixed = sizes if mode in MIXED_MODES else ()
    if limits.cudagraph_mode is CudaGraphMode.NONE and limits.max_cudagraph_capture_size is not None:
        notes.append(f"max_cudagraph_capture_size={limits.max_cudagraph_capture_size} has no effect: cudagraph_mode "
                     "NONE captures no graph")
    return CudaGraphPlan(support=support, limited_by=limited_by, requested_mode=limits.cudagraph_mode, mode=mode,
                         downgrades=tuple(notes), capture_sizes=CaptureSizes(decode=decode, mixed=mixed),
                         max_capture_size_reason=ceiling_why if decode or mixed else "")
