"""Graph keys: which captured CUDA graph (if any) runs a step of a given shape.

A step is described by ``num_tokens`` (tokens scheduled in it), ``num_reqs`` (requests in it)
and ``uniform`` (every request has the same query length ``1 + num_speculative_tokens``, i.e. a
uniform decode batch). The step runs on the smallest captured graph that can hold it: its token
count is padded up to the next capture size of the plan.

- **Uniform decode keys** (``uniform=True``) come from ``plan.cudagraph.capture_sizes.decode``
  and run as FULL graphs. ``num_reqs`` is the *padded* request count,
  ``num_tokens // (1 + num_speculative_tokens)``: a uniform graph's attention metadata has
  exactly that many rows.
- **Mixed keys** (``uniform=False``) come from ``capture_sizes.mixed`` and have
  ``num_reqs=None``: a mixed graph serves any request count up to ``max_num_seqs`` (per-request
  buffers are sized to ``max_num_seqs``), so the request count is not part of the key. They run
  as FULL graphs in mode ``FULL`` (needs ``ALWAYS`` support) and as PIECEWISE graphs (attention
  eager between captured pieces) in modes ``PIECEWISE`` and ``FULL_AND_PIECEWISE``.

A uniform step that no decode graph can hold (mode ``PIECEWISE``, support too low for full decode
graphs, or more tokens than the largest decode size: without speculative tokens the decode sizes
stop at the last capture size up to ``max_num_seqs``, so at 20 sequences a step of 17..20 requests
takes the mixed key of 24, as vLLM dispatches it) falls back to the mixed sizes: a uniform batch is
also a valid mixed batch.

Everything here is pure and host-only (no torch); capture-safe.

Example (a plan with decode sizes 1, 2, 4, 8, ... and no speculative tokens)::

    d = dispatch(plan.cudagraph, plan.limits, num_tokens=3, num_reqs=3, uniform=True)
    d.key   # GraphKey(num_tokens=4, num_reqs=4, uniform=True)
    d.mode  # CudaGraphMode.FULL
"""

from __future__ import annotations

import attrs

from graphkv.errors import CaptureError, Problem
from graphkv.plan.graph_keys import GraphKey, decode_allowed, mixed_allowed, capture_keys, graph_mode
from graphkv.plan.plan import CudaGraphPlan
from graphkv.spec.limits import CudaGraphMode, Limits

__all__ = ["Dispatcher", "GraphKey", "StepDispatch", "capture_keys", "dispatch", "graph_mode", "select_key"]


@attrs.frozen(kw_only=True)
class StepDispatch:
    """How one step runs: on ``key`` under ``mode`` (FULL or PIECEWISE), or eagerly
    (``key is None``, ``mode`` NONE) for ``eager_reason``.

    ``eager_reason`` depends only on the plan, never on the step's own sizes, so a caller can log
    it once per reason.
    """

    key: GraphKey | None
    mode: CudaGraphMode
    eager_reason: str | None = None


def _check_step(limits: Limits, num_tokens: int, num_reqs: int, uniform: bool) -> None:
    problems = []
    for name, value in (("num_tokens", num_tokens), ("num_reqs", num_reqs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(Problem(field=name, value=value, limit="must be an int >= 1",
                                    fix=f"pass the step's {name} (a step schedules at least one token)"))
    if not isinstance(uniform, bool):
        problems.append(Problem(field="uniform", value=uniform, limit="must be a bool",
                                fix="pass True for a uniform decode batch, False otherwise"))
    if problems:
        raise CaptureError(*problems)
    if num_reqs > num_tokens:
        raise CaptureError(Problem(field="num_reqs", value=num_reqs,
                                   limit=f"exceeds num_tokens={num_tokens} (each request schedules >= 1 token)",
                                   fix="pass the number of requests with tokens in this step"))
    query_len = 1 + limits.num_speculative_tokens
    if uniform and num_tokens != num_reqs * query_len:
        raise CaptureError(Problem(
            field="uniform", value=True,
            limit=(f"a uniform step has num_tokens == num_reqs * (1 + num_speculative_tokens) = {num_reqs} * "
                   f"{query_len}, got num_tokens={num_tokens}"),
            fix="pass uniform=False for steps whose requests have different query lengths"))


def _pad(sizes: tuple[int, ...], num_tokens: int) -> int | None:
    for size in sizes:  # ascending
        if size >= num_tokens:
            return size
    return None


def dispatch(cg: CudaGraphPlan, limits: Limits, *, num_tokens: int, num_reqs: int, uniform: bool) -> StepDispatch:
    """Choose the smallest captured key that holds a step, or say why the step runs eagerly.

    ``cg`` is ``plan.cudagraph`` and ``limits`` the plan's limits. Raises :class:`CaptureError`
    for impossible step descriptions (sizes < 1, ``num_reqs > num_tokens``, ``uniform`` with
    ``num_tokens != num_reqs * (1 + num_speculative_tokens)``). Pure; capture-safe.
    """
    _check_step(limits, num_tokens, num_reqs, uniform)
    if cg.mode is CudaGraphMode.NONE:
        return StepDispatch(key=None, mode=CudaGraphMode.NONE, eager_reason="cudagraph mode NONE captures no graphs")
    if num_reqs > limits.max_num_seqs:
        return StepDispatch(key=None, mode=CudaGraphMode.NONE,
                            eager_reason=f"num_reqs above max_num_seqs={limits.max_num_seqs}")
    reasons = []
    if uniform:
        why_not = decode_allowed(cg, limits)
        if why_not is None:
            num_tokens_padded = _pad(cg.capture_sizes.decode, num_tokens)
            if num_tokens_padded is not None:
                num_reqs_padded = num_tokens_padded // (1 + limits.num_speculative_tokens)
                key = GraphKey(num_tokens=num_tokens_padded, num_reqs=num_reqs_padded, uniform=True)
                return StepDispatch(key=key, mode=CudaGraphMode.FULL)
            why_not = f"uniform step above the largest decode capture size {cg.capture_sizes.decode[-1]}"
        reasons.append(why_not)
    why_not = mixed_allowed(cg)
    if why_not is None:
        num_tokens_padded = _pad(cg.capture_sizes.mixed, num_tokens)
        if num_tokens_padded is not None:
            key = GraphKey(num_tokens=num_tokens_padded, num_reqs=None, uniform=False)
            return StepDispatch(key=key, mode=graph_mode(cg, key))
        why_not = f"num_tokens above the largest mixed capture size {cg.capture_sizes.mixed[-1]}"
    reasons.append(why_not)
    return StepDispatch(key=None, mode=CudaGraphMode.NONE, eager_reason="; ".join(reasons))


def select_key(cg: CudaGraphPlan, limits: Limits, *, num_tokens: int, num_reqs: int, uniform: bool) -> GraphKey | None:
    """The smallest captured key that can hold the step, or ``None`` when it must run eagerly.

    See :func:`dispatch` for the reason and the runtime mode. Pure; capture-safe.
    """
    return dispatch(cg, limits, num_tokens=num_tokens, num_reqs=num_reqs, uniform=uniform).key


class Dispatcher:
    """:func:`dispatch` for one plan, remembered per step shape: a serving loop asks it once per step,
    and repeated shapes (every decode step of a batch size) cost one dict lookup.

    The answer for a valid step depends only on ``(num_tokens, uniform)`` (a mixed key holds any
    request count up to ``max_num_seqs``; a uniform step's request count follows from its tokens),
    so at most ``2 * max_num_batched_tokens`` answers are kept. Other steps are dispatched (and
    refused) without the memo. Host-only; capture-safe.
    """

    def __init__(self, cg: CudaGraphPlan, limits: Limits) -> None:
        self._cg, self._limits = cg, limits
        self._query_len = 1 + limits.num_speculative_tokens
        self._memo: dict[tuple[int, bool], StepDispatch] = {}

    def __call__(self, num_tokens: int, num_reqs: int, uniform: bool) -> StepDispatch:
        """:func:`dispatch` of a step of ``num_tokens`` tokens from ``num_reqs`` requests."""
        valid = (type(num_tokens) is int and type(num_reqs) is int and type(uniform) is bool
                 and 1 <= num_reqs <= min(num_tokens, self._limits.max_num_seqs)
                 and (not uniform or num_tokens == num_reqs * self._query_len))
        if not valid:  # an impossible step (dispatch says why) or one that runs eagerly
            return dispatch(self._cg, self._limits, num_tokens=num_tokens, num_reqs=num_reqs, uniform=uniform)
        found = self._memo.get((num_tokens, uniform))
        if found is None:
            found = self._memo[(num_tokens, uniform)] = dispatch(self._cg, self._limits, num_tokens=num_tokens,
                                                                 num_reqs=num_reqs, uniform=uniform)
        return found

