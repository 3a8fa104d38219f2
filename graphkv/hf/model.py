"""A transformers causal LM running on graphkv's pool, step and (on a GPU) CUDA graphs.

:class:`PagedModel` builds the paged view of the model (:mod:`graphkv.hf.view`: its own embeddings,
norms, MLP / MoE, rotary embeddings and output head over its own weights, graphkv's attention and
mixers), binds every cache layer of the plan to the module that fills it, and exposes
``forward(input_ids [T]) -> logits``: the forward a :class:`~graphkv.runtime.step.Step` runs and
``graphkv.capture`` captures.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from graphkv.errors import PlanError, Problem, SpecError
from graphkv.hf.attention import ATTN_IMPLEMENTATION, AttentionBinding, PagedStep, register
from graphkv.hf.declare import model_dtype
from graphkv.hf.mixers import MIXERS
from graphkv.hf.support import FamilySupport, family_of
from graphkv.hf.view import paged_view
from graphkv.runtime.flex.write_attend import write_and_attend
from graphkv.runtime.pool.allocate import KVPool
from graphkv.runtime.state.rows import PackedRows
from graphkv.runtime.step.context import current_context
from graphkv.spec.backends import CacheOrder

__all__ = ["LOGITS_MODES", "PagedModel"]

LOGITS_MODES = ("last", "all")


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
    ``logits="last"`` (default) computes the output head only for the last token of each batch
    row — ``[min(T, max_num_seqs), vocab]``, row ``i`` for batch row ``i`` (rows past the step are
    unused) — as a server samples; ``"all"``: ``[T, vocab]``, every packed token. ``compile``:
    compile each layer's K/V write and flex attention as one ``torch.compile`` call (default: on a
    CUDA pool; on a CPU it costs ~5-25 s once, then ~0.1-0.4 ms per call instead of ~15-30 ms
    eager); ``compile="model"``: compile the model's whole forward (embeddings, norms, MLPs,
    rotary, the paged attention and the head) as ``torch.compile`` of the module, with automatic
    dynamic shapes (a CPU spends about a minute compiling a tiny model's few graphs). Attention sinks (gpt-oss) need
    the flex log-sum-exp, which torch 2.13's compiled CPU flex lacks: ``compile=True`` on a CPU is
    refused for them. On a GPU the MoE experts run transformers' ``batched_mm`` implementation
    (routing on the device, so a decode step can be captured; not yet run on a GPU here). The
    model's weights are used in place (no copy) and the model is not changed.
    """

    def __init__(self, model: torch.nn.Module, pool: KVPool, *, logits: str = "last",
                 compile: bool | str | None = None) -> None:  # noqa: A002 - the torch verb
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
        if compile is None:
            compile = pool.device.type == "cuda"
        if compile not in (True, False, "model"):
            raise SpecError(Problem(field="compile", value=compile, limit="must be True, False, None or 'model'",
                                    fix="True compiles each layer's attention, 'model' the whole forward, None "
                                        "picks True on a GPU"))
        modules = _layer_modules(model, family)
        has_sinks = any(getattr(m, "sinks", None) is not None for kind, m in modules.values() if kind == "attention")
        if compile and has_sinks and pool.device.type == "cpu":
            raise SpecError(Problem(field="compile", value=True,
                                    limit=f"{family.model_type}'s attention sinks need flex attention's log-sum-exp, "
                                          "which torch 2.13's compiled flex does not return on a CPU",
                                    fix="use compile=False on a CPU (eager flex), or run on a GPU"))
        # Automatic dynamic shapes: the first step compiles for its token count, the next one with
        # the token count symbolic (dynamic=True would also make the block table's rows symbolic,
        # which torch 2.13's CPU flex template miscompiles when max_num_seqs is 1).
        attend: Callable[..., Any] = torch.compile(write_and_attend, fullgraph=True) if compile is True \
            else write_and_attend  # under compile="model" the module's compile traces it with the rest
        self.attention: dict[int, AttentionBinding] = {}
        replace: dict[torch.nn.Module, Callable[[torch.nn.Module], torch.nn.Module]] = {}
        for decl in plan.layers:
            kind, module = self._module_for(decl, modules)
            group = plan.group_of(decl.index).index
            if kind == "attention":
                self._check_attention(decl, module, family)
                assert pool.layout(decl.name).order is CacheOrder.KV_FIRST, "the flex backend's layout is kv-first"
                self.attention[decl.index] = AttentionBinding(name=decl.name, group=group,
                                                              cache=pool.kv_cache(decl.name), attend=attend)
            else:
                states = pool.mamba_states(decl.name)
                replace[module] = (lambda twin, cls=MIXERS[kind], name=decl.name, states=states, group=group:
                                   cls(twin, name=name, states=states, group=group))
        unplanned = sorted(set(modules) - {decl.index for decl in plan.layers})
        if unplanned:
            raise PlanError(Problem(field="pool.plan", value=plan.model_name,
                                    limit=f"has no cache layer for the model's layers {unplanned}",
                                    fix="allocate the pool from graphkv.hf.model_kv(model) of this same model"))
        self.has_state_layers = bool(replace)
        register()
        # transformers' default MoE loop picks the experts a step hits on the host (a sync no CUDA
        # graph can hold); its batched_mm implementation routes on the device.
        self.view = paged_view(model, attn_implementation=ATTN_IMPLEMENTATION, replace=replace,
                               experts_implementation="batched_mm" if pool.device.type == "cuda" else None)
        if compile == "model":
            self.view = torch.compile(self.view)
        model_dtype(model)  # refuses weights of several floating dtypes (the cache takes one)

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

    @staticmethod
    def _check_attention(decl: Any, module: torch.nn.Module, family: FamilySupport) -> None:
        """Refuse an attention module graphkv's causal block masks would get wrong."""
        if not getattr(module, "is_causal", True):
            raise SpecError(Problem(field=f"{type(module).__name__} ({decl.name}).is_causal", value=False,
                                    limit="graphkv.hf runs causal (decoder) attention; this layer attends both ways "
                                          "(e.g. config.use_bidirectional_attention=True)",
                                    fix="use the model as a decoder, or run it with transformers directly"))
        planned = getattr(decl.spec, "window", None)
        own = family.sliding_window(module)
        if planned != own:
            raise PlanError(Problem(field=f"plan layer {decl.name}.window", value=planned,
                                    limit=f"the model's {type(module).__name__} slides over {own} tokens",
                                    fix="plan from graphkv.hf.model_kv(model) of this same model"))

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits of the step's packed tokens (see the class docstring for the rows). Runs inside a
        step's forward context; builds the flex masks once (inside a captured graph the replay
        rebuilds them). Capture-safe."""
        ctx = current_context()
        num_tokens = input_ids.shape[0]
        step = PagedStep(context=ctx, masks=ctx.build_masks(num_tokens), attention=self.attention,
                         rows=PackedRows.from_context(ctx, num_tokens) if self.has_state_layers else None)
        keep: int | torch.Tensor = 0
        if self.logits == "last":
            rows = min(num_tokens, self.plan.limits.max_num_seqs)
            keep = (ctx.query_start_loc[1:rows + 1].long() - 1).clamp(min=0)
        out = self.view(input_ids=input_ids[None], position_ids=ctx.positions[:num_tokens][None], use_cache=False,
                        logits_to_keep=keep, graphkv=step)
        return out.logits[0]
