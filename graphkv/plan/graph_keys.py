"""Capture keys: which CUDA graphs a plan captures (pure, torch-free; the planner sizes each key's
graph memory from them and the runtime captures exactly these).

A *uniform decode* key (``uniform=True``) comes from ``capture_sizes.decode`` and runs as a FULL
graph with ``num_reqs = num_tokens // (1 + num_speculative_tokens)`` rows; a *mixed* key
(``uniform=False``, ``num_reqs=None``) comes from ``capture_sizes.mixed`` and serves any request
count up to ``max_num_seqs``. Dispatch of a step to a key lives in
:mod:`graphkv.runtime.capture.keys`.
"""

from __future__ import annotations

import attrs

from graphkv.plan.cudagraph import FULL_DECODE_MODES, MIXED_MODES, decode_support_needed
from graphkv.plan.cudagraph_plan import CudaGraphPlan
from graphkv.spec.backends import CudaGraphSupport
from graphkv.spec.limits import CudaGraphMode, Limits

__all__ = ["GraphKey", "capture_keys", "decode_allowed", "graph_mode", "mixed_allowed"]


@attrs.frozen(kw_only=True)
class GraphKey:
    """One captured graph: padded token count, padded request count (``None`` for mixed keys) and
    whether it is a uniform decode graph."""

    num_tokens: int
    num_reqs: int | None
    uniform: bool

    def __str__(self) -> str:
        if self.uniform:
            return f"decode(num_tokens={self.num_tokens}, num_reqs={self.num_reqs})"
        return f"mixed(num_tokens={self.num_tokens})"


def graph_mode(cg: CudaGraphPlan, key: GraphKey) -> CudaGraphMode:
    """The runtime mode of ``key`` under the plan: FULL for decode keys and for mixed keys in mode
    FULL, PIECEWISE for mixed keys in PIECEWISE / FULL_AND_PIECEWISE."""
    if key.uniform or cg.mode is CudaGraphMode.FULL:
        return CudaGraphMode.FULL
    return CudaGraphMode.PIECEWISE


def decode_allowed(cg: CudaGraphPlan, limits: Limits) -> str | None:
    """None when full decode graphs are captured, else why not."""
    if cg.mode not in FULL_DECODE_MODES or not cg.capture_sizes.decode:
        return f"cudagraph mode {cg.mode.value} captures no full decode graphs"
    needs = decode_support_needed(limits)
    if cg.support < needs:
        return (f"full decode graphs need cudagraph support {needs.name} but {cg.limited_by} supports "
                f"{cg.support.name}")
    return None


def mixed_allowed(cg: CudaGraphPlan) -> str | None:
    """None when mixed graphs are captured, else why not."""
    if cg.mode not in MIXED_MODES or not cg.capture_sizes.mixed:
        return f"cudagraph mode {cg.mode.value} captures no mixed (prefill + decode) graphs"
    if cg.mode is CudaGraphMode.FULL and cg.support < CudaGraphSupport.ALWAYS:
        return f"full mixed graphs need cudagraph support ALWAYS but {cg.limited_by} supports {cg.support.name}"
    return None


def capture_keys(cg: CudaGraphPlan, limits: Limits) -> tuple[GraphKey, ...]:
    """Every key the plan captures, largest first (decode before mixed at equal token counts).

    Exactly the keys :func:`dispatch` can return.
    """
    query_len = 1 + limits.num_speculative_tokens
    keys: list[GraphKey] = []
    if decode_allowed(cg, limits) is None:
        keys += [GraphKey(num_tokens=n, num_reqs=n // query_len, uniform=True) for n in cg.capture_sizes.decode]
    if mixed_allowed(cg) is None:
        keys += [GraphKey(num_tokens=n, num_reqs=None, uniform=False) for n in cg.capture_sizes.mixed]
    return tuple(sorted(keys, key=lambda k: (-k.num_tokens, not k.uniform)))
