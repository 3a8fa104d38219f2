"""The serving-loop object for stacks that schedule themselves: plan, pool, Step, captured forward."""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch

from graphkv.errors import Problem, SpecError
from graphkv.hf.declare import flex_q_tile_for, model_kv
from graphkv.hf.model import PagedModel
from graphkv.hf.support import family_of, vocab_size_of
from graphkv.models.demo_engine import DemoEngine
from graphkv.memory.available import check_pool_fits
from graphkv.plan.compile import compile_plan
from graphkv.runtime.capture.graphs import CaptureReport, capture
from graphkv.runtime.device import resolve_device
from graphkv.runtime.ops.choice import rehearses, resolve_kernels
from graphkv.runtime.pool.allocate import allocate
from graphkv.runtime.step.batch import Batch
from graphkv.runtime.step.step import Step
from graphkv.spec.budget import Budget, format_bytes
from graphkv.spec.limits import Limits

__all__ = ["ServingLoop"]


class ServingLoop:
    """A transformers causal LM planned, allocated and wrapped for serving on graphkv.

    Built from a loaded model: the cache layers are read from ``model.config``
    (:func:`~graphkv.hf.declare.model_kv`, with the flex query tile of
    :func:`~graphkv.hf.declare.flex_q_tile_for`), the plan is compiled for ``limits`` and ``budget``
    before anything is allocated, the pool and the :class:`~graphkv.runtime.step.Step` buffers
    are allocated on ``device`` (default: where the weights are), and the model's forward
    (:class:`~graphkv.hf.model.PagedModel`) is wrapped by ``graphkv.capture``. ``capture_graphs``
    captures CUDA graphs on a GPU (steps the plan allows replay, others run eagerly); on a CPU
    nothing is captured and :attr:`capture_report` says so — every step runs eagerly.
    ``kernels="triton"`` runs the GPU path on a CPU: the Triton kernels (in Triton's interpreter),
    the staged table sync, the GPU's flex query tile and, instead of a capture, a rehearsal (every
    capture key warmed up, every step dispatched and padded as a replay would be, run eagerly).
    ``decode_attention``: ``"kernel"`` (graphkv's split-KV paged decode kernel for one-token decode
    steps; the default on the GPU path), ``"flex"`` (flex attention and its mask for every step).
    ``merge_projections`` (with ``compile="piecewise"`` / ``"fused"``): each q / k / v and gate / up group runs as
    one matmul, its weights laid out end to end in the model (:class:`~graphkv.hf.model.PagedModel`).
    ``small_matmul`` (same compile modes): steps of at most 8 tokens multiply through graphkv's small-matmul kernel.
    ``trace_layers`` (same compile modes): trace and compile one decoder layer of each structure for every layer, the
    forward around them eager (:mod:`graphkv.hf.layer_compile`): a shorter set-up on torch before 2.12.
    ``progress``: write the capture's progress to stderr (each key warmed up, then captured: on a GPU the first
    warm-up traces and compiles the forward, tens of seconds for a 1B model), and what it did at the end.

    Attributes: :attr:`plan`, :attr:`pool`, :attr:`step` (the Step: :class:`Batch` in, buffers
    filled, ownership checked), :attr:`model` (the paged model), :attr:`forward` (the captured
    forward). A stack that schedules itself calls :meth:`run` per step; :meth:`engine` gives the
    built-in continuous-batching loop.

    Example::

        loop = ServingLoop(model, limits=graphkv.Limits(max_model_len=512, max_num_seqs=8,
                           max_num_batched_tokens=64), budget=graphkv.Budget.kv_bytes("8MiB"))
        logits = loop.run(Batch(req_ids=("a",), query_lens=(5,), seq_lens=(5,),
                                new_pages=(((1,),),)), input_ids=[1, 2, 3, 4, 5])
        next_token = int(logits[0].argmax())   # logits="last": row i is batch row i
    """

    def __init__(self, model: torch.nn.Module, *, limits: Limits, budget: Budget | None,
                 device: "str | torch.device | None" = None, logits: str = "last", compile: bool | str | None = None,
                 capture_graphs: bool = True, mamba_ssm_dtype: str | None = None,
                 kernels: str = "auto", decode_attention: str | None = None,  # noqa: A002
                 merge_projections: bool = False, small_matmul: bool = False, progress: bool = False,
                 trace_layers: bool = False) -> None:
        family_of(model)  # a transformers causal LM graphkv runs, before reading its weights
        for name, flag in (("capture_graphs", capture_graphs), ("progress", progress)):
            if not isinstance(flag, bool):  # "no" is truthy: it would capture
                raise SpecError(Problem(field=name, value=flag, limit="must be a bool",
                                        fix="pass True or False" + (" (True captures the plan's CUDA graphs, or "
                                                                    "rehearses them on a CPU)" if name == "capture_graphs"
                                                                    else "")))
        self.vocab_size = vocab_size_of(model)  # token ids the model embeds: run() refuses others
        self.device = resolve_device(device if device is not None else next(model.parameters()).device)
        self.kernels = resolve_kernels(kernels, self.device)
        self.model_kv = model_kv(model, mamba_ssm_dtype=mamba_ssm_dtype,
                                 flex_q_tile_tokens=flex_q_tile_for(self.device, self.kernels))
        if not isinstance(limits, Limits):  # compile_plan takes None for Limits(): here the limits are the user's
            raise SpecError(Problem(field="limits", value=type(limits).__name__, limit="must be a graphkv.Limits",
                                    fix="pass e.g. limits=graphkv.Limits(max_model_len=4096, max_num_seqs=8)"))
        self.plan = compile_plan(self.model_kv, limits, budget)
        check_pool_fits(self.plan, self.device, field="budget", value=format_bytes(self.plan.pool_bytes),
                        fix=" (or pass limits.num_blocks_override)")  # before anything is allocated
        self.pool = allocate(self.plan, self.device)
        self.step = Step(self.plan, self.device, kernels=self.kernels)
        self._engines: weakref.WeakSet[DemoEngine] = weakref.WeakSet()  # engine() made them: finish() asks them
        self.model = PagedModel(model, self.pool, logits=logits, compile=compile, kernels=self.kernels,
                                decode_attention=decode_attention, merge_projections=merge_projections,
                                small_matmul=small_matmul, trace_layers=trace_layers)
        self.forward = capture(self.plan, static_inputs={"input_ids": self.step.input_ids})(self.model.forward)
        self.capture_report: CaptureReport | None = None
        if capture_graphs:
            self.capture_report = self.forward.capture(progress=progress, prepare=self.step.capture_context,
                                                       rehearse=rehearses(self.kernels, self.device))

    @property
    def graphs(self) -> str:
        """What capture did (graphs captured, or why every step runs eagerly)."""
        if self.capture_report is None:
            return "capture disabled; every step runs eagerly"
        return str(self.capture_report)

    def run(self, batch: Batch, *, input_ids: "torch.Tensor | Sequence[int]") -> Any:
        """One step: :meth:`Step.run` of the captured forward (replayed or eager). Returns the
        logits (see :class:`PagedModel` for the rows); raises as :meth:`Step.run` does, and
        :class:`SpecError` for a host token id (a list, a numpy array, a CPU tensor) outside
        ``[0, vocab_size)`` (naming its request and position) before changing anything — an embedding
        would read a negative id as another token. Ids already on the device (tokens the model
        sampled) are not checked, which would cost a host sync every step: keeping them in range is
        the caller's part."""
        on_device = isinstance(input_ids, torch.Tensor) and input_ids.device.type != "cpu"
        return self.step.run(self.forward, batch, input_ids=input_ids,
                             vocab_size=None if on_device else self.vocab_size)

    def finish(self, req_id: Any) -> None:
        """The request left: its Step row is free and its pages are the caller's again. :class:`SpecError` for a
        request an engine of this loop (:meth:`engine`) runs or queues: the engine would keep its pages and
        refuse every later step; stop it with ``engine.abort(req_id)``."""
        for engine in list(self._engines):
            if engine.holds(req_id):
                raise SpecError(Problem(field="req_id", value=req_id,
                                        limit="is a request of this loop's engine (ServingLoop.engine()), which "
                                              "hands out its pages and would go on holding them",
                                        fix=f"stop it with engine.abort({req_id!r}) (it returns its tokens so far)"))
        self.step.finish(req_id)

    def engine(self, *, record: bool = False, overlap: bool = True) -> DemoEngine:
        """graphkv's continuous-batching loop (FIFO, chunked prefill, pages admitted as the pool
        allows, greedy) over this loop's step and forward. ``overlap``: launch each decode step
        from the last step's tokens on the device before the host reads them (see
        :meth:`DemoEngine.step`); ``False`` reads every step's tokens before the next is scheduled."""
        engine = DemoEngine(self.plan, self.step, self.forward, record=record, overlap=overlap,
                            logits_per_request=self.model.logits == "last", vocab_size=self.vocab_size)
        self._engines.add(engine)
        return engine
