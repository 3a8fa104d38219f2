"""Capture a forward in CUDA graphs, one per :class:`GraphKey` of the plan, and replay them.

Calling convention: the forward takes named tensor inputs whose token dimension (dim 0 unless
``token_dims`` says otherwise) has ``num_tokens`` entries, and returns a tensor or a
tuple / list / dict of tensors whose dim 0 is tokens or requests (a namedtuple or a dict subclass
such as ``ModelOutput`` comes back as itself; a 0-dim output, which would include the padding
rows, is refused at capture). Per-request metadata (block tables, query
start locations, sequence lengths) lives in persistent buffers the step fills in place and the
layers read through :func:`graphkv.runtime.step.context.forward_context`.

Per step the wrapper decides the step's :class:`~graphkv.runtime.capture.shape.StepShape` once
(:meth:`CapturedForward.shape_of`: the smallest captured key that holds it, see
:func:`graphkv.runtime.capture.keys.dispatch`), copies the given inputs into the first
``num_tokens`` rows of its static buffers, pads rows ``num_tokens .. num_tokens_padded`` with each
input's pad value, replays, and returns the outputs sliced to ``num_tokens``. Steps outside the
captured range, or whose key the plan's support does not allow, run eagerly on the caller's
tensors, logged once per reason. Without CUDA every step runs eagerly — unless the forward was
*rehearsed* (``capture(rehearse=True)``): then every key is warmed up and every step dispatched and
padded exactly as replay would, and the forward runs eagerly on the padded static buffers. That is
the GPU path on a CPU, so a CPU run catches its padding and dispatch bugs.

Example (a serving step)::

    step = graphkv.runtime.step.Step(plan, "cuda")
    fwd = graphkv.capture(plan, static_inputs={"input_ids": step.input_ids})(model.forward)
    fwd.capture(prepare=step.capture_context)         # dummy steps of each key's size
    logits = step.run(fwd, batch, input_ids=ids)     # prepare + forward_context + replay or eager

or, driving the call yourself::

    shape = step.prepare(batch, forward=fwd)         # buffers filled for the padded shape
    with forward_context(step.context, shape):
        logits = fwd.run(shape, inputs={"input_ids": ids})
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import time
from typing import Any, Callable, ContextManager, Mapping

import attrs
import torch

from graphkv.errors import CaptureError, GraphkvError, Problem
from graphkv.plan.plan import Plan
from graphkv.printable import shortened
from graphkv.runtime.capture import piecewise
from graphkv.runtime.capture.checks import (check_callable, check_forward_parameters, check_plan, enter_prepared,
                                            refuse_other_plan)
from graphkv.runtime.capture.cut import check_eager_shape, check_fits_key, check_outputs, cut_to_step
from graphkv.runtime.capture.keys import Dispatcher, GraphKey, StepDispatch, capture_keys, graph_mode
from graphkv.runtime.capture.report import CPU_UNAVAILABLE, MODE_NONE, CaptureReport, shown
from graphkv.runtime.capture.shape import ShapeMemo, StepShape, key_shape, shape_context
from graphkv.runtime.capture.staging import StagingArena
from graphkv.runtime.capture.static_inputs import StaticInputs
from graphkv.runtime.capture.weak import tree_map, weak_outputs
from graphkv.spec.backends import CudaGraphSupport
from graphkv.spec.limits import CudaGraphMode

__all__ = ["CPU_UNAVAILABLE", "MODE_NONE", "CaptureReport", "CapturedForward", "capture"]

logger = logging.getLogger(__name__)

_NOT_CAPTURED = "running eagerly: graphs not captured yet (call .capture() first)"
_FULL_MODES = (CudaGraphMode.FULL, CudaGraphMode.FULL_DECODE_ONLY, CudaGraphMode.FULL_AND_PIECEWISE)


@attrs.define
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph for FULL keys; None for PIECEWISE keys (runners hold the pieces) and rehearsals
    outputs: Any  # weak views of the FULL graph's outputs (graph-pool memory every key shares)
    rehearsed: bool = False  # no graph: the forward runs eagerly on the key's padded static buffers


class CapturedForward:
    """A forward with one CUDA graph per captured key; build it with :func:`capture`.

    Outputs of a replayed step are graph-pool memory every key shares (:mod:`graphkv.runtime.capture.weak`):
    they are overwritten by the next replay (of any key) and valid only while the forward's graphs live. Pass ``copy_outputs=True`` to get clones instead, or copy what you keep. The
    forward always runs under ``torch.no_grad()`` (a replayed graph cannot backpropagate, and one
    grad mode keeps a compiled forward from recompiling between capture and serving). ``stream``
    (optional): the ``torch.cuda.Stream`` every key is warmed up and captured on (default: one side
    stream made at the first :meth:`capture`; see :func:`capture`).

    Refused with :class:`CaptureError` at construction: a ``plan`` that is not a :class:`Plan`
    (a ``GpuPlan``'s is its ``.plan``, a ``ConsensusPlan``'s this rank's ``plan_for(model)``), an
    ``fn`` that is not callable, static input names that are no parameter of ``fn``, and what
    :class:`~graphkv.runtime.capture.static_inputs.StaticInputs` refuses (buffers that are not
    tensors with a token dim, overlapping buffers, pad values their dtype cannot hold).
    """

    def __init__(self, fn: Callable[..., Any], plan: Plan, *, static_inputs: Mapping[str, torch.Tensor] | None = None,
                 pad_values: Mapping[str, float] | None = None, token_dims: Mapping[str, int] | None = None,
                 copy_outputs: bool = False, pool: Any = None, stream: Any = None) -> None:
        plan = check_plan(plan)
        check_callable("fn", fn, "wrap the model's forward: graphkv.capture(plan, ...)(model.forward)", optional=False)
        if not isinstance(copy_outputs, bool):  # "no" is truthy: it would clone
            raise CaptureError(Problem(field="copy_outputs", value=copy_outputs, limit="must be a bool",
                                       fix="pass True to get clones of replayed outputs, else False"))
        self.fn = fn
        self.plan = plan
        self.copy_outputs = copy_outputs
        self.pool = pool
        self.stream = stream
        self.inputs = StaticInputs(static_inputs, pad_values=pad_values, token_dims=token_dims)
        check_forward_parameters(fn, self.inputs.buffers, "static_inputs")
        self._graphs: dict[GraphKey, _Captured] = {}
        self._shapes = ShapeMemo(plan.limits.max_num_seqs)  # decode steps' shapes (cleared by capture)
        self._rehearsed = False
        self._dispatch = Dispatcher(plan.cudagraph, plan.limits)
        self._logged: set[str] = set()
        self._piecewise_missing: str | None = None
        self._staging = StagingArena()  # the eager ops' outputs every PIECEWISE piece of every key reads
        self._priming: Any = None  # the graph that put the capture stream's cuBLAS workspaces in the pool (kept)
        self._num_piece_graphs = 0  # piece graphs captured by the last ``capture()``
        functools.update_wrapper(self, fn, updated=())
        if plan.cudagraph.mode is CudaGraphMode.NONE:  # the plan's own choice, on any device
            self.unavailable_reason: str | None = MODE_NONE
        elif not torch.cuda.is_available():
            self.unavailable_reason = CPU_UNAVAILABLE
        else:
            self.unavailable_reason = self._off_device_reason()

    def _off_device_reason(self) -> str | None:
        """Why no graph can be captured over the static inputs: they live where CUDA graphs do not
        (a CPU forward on a machine that has a GPU would otherwise capture empty graphs)."""
        off = sorted({str(b.device) for b in self.inputs.buffers.values() if not piecewise.graph_device(b.device)})
        if off:
            return (f"CUDA graphs need CUDA tensors: the forward's static inputs are on {', '.join(off)}; running "
                    "eagerly")
        return None

    @property
    def support(self) -> CudaGraphSupport:
        """The plan's CUDA-graph support (minimum over groups)."""
        return self.plan.cudagraph.support

    @property
    def mode(self) -> CudaGraphMode:
        """The plan's resolved capture mode."""
        return self.plan.cudagraph.mode

    @property
    def keys(self) -> tuple[GraphKey, ...]:
        """Keys captured (or rehearsed), largest first (empty before :meth:`capture`, and without
        CUDA unless rehearsed)."""
        return tuple(self._graphs)

    @property
    def rehearsed(self) -> bool:
        """Whether :meth:`capture` rehearsed the keys (no CUDA graphs; padded eager steps)."""
        return self._rehearsed

    @property
    def static_inputs(self) -> Mapping[str, torch.Tensor]:
        """The persistent input buffers graphs read, by name (a step may fill them in place)."""
        return dict(self.inputs.buffers)

    def shape_of(self, dispatch: StepDispatch, num_tokens: int, num_reqs: int, uniform: bool) -> StepShape:
        """The :class:`StepShape` of a step the plan dispatches to ``dispatch`` (``Step.prepare`` and
        :meth:`__call__` ask once per step): padded to ``dispatch.key`` when this forward holds a
        graph of it (or its rehearsal), else eager on the step's own sizes, with the reason."""
        found = self._shapes.decode(num_reqs) if uniform else None
        if found is not None:
            return found
        captured = dispatch.key is not None and dispatch.key in self._graphs
        if self.unavailable_reason is not None and not self._rehearsed:
            reason = self.unavailable_reason  # (one reason for every step: no graphs at all here)
        elif dispatch.key is None:
            reason = f"running eagerly: {dispatch.eager_reason}"
        elif captured:
            reason = None
        elif self._piecewise_missing and dispatch.mode is CudaGraphMode.PIECEWISE:
            reason = self._piecewise_missing
        else:
            reason = _NOT_CAPTURED
        return self._shapes.shape(dispatch, num_tokens, num_reqs, uniform, replayed=captured, eager_reason=reason)

    def _refuse_never_groups(self) -> None:
        if self.mode not in _FULL_MODES:
            return
        backend_of = {layer.index: layer.backend for layer in self.plan.layers}
        problems = []
        for g in self.plan.groups:
            never = sorted({backend_of[i].name for i in g.layers
                            if backend_of[i].cudagraph_support is CudaGraphSupport.NEVER})
            if never:
                problems.append(Problem(
                    field="cudagraph_mode", value=self.mode.value,
                    limit=(f"group {g.index} (layers {', '.join(g.layer_names)}; backend {', '.join(never)}) has "
                           "cudagraph support NEVER, so it cannot run inside a FULL graph"),
                    fix=(f"use cudagraph_mode='PIECEWISE' (attention runs eagerly between captured pieces) or "
                         f"'NONE', or give group {g.index} a backend that supports capture")))
        if problems:
            raise CaptureError(*problems)

    def _log_once(self, reason: str, level: int, detail: str = "") -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            logger.log(level, "%s%s (logged once per reason)", reason, detail)

    def _forget(self) -> None:
        """Drop what an earlier :meth:`capture` rehearsed: every step runs eagerly."""
        if self._graphs and self._rehearsed:
            self._graphs.clear()
            self._rehearsed = False
            self._piecewise_missing = None
            self._shapes.clear()

    @torch.no_grad()
    def capture(self, progress: bool = True, *, prepare: Callable[[GraphKey], ContextManager[Any]] | None = None,
                example_inputs: Mapping[str, torch.Tensor] | None = None,
                on_key: Callable[[str, GraphKey], None] | None = None, rehearse: bool = False) -> CaptureReport:
        """Warm up and capture every key of the plan, largest first, into one memory pool.

        ``prepare(key)`` returns a context entered around each key's warm-up and capture (e.g.
        ``Step.capture_context``: a forward context holding a dummy step of ``key``'s shape); the
        metadata tensors must be the persistent buffers serving steps fill, since a replay reads the
        captured addresses. ``example_inputs`` allocates the static buffers (shape of each tensor
        with the token dim set to ``max_num_batched_tokens``) when no ``static_inputs`` were given. Capture
        fills every static input with its pad value. ``progress`` writes a progress line to stderr.
        ``on_key(phase, key)`` is called after each key's warm-up (``phase="warm-up"``) and capture
        (``"capture"``), e.g. to measure each graph's memory (``graphkv bench memory``).

        ``rehearse=True`` captures no CUDA graph (on any device): every key is warmed up and
        "captured" by running the forward eagerly on its padded static buffers, and every later step
        is dispatched, padded and run on those buffers exactly as a replay would — the GPU path on a
        CPU (PIECEWISE keys count only where the forward has piecewise runners, as on a GPU).

        Raises :class:`CaptureError` when the plan asks for FULL graphs and a group's backend
        support is NEVER (on CPU too); for static inputs too small for the largest key, or
        ``example_inputs`` beside ``static_inputs`` (on every device); for a ``prepare`` or
        ``on_key`` that is not callable, a ``prepare`` that returns no context manager or belongs to a
        ``Step`` of another plan (``prepare=step.capture_context``), and a forward that raises while
        warming up or being captured (naming the key; the forward's exception is the cause). Without
        CUDA (or in mode NONE) and without ``rehearse`` it captures nothing, logs and returns
        :data:`CPU_UNAVAILABLE` (:data:`MODE_NONE`) as ``unavailable_reason``; every call then runs
        eagerly on its own sizes, an earlier rehearsal included (the report says what the forward does).
        """
        check_callable("prepare", prepare, "pass a function of a GraphKey returning a context manager, e.g. "
                                           "prepare=step.capture_context")
        check_callable("on_key", on_key, "pass a function on_key(phase, key), or None")
        for name, flag in (("progress", progress), ("rehearse", rehearse)):
            if not isinstance(flag, bool):  # "no" is truthy
                raise CaptureError(Problem(field=name, value=flag, limit="must be a bool", fix=f"pass {name}=True "
                                           "or False"))
        refuse_other_plan(self.plan, prepare)
        self._refuse_never_groups()
        keys = capture_keys(self.plan.cudagraph, self.plan.limits) if self.mode is not CudaGraphMode.NONE else ()
        if self.inputs.buffers or example_inputs is not None:  # checked on every device: a CPU run catches them
            # every step's rows, not just the largest key's: steps above it run eagerly on the buffers
            self.inputs.ensure(example_inputs, keys[0].num_tokens if keys else 0,
                               self.plan.limits.max_num_batched_tokens)
            check_forward_parameters(self.fn, self.inputs.buffers, "example_inputs")
            if self.unavailable_reason is None:  # the buffers may be new (example_inputs)
                self.unavailable_reason = self._off_device_reason()
        if self.unavailable_reason is not None and not (rehearse and self.mode is not CudaGraphMode.NONE):
            self._forget()  # an earlier rehearsal: from now on every step runs eagerly, as the report says
            self._log_once(self.unavailable_reason, logging.WARNING)
            return CaptureReport(keys=(), seconds=0.0, unavailable_reason=self.unavailable_reason)  # logged above
        if not keys:
            return shown(CaptureReport(keys=(), seconds=0.0, skipped=(
                f"the plan's cudagraph support {self.support.name} allows no key of mode {self.mode.value}",),
                rehearsed=rehearse), progress)
        self.inputs.require()
        if self._priming is not None and not rehearse:
            raise CaptureError(Problem(
                field="capture", value=f"{len(self._graphs)} keys captured already",
                limit="a forward captures once: its graphs share the capture stream's cuBLAS workspaces in the pool, "
                      "which capturing again would release under them",
                fix="build a new forward (graphkv.capture(plan, ...)(fn)) to capture again"))
        cuda = [b.device for b in self.inputs.buffers.values() if b.device.type == "cuda"]
        # on the inputs' device: streams, the pool and every warm-up, capture and synchronize act on the current one
        with torch.cuda.device(cuda[0]) if cuda and not rehearse else contextlib.nullcontext():
            self._rehearsed = rehearse
            self._num_piece_graphs = 0
            self._shapes.clear()
            if self.pool is None and not rehearse:
                self.pool = torch.cuda.graph_pool_handle()
            if self.stream is None and not rehearse:  # one stream, one set of cuBLAS workspaces (a new side stream
                self.stream = torch.cuda.Stream()  # per warm-up cycled through torch's 32 pooled streams, 33 MiB each)
            start = time.perf_counter()
            try:
                phase_seconds = self._warm_up_and_capture(keys, rehearse, progress, prepare, on_key)
            finally:
                if self._priming is not None and not rehearse:  # the capture stream's workspace is a block of
                    piecewise.release_blas_workspaces()  # the pool the graphs read: freed to the pool (scratch,
                    # still mapped), no later matmul on the stream writes it
        self._shapes.clear()
        report = CaptureReport(keys=self.keys, seconds=time.perf_counter() - start,
                               skipped=(self._piecewise_missing,) if self._piecewise_missing else (),
                               rehearsed=rehearse, warm_up_seconds=phase_seconds[0],
                               capture_seconds=phase_seconds[1], num_piece_graphs=self._num_piece_graphs)
        logger.info("%s", report)
        return shown(report, progress)

    def _warm_up_and_capture(self, keys: tuple[GraphKey, ...], rehearse: bool, progress: bool,
                             prepare: Callable[[GraphKey], ContextManager[Any]] | None,
                             on_key: Callable[[str, GraphKey], None] | None) -> list[float]:
        """Warm up every key, then capture (or rehearse) every key; the seconds of each phase. Warming up every
        key before capturing any: a compiled forward recompiles (e.g. turns dynamic) while warming up, and a
        graph must be captured on the compiled entry that serving will use."""
        what = "rehearsing graph keys" if rehearse else "capturing CUDA graphs"
        phase_seconds: list[float] = []
        for phase, step in (("warming up", self._warm_up), (what, self._capture_key)):
            if step == self._capture_key and not rehearse:  # the warm-ups' cuBLAS workspaces, outside the pool,
                # go now, and a priming capture takes the stream's from the pool: every key's graphs, and the
                # eager ops between a PIECEWISE key's pieces, use those
                try:
                    self._priming = piecewise.prime_blas_workspaces(self.pool, self.stream)
                except RuntimeError as e:  # torch's CUDA errors
                    raise CaptureError(Problem(
                        field="capture", value="cuBLAS workspaces", limit=f"priming them in the graph pool failed: "
                        f"{e}", fix="check the GPU (nvidia-smi) and free memory, or use cudagraph_mode='NONE'")) from e
            phase_start = time.perf_counter()
            for i, key in enumerate(keys):
                if progress:
                    sys.stderr.write(f"\rgraphkv: {phase} {i + 1}/{len(keys)} {key}".ljust(80))
                    sys.stderr.flush()
                with contextlib.ExitStack() as stack:
                    enter_prepared(stack, prepare, key)
                    step(key)
                if on_key is not None:
                    on_key("warm-up" if step == self._warm_up else "capture", key)
            if not rehearse:
                torch.cuda.synchronize()  # the phase's device work is part of its time
            phase_seconds.append(time.perf_counter() - phase_start)
        return phase_seconds

    def _failed(self, key: GraphKey, what: str, error: Exception) -> CaptureError:
        if isinstance(error, (RuntimeError, AssertionError)):  # torch's errors; Inductor's size / stride checks
            limit = f"{what} failed: {error}"
            fix = ("keep host syncs (.item(), .cpu(), data-dependent shapes) out of the forward, or use "
                   "cudagraph_mode='NONE'")
        else:
            limit = f"{what} failed: the forward raised {type(error).__name__}: {shortened(str(error), 200)}"
            fix = (f"make the forward run on an all-padding step of {key.num_tokens} tokens, called with the static "
                   f"inputs {sorted(self.inputs.buffers)} as keyword arguments (the forward's exception is the cause)")
        return CaptureError(Problem(field="forward", value=str(key), limit=limit, fix=fix))

    def _warm_up(self, key: GraphKey) -> None:
        views = self.inputs.pad_all(key.num_tokens)
        try:  # torch's recipe: warm up on a side stream (here the capture stream) before capture
            with self._on_capture_stream():
                self.fn(**views)
        except GraphkvError:  # graphkv's own (a step context's refusal): already says what and why
            raise
        except Exception as e:  # the forward's own errors, torch's, Inductor's size / stride checks
            raise self._failed(key, "warm-up", e) from e

    @contextlib.contextmanager
    def _on_capture_stream(self) -> Any:
        """Run a warm-up, or a PIECEWISE capture's forward, on the capture stream (set by :meth:`capture`
        unless rehearsing): a PIECEWISE capture's pieces are captured there, and what runs between them
        (attention, state mixers, the replays right after capture) must not take the serving stream,
        whose lazy cuBLAS workspaces would land in the capture."""
        if self._rehearsed:
            yield
            return
        with piecewise.on_stream(self.stream):
            yield

    def _capture_key(self, key: GraphKey) -> None:
        mode = graph_mode(self.plan.cudagraph, key)
        if mode is CudaGraphMode.PIECEWISE and self._piecewise_missing:
            return
        views = self.inputs.pad_all(key.num_tokens)
        shape = key_shape(key, mode, max_num_seqs=self.plan.limits.max_num_seqs)
        try:
            if mode is CudaGraphMode.FULL:
                if self._rehearsed:
                    check_outputs(self.fn(**views), shape)
                    self._graphs[key] = _Captured(graph=None, outputs=None, rehearsed=True)
                    return
                graph, outputs = piecewise.capture_graph(lambda: self.fn(**views), self.pool, self.stream,
                                                         release_workspaces=False)  # primed: in the pool
                check_outputs(outputs, shape)
                # weak views: the outputs' blocks go back to the pool, so every key's outputs share them
                self._graphs[key] = _Captured(graph=graph, outputs=weak_outputs(outputs))
                return
            with piecewise.piecewise_capture(self.pool, rehearse=self._rehearsed, stream=self.stream,
                                             staging=self._staging, workspaces_in_pool=True) as scope, \
                    self._on_capture_stream():
                outputs = self.fn(**views)
        except GraphkvError:  # graphkv's own (outputs it cannot cut, a step context's refusal): said already
            raise
        except Exception as e:  # the forward's own errors, torch's, Inductor's size / stride checks
            raise self._failed(key, f"{mode.value} capture", e) from e
        self._num_piece_graphs += scope.num_captured
        if scope.num_captured or scope.num_replayed or scope.num_rehearsed:
            check_outputs(outputs, shape)
            self._graphs[key] = _Captured(graph=None, outputs=None, rehearsed=self._rehearsed)
        else:
            self._piecewise_missing = (
                "PIECEWISE mixed graphs not captured: the forward has no graphkv piecewise runners (compile it with "
                "torch.compile(fn, backend=graphkv.runtime.capture.piecewise.piecewise_backend()) before capture); mixed "
                "steps run eagerly")
            logger.warning("%s", self._piecewise_missing)

    def _eager(self, reason: str, level: int, num_tokens: int, inputs: Mapping[str, torch.Tensor], detail: str) -> Any:
        self._log_once(reason, level, detail)
        return self.fn(**self.inputs.eager_args(inputs, num_tokens))

    @torch.no_grad()
    def __call__(self, *, num_tokens: int, num_reqs: int, uniform: bool, **inputs: torch.Tensor) -> Any:
        """Run one step of ``num_tokens`` tokens from ``num_reqs`` requests (``uniform``: every
        request has ``1 + num_speculative_tokens`` query tokens), shaped by :meth:`shape_of`.

        ``inputs`` are the forward's named tensors with ``num_tokens`` entries on their token dim;
        an input left out is read from its static buffer as the caller filled it. Returns the
        forward's outputs with dim 0 sliced to ``num_tokens``; replayed outputs are shared
        graph-pool memory (overwritten by the next replay of any key) unless ``copy_outputs``. The step's metadata must
        have been filled for that shape (``Step.prepare(batch, forward=self)`` does). Raises
        :class:`CaptureError` for an impossible step (see :func:`~graphkv.runtime.capture.keys.dispatch`), an
        input with a static buffer that is not a tensor of its dtype with ``num_tokens`` rows (replayed or eager
        alike), and an input left out on a step larger than its buffer.
        """
        shape = self.shape_of(self._dispatch(num_tokens, num_reqs, uniform), num_tokens, num_reqs, uniform)
        with shape_context(shape):
            return self.run(shape, inputs=inputs)

    @torch.no_grad()
    def run(self, shape: StepShape, *, inputs: Mapping[str, torch.Tensor]) -> Any:
        """:meth:`__call__` for a step whose :class:`StepShape` is decided (``Step.run`` and
        ``Step.prepare(batch, forward=self)`` decide it once, from :meth:`shape_of`). A replayed
        (or rehearsed) shape must be a key of this forward, with that key's padded sizes (an eager one
        unpadded); ``inputs`` a mapping of tensors, each of its static buffer's dtype with ``num_tokens``
        rows on its token dim (on eager steps too): :class:`CaptureError` otherwise."""
        if type(shape) is not StepShape:
            raise CaptureError(Problem(field="shape", value=type(shape).__name__, limit="must be a StepShape",
                                       fix="decide it with this forward: Step.prepare(batch, forward=fwd) or "
                                           "fwd.shape_of(...)"))
        if type(inputs) is not dict and not isinstance(inputs, Mapping):
            raise CaptureError(Problem(field="inputs", value=type(inputs).__name__, limit="must be a mapping of "
                                       "input name -> tensor", fix="pass inputs={'input_ids': ids} (or {})"))
        self.inputs.check_names(inputs)
        num_tokens, key = shape.num_tokens, shape.key
        if key is None:
            check_eager_shape(shape)
            detail = f" (first at num_tokens={num_tokens}, num_reqs={shape.num_reqs}, uniform={shape.uniform})"
            reason = shape.eager_reason or "running eagerly"
            # The plan's own reasons (a size above the largest captured, a mode without such keys) are expected;
            # graphs that could exist but do not are worth a warning.
            warn = reason in (self.unavailable_reason, self._piecewise_missing, _NOT_CAPTURED)
            return self._eager(reason, logging.WARNING if warn else logging.INFO, num_tokens, inputs, detail)
        try:
            captured = self._graphs.get(key)
        except TypeError:  # an unhashable key
            captured = None
        if captured is None:
            raise CaptureError(Problem(field="shape.key", value=str(key),
                                       limit=f"this forward holds no graph of that key (it holds {len(self._graphs)})",
                                       fix="decide the shape with this forward: Step.prepare(batch, forward=fwd) or "
                                           "fwd.shape_of(...)"))
        check_fits_key(shape, key, self._shapes.max_num_seqs)
        self.inputs.stage(inputs, num_tokens, shape.num_tokens_padded)
        if captured.graph is not None:
            captured.graph.replay()
            outputs = captured.outputs
        else:  # PIECEWISE (the compiled forward's runners replay their pieces) or a rehearsal (eager, padded)
            outputs = self.fn(**self.inputs.views(shape.num_tokens_padded))
        outputs = tree_map(lambda t: cut_to_step(t, shape), outputs)
        return tree_map(torch.clone, outputs) if self.copy_outputs else outputs


def capture(plan: Plan, *, static_inputs: Mapping[str, torch.Tensor] | None = None,
            pad_values: Mapping[str, float] | None = None, token_dims: Mapping[str, int] | None = None,
            copy_outputs: bool = False, pool: Any = None,
            stream: Any = None) -> Callable[[Callable[..., Any]], CapturedForward]:
    """Wrap a forward for CUDA-graph capture under ``plan``: ``@capture(plan)`` or
    ``capture(plan, static_inputs=...)(model.forward)``; compile first, then capture.

    ``static_inputs``: persistent input buffers by forward argument name, token dim (dim 0, or
    ``token_dims[name]``) sized >= the largest capture size. ``pad_values``: value of padding rows
    per input (default 0, and -1 for names ending in ``slot_mapping``). ``pool``: a
    ``torch.cuda.graph_pool_handle()`` to share (default: a new one at capture). ``stream``: a
    ``torch.cuda.Stream`` to warm up and capture every key on (default: one side stream made at
    the first ``.capture()``, so that PyTorch allocates one more set of cuBLAS workspaces, 33 MiB on
    Hopper, not one per warm-up stream); ``.capture()`` allocates that set inside the graph pool
    before its first capture (:func:`~graphkv.runtime.capture.piecewise.prime_blas_workspaces`), so
    that no graph records a workspace a later release could free under it. Returns a
    :class:`CapturedForward`; call ``.capture()`` once the model is loaded. Raises
    :class:`CaptureError` for a ``plan`` that is not a :class:`Plan` (at once) and for what
    :class:`CapturedForward` refuses (when wrapping).
    """
    check_plan(plan)

    def wrap(fn: Callable[..., Any]) -> CapturedForward:
        return CapturedForward(fn, plan, static_inputs=static_inputs, pad_values=pad_values, token_dims=token_dims,
                               copy_outputs=copy_outputs, pool=pool, stream=stream)
    return wrap

