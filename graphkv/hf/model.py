"""A transformers causal LM running on graphkv's pool, step and (on a GPU) CUDA graphs.

:class:`PagedModel` builds the paged view of the model (:mod:`graphkv.hf.view`: its own embeddings,
norms, MLP / MoE, rotary embeddings and output head over its own weights, graphkv's attention and
mixers), binds every cache layer of the plan to the module that fills it, and exposes
``forward(input_ids [T]) -> logits``: the forward a :class:`~graphkv.runtime.step.Step` runs and
``graphkv.capture`` captures.
"""

from __future__ import annotations

import logging
import types
import uuid
from typing import Any, Callable

import attrs
import torch

from graphkv.command.compile_flag import check_compile, default_compile
from graphkv.errors import PlanError, Problem, SpecError
from graphkv.kernels.decode_splits import DEFAULT_NUM_SMS, decode_workspace
from graphkv.hf.attention import ATTN_IMPLEMENTATION, AttentionBinding, PagedStep, register
from graphkv.hf.declare import model_dtype
from graphkv.hf.layer_ops import LAYER_BUFFER, layer_id, paged_step_context
from graphkv.hf.layer_compile import compile_around_layers, compile_layers, layer_step_inputs
from graphkv.hf.layer_regions import region_layers, unmark_layers
from graphkv.hf.mixers import MIXERS
from graphkv.hf.mixers.base import PagedMixer
from graphkv.hf.model_checks import check_attention, check_split_option, decode_attention_choice, step_dependent_rope
from graphkv.hf.projections import MergedGroup, ProjectionSlice, needs_copy
from graphkv.hf.projections import merge_projections as merge_projections_of
from graphkv.hf.support import FamilySupport, family_of
from graphkv.hf.view import paged_view
from graphkv.runtime.capture.piecewise import PiecewiseBackend, piecewise_backend
from graphkv.runtime.capture.shape import current_shape
from graphkv.runtime.capture.size_guards import step_size_guard_filter
from graphkv.runtime.flex.region import FlexRegions, eager_regions_callable, fresh_function
from graphkv.runtime.flex.views import paged_kv_views
from graphkv.runtime.ops.choice import gpu_path, resolve_kernels
from graphkv.runtime.pool.allocate import KVPool
from graphkv.runtime.state.rows import PackedRows
from graphkv.runtime.step.context import current_context
from graphkv.spec.backends import CacheOrder
from graphkv.spec.layers import KVSharedSpec

__all__ = ["LOGITS_MODES", "PagedModel"]

LOGITS_MODES = ("last", "all")

logger = logging.getLogger(__name__)


def _layer_modules(model: torch.nn.Module, family: FamilySupport) -> dict[int, tuple[str, torch.nn.Module]]:
    """Every attention module and recurrent mixer of ``model`` by its ``layer_idx``: (kind, module)."""
    found: dict[int, tuple[str, torch.nn.Module]] = {}
    for module in model.modules():
        cls = type(module).__name__
        kind = "attention" if cls == family.attention else family.mixers.get(cls)
        if kind is None:
            continue
        index = getattr(module, "layer_idx", None)
        if not isinstance(index, int) or index in found:
            raise PlanError(Problem(field=f"{cls}.layer_idx", value=index,
                                    limit="each attention / mixer module needs its own integer layer_idx",
                                    fix="load the model with transformers' own classes"))
        found[index] = (kind, module)
    return found


class PagedModel(torch.nn.Module):
    """``model`` (a loaded transformers causal LM of a family in :data:`graphkv.hf.support.FAMILIES`)
    over ``pool`` (allocated from a plan of :func:`graphkv.hf.declare.model_kv` of the same model).

    ``forward(input_ids [T] int64) -> logits`` runs inside a step's forward context (``Step.run``).
    ``logits="last"`` (default) computes the output head only for the last token of each batch row —
    ``[num_reqs_padded, vocab]`` (a replayed step's graph key's padded requests, so a speculative decode key of
    ``R`` requests x ``1 + k`` tokens gives ``R`` rows; ``min(T, max_num_seqs)`` for an eager step), row ``i``
    for batch row ``i`` (rows past the step are unused) — as a server samples; ``"all"``: ``[T, vocab]``, every
    packed token. ``compile``: compile each attention group's flex
    attention once per phase (decode, mixed) as its own region
    (:class:`~graphkv.runtime.flex.region.FlexRegions`: the query's token count dynamic from the first call, no
    recompilation while serving; default: on a CUDA pool; on a CPU each region costs seconds once, then ~0.1-0.4
    ms per call instead of ~15-30 ms eager; on a CUDA pool the regions are compiled whatever ``compile`` says, see
    :func:`~graphkv.runtime.flex.region.region_compiled`); ``compile="model"``: compile the model's whole forward
    (embeddings, norms, MLPs, rotary, the paged attention and the head) as ``torch.compile`` of the module, the
    step's sizes symbolic from the first call (a CPU spends about a minute compiling a tiny model's few graphs);
    ``compile="piecewise"``: the whole forward traced once and split at the attention and state-mixer ops
    (:func:`~graphkv.runtime.capture.piecewise.piecewise_backend`), so that ``graphkv.capture`` captures mixed
    steps piece by piece (PIECEWISE keys) besides whole decode steps — the pieces run as traced, not fused by
    Inductor; the attention regions stay compiled; ``compile="fused"``: split as ``"piecewise"`` and each piece
    compiled by Inductor (:mod:`~graphkv.runtime.capture.fuse`: a layer's norms, rotary, activations and
    residual adds fused into a few kernels around its matmuls), so that FULL decode graphs and PIECEWISE mixed
    graphs launch fused kernels (a CPU spends seconds compiling each distinct piece; one trace serves every step
    size, 1-token steps included, see :func:`_mark_step_dynamic`).
    Either way the K/V write writes only the step's slots and a step's cost does not grow with the pool.
    ``kernels``: the K/V write's implementation (``"auto"``: Triton on CUDA, torch elsewhere; ``"triton"`` runs
    the GPU's kernel on a CPU, in Triton's interpreter). Attention sinks (gpt-oss) need the flex log-sum-exp,
    which torch 2.13's compiled CPU flex lacks: on a CPU their layers' regions run eager flex. Under
    ``compile="model"`` the attention layers and recurrent mixers are opaque ops (:mod:`graphkv.hf.layer_ops`),
    so the pool never enters the compiled graph and the attention runs the same compiled regions. On a GPU (and
    with ``kernels="triton"``) the MoE experts run transformers' ``batched_mm`` implementation (routing on the
    device, so a decode step can be captured). ``decode_attention``: ``"kernel"`` — a one-token decode step
    attends through graphkv's split-KV paged decode kernel (:mod:`graphkv.kernels.paged_attention`), reading the
    block tables directly, so no flex mask is built for it (its split partials go to a workspace allocated here,
    one per attention geometry) — or ``"flex"`` (every step through flex and its mask); default: the kernel on
    the GPU path (CUDA, or ``kernels="triton"``), flex elsewhere. ``merge_projections`` (with ``"piecewise"`` /
    ``"fused"`` only): each layer's q / k / v projections, and each gated MLP's gate / up projections, run as one
    matmul (:mod:`graphkv.hf.projections`): their weights are laid out end to end once, the model's parameters
    becoming views of them (same values; one group is copied at a time, and no memory is held beyond the model's
    own once the old tensors are freed). Otherwise the model's weights are used in
    place (no copy) and the model is not changed. ``small_matmul`` (with ``"piecewise"`` / ``"fused"`` only): the
    forward's matmuls of at most 8 tokens (decode steps of small batches) run graphkv's small-matmul kernel
    (:mod:`graphkv.kernels.small_matmul`), larger ones torch's (:mod:`graphkv.runtime.ops.small_linear_op`), where
    ``kernels`` resolves to Triton; with torch's kernels nothing is routed. Off by default until an H100 measures it
    faster than cuBLAS. ``trace_layers`` (with ``"piecewise"`` / ``"fused"`` only): the forward around the decoder
    layers runs eagerly and every layer calls one compiled layer function, so Dynamo traces and Inductor compiles
    one layer of each structure (:mod:`graphkv.hf.layer_compile`; torch before 2.12 traces every layer of a whole
    forward), at the cost of the fusion across layer boundaries and an eager embedding and head; off by default
    until an H100 measures its set-up and step time; :attr:`num_compiled_layers` counts the layers routed, and
    :attr:`num_compiled_around` the modules around them compiled each on its own (rotary tables, final norm).
    :attr:`piecewise` is the splitting backend under ``"piecewise"`` /
    ``"fused"`` (its splits, runners, ``num_fused``, ``num_compiles`` and ``num_deduped``), else ``None``.
    :attr:`size_guards` (compiled forwards: ``"model"``, ``"piecewise"``, ``"fused"``) is the guard filter that lets
    one trace serve every step size (:mod:`graphkv.runtime.capture.size_guards`); its ``kept`` lists the shape guards
    it kept, each of which traces the forward again for a step outside it.
    :attr:`step_dependent_rope`: the rope type (``"dynamic"``, ``"longrope"``) of a model whose rotary frequencies
    transformers picks per forward call from its longest position, else ``None``; a step is one call, so a
    request's logits then follow the longest request of its step (logged as a warning at set-up).
    """

    def __init__(self, model: torch.nn.Module, pool: KVPool, *, logits: str = "last",
                 compile: bool | str | None = None, kernels: str = "auto",  # noqa: A002 - the torch verb
                 decode_attention: str | None = None, merge_projections: bool = False,
                 small_matmul: bool = False, trace_layers: bool = False) -> None:
        super().__init__()
        family = family_of(model)
        if logits not in LOGITS_MODES:
            raise SpecError(Problem(field="logits", value=logits, limit=f"must be one of {', '.join(LOGITS_MODES)}",
                                    fix="'last' for serving (one row per request), 'all' to check every token"))
        plan = pool.plan
        self.plan, self.pool, self.logits = plan, pool, logits
        device = next(model.parameters()).device
        if (device.type, device.index or 0) != (pool.device.type, pool.device.index or 0):
            raise SpecError(Problem(field="device", value=str(pool.device),
                                    limit=f"the pool must live where the model's weights are ({device})",
                                    fix=f"allocate the pool on {device}, or move the model"))
        if check_compile(compile) is None:
            compile = default_compile(pool.device.type)
        check_split_option("merge_projections", merge_projections, compile,
                            does="True to run each q/k/v and gate/up group as one matmul",
                            why=": run eagerly, each projection of a group would compute the group's whole matmul")
        check_split_option("small_matmul", small_matmul, compile,
                            does="True to run few-token steps' matmuls through graphkv's kernel",
                            why=" (it routes the traced forward's matmuls)")
        check_split_option("trace_layers", trace_layers, compile,
                           does="True to trace and compile one decoder layer of each structure for every layer",
                           why=" (it splits each compiled layer)")
        self.kernels = resolve_kernels(kernels, pool.device)
        self.decode_attention = decode_attention_choice(decode_attention, self.kernels, pool.device)
        num_sms = (torch.cuda.get_device_properties(pool.device).multi_processor_count
                   if pool.device.type == "cuda" else DEFAULT_NUM_SMS)
        workspaces: dict[tuple[int, ...], torch.Tensor] = {}  # one per decode geometry, shared by its layers
        modules = _layer_modules(model, family)
        # One compiled region per group and phase, under compile="model" too: there the attention layers
        # are opaque ops (graphkv::attention) that run the regions (on a GPU compiled under compile=False too).
        self.regions = FlexRegions(compile=bool(compile), name=f"{family.model_type}_flex")
        self.attention: dict[int, AttentionBinding] = {}
        replace: dict[torch.nn.Module, Callable[[torch.nn.Module], torch.nn.Module]] = {}  # the mixers, then slices
        named: dict[torch.nn.Module, Callable[[torch.nn.Module], torch.nn.Module]] = {}  # attention: layer ids
        for decl in plan.layers:
            kind, module = self._module_for(decl, modules)
            group = plan.group_of(decl.index).index
            if kind == "attention":
                check_attention(decl, module, family)
                assert pool.layout(decl.name).order is CacheOrder.KV_FIRST, "the flex backend's layout is kv-first"
                cache = pool.kv_cache(decl.name)
                key, value = paged_kv_views(cache)
                workspace = None
                if self.decode_attention == "kernel":
                    geometry = (_num_query_heads(module, cache), cache.shape[-2], cache.shape[-1],
                                plan.groups[group].block_table_width, plan.groups[group].kernel_block_size)
                    if geometry not in workspaces:
                        workspaces[geometry] = decode_workspace(
                            plan.limits.max_num_seqs, num_q_heads=geometry[0], num_kv_heads=geometry[1],
                            head_size=geometry[2], table_width_kernel_blocks=geometry[3],
                            kernel_block_size=geometry[4], device=pool.device, num_sms=num_sms)
                    workspace = workspaces[geometry]
                named[module] = lambda twin, index=decl.index: _named_layer(twin, index)
                self.attention[decl.index] = AttentionBinding(
                    name=decl.name, group=group, cache=cache, layout=pool.layout(decl.name), key=key, value=value,
                    window=getattr(decl.spec, "window", None), softcap=family.softcap(module), workspace=workspace,
                    num_sms=num_sms, checks_window=not family.passes_unapplied_window)
            else:
                states = pool.mamba_states(decl.name)
                replace[module] = (lambda twin, cls=MIXERS[kind], name=decl.name, states=states, group=group,
                                   layer=decl.index: cls(twin, name=name, states=states, group=group, layer=layer))
        shared = self._bind_shared(plan, modules, family, named)
        unplanned = sorted(set(modules) - {decl.index for decl in plan.layers} - shared)
        if unplanned:
            raise PlanError(Problem(field="pool.plan", value=plan.model_name,
                                    limit=f"has no cache layer for the model's layers {unplanned}",
                                    fix="allocate the pool from graphkv.hf.model_kv(model) of this same model"))
        self.has_state_layers = bool(replace)
        model_dtype(model)  # refuses weights of several floating dtypes (the cache takes one), before any change
        self.step_dependent_rope = step_dependent_rope(model)
        if self.step_dependent_rope is not None:
            logger.warning("graphkv.hf: %s's rotary embedding is %r: transformers picks its frequencies from the "
                           "longest position of each forward call, and a step packs every request into one call, so "
                           "a request's logits follow the longest request of its step (as in transformers' batched "
                           "generate and vLLM's batches), not its own length", type(model).__name__,
                           self.step_dependent_rope)
        served = model.__dict__.get(_SERVED, frozenset())
        if (merge_projections and needs_copy(model, exclude=tuple(replace))
                and any(p.data_ptr() in served for p in model.parameters())):
            raise SpecError(Problem(
                field="merge_projections", value=True,
                limit="this model is already served by a PagedModel (a ServingLoop) without merged projections, "
                      "whose CUDA graphs (if it captured any) read its q/k/v and gate/up weights where they are; "
                      "merging moves them",
                fix="pass merge_projections=True to the first ServingLoop / PagedModel over this model (later ones "
                    "may then merge or not), or load the model anew"))
        self.merged: tuple[MergedGroup, ...] = (merge_projections_of(model, exclude=tuple(replace))
                                                if merge_projections else ())
        for group in self.merged:  # the view's projections: the group's one matmul, then their own columns
            for i, linear in enumerate(group.linears):
                replace[linear] = lambda twin, group=group, i=i: ProjectionSlice(group, i)
        register()
        # transformers' default MoE loop picks the experts a step hits on the host (a sync no CUDA
        # graph can hold); its batched_mm implementation routes on the device.
        self.view = paged_view(model, attn_implementation=ATTN_IMPLEMENTATION, replace={**named, **replace},
                               experts_implementation="batched_mm" if gpu_path(self.kernels, pool.device) else None)
        self.mixers = {m.layer: m for m in self.view.modules() if isinstance(m, PagedMixer)}
        # the weights' addresses, which CUDA graphs captured over this model may now read (a copy of the model has
        # its own, and may merge)
        model.__dict__[_SERVED] = served | {p.data_ptr() for p in model.parameters()}
        # The whole forward compiled as a fresh copy of its code: torch.compile keeps its entries and the
        # recompile limit (8) per code object, and every transformers model shares its forward's (decorated)
        # code, so a process's fourth PagedModel would otherwise run uncompiled, its PIECEWISE keys uncaptured.
        self._call: Callable[..., Any] = self.view.__call__  # (a bound method: not registered as a submodule)
        self.piecewise: PiecewiseBackend | None = None  # compile="piecewise" / "fused": the splitting backend
        self._whole = compile in ("model", "piecewise", "fused")  # the whole forward is compiled
        self._model_type = family.model_type
        self._regions_callable = eager_regions_callable(pool.device.type)  # around each call of a compiled forward
        # piecewise / fused: each decoder layer a nested compile region, traced once per structure (torch >= 2.12)
        self.trace_layers = trace_layers  # each decoder layer through one compiled layer function (layer_compile)
        self.num_compiled_layers = 0  # decoder layers routed through it
        self.num_compiled_around = 0  # modules around them compiled on their own (rotary tables, final norm)
        self.num_layer_regions = region_layers(self.view) if compile in ("piecewise", "fused") and not trace_layers \
            else 0
        if compile in ("model", "piecewise", "fused"):
            # piecewise / fused: PIECEWISE mixed graphs, the pieces between these ops are captured. forward marks
            # the step's dimensions dynamic (dynamic=True would make every size symbolic, host-side values too).
            self.piecewise = (piecewise_backend(PIECEWISE_SPLITTING_OPS, fuse=compile == "fused",
                                                small_matmul_kernels=self.kernels if small_matmul else None)
                              if compile != "model" else None)
            self._call = self._compiled_forward()

    def _compiled_forward(self) -> Callable[..., Any]:
        """The view's forward compiled whole (``compile="model"``: by Inductor; else by the piecewise backend), as
        a fresh copy of its code; with ``trace_layers``, the view's forward itself, its decoder layers routed through
        one compiled layer function (:func:`~graphkv.hf.layer_compile.compile_layers`)."""
        limits = self.plan.limits
        if self.trace_layers:  # the forward eager, every decoder layer through one compiled function
            inputs = layer_step_inputs(self.view)
            self.size_guards = step_size_guard_filter(inputs, step_sized=inputs, max_step=limits.max_num_batched_tokens)
            name = f"graphkv_{self._model_type}_{uuid.uuid4().hex[:12]}"
            self.num_compiled_layers = compile_layers(self.view, self.piecewise, options={
                "guard_filter_fn": self.size_guards}, name=f"{name}_layer")
            self.num_compiled_around = compile_around_layers(self.view, self.piecewise, options={
                "guard_filter_fn": self.size_guards}, name=f"{name}_around")
            return self.view.__call__
        name = f"graphkv_{self._model_type}_forward_{uuid.uuid4().hex[:12]}"
        fresh = types.MethodType(fresh_function(type(self.view).forward, name), self.view)
        # one trace for every step size: the shape guard 0/1 specialisation alone wrote is dropped (size_guards)
        # (a GPU's Triton kernels add 32-bit indexing bounds on the step's sizes: dropped where the largest step the
        # plan admits holds them; .kept: the shape guards kept, each a retrace)
        self.size_guards = step_size_guard_filter(STEP_SIZE_INPUTS, step_sized=STEP_SIZED_INPUTS,
                                                  max_step=max(limits.max_num_batched_tokens, limits.max_num_seqs))
        options = {"guard_filter_fn": self.size_guards}
        return (torch.compile(fresh, options=options) if self.piecewise is None
                else torch.compile(fresh, backend=self.piecewise, options=options))

    def _call_compiled(self, **kwargs: Any) -> Any:
        """The compiled forward of ``kwargs``. Where Dynamo failed the forward's first trace with its layers as
        nested compile regions (a layer a region cannot hold), the layers are unmarked and the forward compiled
        again without them (each layer traced on its own, as on torch before 2.12), logged once; the same failure
        without regions is raised. A later failure (a recompile refused, an error in a step) is raised as it is."""
        # regions are marked only with the piecewise backend, whose splits are the traces it received: after the
        # first (not a call Dynamo ran eagerly), the fallback's window is over
        if not self.num_layer_regions or self.piecewise.splits:
            return self._call(**kwargs)
        try:
            out = self._call(**kwargs)
        except _REGION_FAILURES as error:
            # Dynamo failed the trace before the frame ran anything: running the step again repeats nothing
            unmark_layers(self.view)
            self.num_layer_regions = 0
            self._call = self._compiled_forward()
            out = self._call(**kwargs)  # failing again, it was not the regions: that error is raised
            lines = str(error).strip().splitlines()
            logger.warning("graphkv.hf: tracing %s's layers as nested compile regions failed (%s: %s); traced layer "
                           "by layer instead", self._model_type, type(error).__name__, lines[0][:300] if lines else "")
        return out

    def _bind_shared(self, plan: Any, modules: dict[int, tuple[str, torch.nn.Module]], family: FamilySupport,
                     named: dict[torch.nn.Module, Callable[[torch.nn.Module], torch.nn.Module]]) -> set[int]:
        """Bind each KV-shared attention layer of ``plan`` (Gemma-4's last ``num_kv_shared_layers``: a
        :class:`~graphkv.spec.layers.KVSharedSpec`, no cache of its own) to the binding of the layer whose cache it
        reads, its window checked against that layer's; returns their layer indices. The module is handed that
        layer's K and V of the step (transformers' ``shared_kv_states``), so its K/V write rewrites the same values
        into the same slots, and it attends over the same pages."""
        by_name = {decl.name: decl for decl in plan.layers}
        bound: set[int] = set()
        for decl in plan.cacheless:
            if not isinstance(decl.spec, KVSharedSpec):
                continue
            _, module = self._module_for(decl, modules)
            source = by_name[decl.spec.source]
            check_attention(attrs.evolve(source, index=decl.index, name=decl.name), module, family)
            named[module] = lambda twin, index=decl.index: _named_layer(twin, index)
            self.attention[decl.index] = attrs.evolve(self.attention[source.index], softcap=family.softcap(module))
            bound.add(decl.index)
        return bound

    def _module_for(self, decl: Any, modules: dict[int, tuple[str, torch.nn.Module]]) -> tuple[str, torch.nn.Module]:
        wanted = "state" if decl.spec.is_ssm else "attention"
        kind, module = modules.get(decl.index, (None, None))
        if module is None or (kind == "attention") != (wanted == "attention"):
            raise PlanError(Problem(
                field=f"plan layer {decl.name}", value=decl.spec.describe(),
                limit=f"the model has no {wanted} module with layer_idx={decl.index}"
                      + (f" (found {type(module).__name__})" if module is not None else ""),
                fix="allocate the pool from graphkv.hf.model_kv(model) of this same model"))
        return kind, module

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits of the step's packed tokens (see the class docstring for the rows). Runs inside a
        step's forward context; builds the flex masks once (inside a captured graph the replay
        rebuilds them). Capture-safe."""
        num_tokens = input_ids.shape[0]
        if num_tokens > self.plan.limits.max_num_batched_tokens:  # the bound the compiled forward's guards rely on
            raise SpecError(Problem(field="input_ids", value=f"{num_tokens} tokens",
                                    limit=f"the plan's max_num_batched_tokens={self.plan.limits.max_num_batched_tokens}",
                                    fix="run steps from a Step of this model's plan (it splits longer batches)"))
        ctx = current_context()
        shape = current_shape()
        decode = shape is not None and shape.uniform
        # A one-token decode step on the decode kernel reads the block tables directly: no mask to build.
        decode_kernel = (decode and self.decode_attention == "kernel"
                         and num_tokens == shape.num_tokens_padded == shape.num_reqs_padded)
        if not decode_kernel:
            ctx.build_masks(num_tokens)  # into the builders' buffers, which the attention regions read
        step = PagedStep(context=ctx, attention=self.attention,
                         mixers=self.mixers,
                         rows=PackedRows.from_context(ctx, num_tokens) if self.has_state_layers else None,
                         regions=self.regions, kernels=self.kernels,
                         phase="decode" if decode else "mixed", decode_kernel=decode_kernel)
        keep: int | torch.Tensor = 0
        if self.logits == "last":
            # one row per padded request of a graph key (a speculative decode key holds fewer requests than
            # tokens); an eager step keeps min(tokens, max_num_seqs) rows, so that a first eager step of one
            # request does not make the compiled forward's row count 1 (a static size: a second trace later)
            num_reqs_padded = (shape.num_reqs_padded if shape is not None and shape.key is not None
                               else min(num_tokens, self.plan.limits.max_num_seqs))
            keep = (ctx.query_start_loc[1:num_reqs_padded + 1].long() - 1).clamp(min=0)
        ids, positions = input_ids[None], ctx.positions[:num_tokens][None]
        if self._whole and not self.trace_layers:  # one trace for every step size (see _mark_step_dynamic)
            for t, dim in ((ids, 1), (positions, 1), (keep, 0)):
                if isinstance(t, torch.Tensor):
                    _mark_step_dynamic(t, dim)
        with paged_step_context(step):
            if self._whole:  # the layer ops read the step from the context: no step object enters the trace
                with self._regions_callable:
                    out = self._call_compiled(input_ids=ids, position_ids=positions, use_cache=False,
                                              logits_to_keep=keep)
            else:
                out = self._call(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=keep,
                                 graphkv=step)
        return out.logits[0]


def _named_layer(module: torch.nn.Module, index: int) -> torch.nn.Module:
    """``module`` (the paged view's copy of a planned attention module) with its layer's
    :func:`~graphkv.hf.layer_ops.layer_id` as a buffer, which the compiled forward passes to the attention op."""
    module.register_buffer(LAYER_BUFFER, layer_id(index), persistent=False)
    return module


_REGION_FAILURES = (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UncapturedHigherOrderOpError,
                    torch._dynamo.exc.InternalTorchDynamoError)
"""How Dynamo fails a trace it cannot finish (not a refused recompile, not a backend's failure): what the layer
regions' fallback catches."""

_SERVED = "_graphkv_served"  # on a model a PagedModel wraps: its weights' addresses, which a later merge would move


def _mark_step_dynamic(tensor: torch.Tensor, dim: int) -> None:
    """Make ``tensor``'s ``dim`` (the step's tokens, or its logits rows) a dynamic size of the whole-forward trace: a
    backed size, which Inductor sizes its kernels by. Dynamo specialises it at 1; the compiled forward drops the shape
    guard that specialisation writes (:mod:`graphkv.runtime.capture.size_guards`), so 1-token steps (batch-1 decode,
    a one-token chunk) run the trace of 2 tokens or more instead of a second trace of their own (tiny Qwen3, 16 layers,
    fused, 2-core CPU: Dynamo's second trace took 6-7 s). From 2026-11-26 (sixth session) these sizes were unbacked,
    to trace once, but Inductor knows nothing of an unbacked size: on an H100 the fused 0.94B model's decode step
    launched 433 kernels and took 1.547 ms at batch 1 (2.157 ms at 32), against 291 kernels and 1.359 ms (2.065 ms)
    with backed sizes. ``backed_size_oblivious`` (one backed trace that is not specialised at 1) still traced twice:
    Inductor's compile cache adds a ``size >= 2`` guard, which the guard filter drops with the rest of that guard."""
    torch._dynamo.maybe_mark_dynamic(tensor, dim)


STEP_SIZE_INPUTS = ("input_ids", "position_ids")
"""The compiled forward's inputs built together for a step (one length, contiguous): the equalities of their sizes and
strides in the shape guard hold by construction, so the guard may be dropped (``step_size_guard_filter``)."""
STEP_SIZED_INPUTS = ("input_ids", "position_ids", "logits_to_keep")
"""The compiled forward's inputs sized by the step (its tokens, or its logits rows): never larger than the plan's
``max_num_batched_tokens`` (tokens) or ``max_num_seqs`` (rows), which bound the upper-bound guards the filter drops."""
PIECEWISE_SPLITTING_OPS = ("graphkv::attention", "graphkv::state_mixer")
"""Where ``compile="piecewise"`` cuts the forward: attention and recurrent mixers run between the
captured pieces (their work depends on the step's batch)."""


def _num_query_heads(module: torch.nn.Module, cache: torch.Tensor) -> int:
    """Query heads of an attention module (its config's ``num_attention_heads``; the cache's KV heads
    times the module's ``num_key_value_groups`` where a family names them so)."""
    groups = getattr(module, "num_key_value_groups", None)
    if isinstance(groups, int) and groups > 0:
        return cache.shape[-2] * groups
    return int(module.config.num_attention_heads)
