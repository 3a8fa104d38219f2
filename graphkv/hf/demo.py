"""``graphkv demo --hf MODEL_TYPE``: one tiny transformers model served end to end on graphkv.

A tiny random-weight model of the family (:mod:`graphkv.hf.tiny`) is declared from its config,
planned under the demo's limits and ``--kv-memory``, allocated and served by continuous batching
(requests arriving while others decode, prompts longer than the step's token budget prefilled in
chunks, pages of finished requests reused). The plan report is printed first, then the run's
numbers, and last whether every request's tokens equal ``model.generate(do_sample=False)`` for
its prompt alone.
"""

from __future__ import annotations

import sys
from typing import TextIO

import attrs
import torch

from graphkv.errors import Problem, SpecError
from graphkv.command.compile_flag import COMPILE_BY_NAME, PIECEWISE_MODES, default_compile, graph_mode_for
from graphkv.hf.declare import flex_q_tile_for, model_kv
from graphkv.runtime.ops.choice import resolve_kernels
from graphkv.hf.generation import sliding_tables_for
from graphkv.hf.serving import ServingLoop
from graphkv.hf.tiny import TINY_CONFIGS, tiny_model
from graphkv.models.demo import DemoOptions, DemoResult, check_memory, check_options, demo_requests, serve_demo
from graphkv.plan.compile import compile_plan
from graphkv.report import format_plan
from graphkv.spec.budget import Budget
from graphkv.spec.limits import Limits

__all__ = ["HFDemoResult", "run_hf_demo"]


@attrs.frozen(kw_only=True)
class HFDemoResult:
    """The demo run's numbers and how many requests matched transformers' own greedy generation."""

    run: DemoResult
    matching: int
    checked: int

    def __str__(self) -> str:
        return "\n".join([str(self.run), f"transformers    greedy tokens equal model.generate(do_sample=False) for "
                                         f"{self.matching}/{self.checked} requests"])


def run_hf_demo(model_type: str, options: DemoOptions, *, out: TextIO | None = None,
                progress: bool = True) -> HFDemoResult:
    """Plan, allocate and serve the tiny ``model_type`` model under ``options``; print the plan
    report to ``out`` (default stdout) and return the numbers. Raises :class:`SpecError` naming
    ``--hf`` for a model type without a tiny config, and the plan's errors naming the flags."""
    if model_type not in TINY_CONFIGS:
        raise SpecError(Problem(field="--hf", value=model_type, limit=f"must be one of {', '.join(TINY_CONFIGS)}",
                                fix="pick a family graphkv.hf runs"))
    out = out if out is not None else sys.stdout
    device = check_options(options)
    model = tiny_model(model_type, seed=options.seed).to(device)
    declared = model_kv(model, flex_q_tile_tokens=flex_q_tile_for(device, resolve_kernels(options.kernels, device)))
    if options.compile not in COMPILE_BY_NAME:
        raise SpecError(Problem(field="--compile", value=options.compile,
                                limit=f"must be one of {', '.join(COMPILE_BY_NAME)}",
                                fix="auto (attention regions compiled on a GPU), fused (pieces compiled by Inductor, "
                                    "mixed steps captured too), model, piecewise or none"))
    chosen = COMPILE_BY_NAME[options.compile]
    chosen = default_compile(torch.device(device).type) if chosen is None else chosen
    if options.trace_layers and chosen not in PIECEWISE_MODES:
        raise SpecError(Problem(field="--trace-layers", value=True,
                                limit=f"needs --compile piecewise or fused, not --compile {options.compile}",
                                fix="add --compile fused (or drop --trace-layers)"))
    # piecewise / fused capture mixed steps too; auto: the device's default mode, as the model will pick it
    mode = graph_mode_for(COMPILE_BY_NAME[options.compile], torch.device(device).type)
    limits = sliding_tables_for(Limits(max_model_len=options.max_model_len, max_num_seqs=options.max_num_seqs,
                                       max_num_batched_tokens=options.max_num_batched_tokens,
                                       cudagraph_mode=mode), declared)
    budget = Budget.kv_bytes(options.kv_memory)
    check_memory(compile_plan(declared, limits, budget), device, options.kv_memory)
    torch.set_num_threads(options.threads)
    loop = ServingLoop(model, limits=limits, budget=budget, device=device, capture_graphs=options.capture,
                       kernels=options.kernels, compile=COMPILE_BY_NAME[options.compile],
                       trace_layers=options.trace_layers)
    print(format_plan(loop.plan, budget_text=f"{options.kv_memory} (--kv-memory)"), file=out)
    graphs = loop.graphs if options.capture else "capture disabled (--no-capture); every step runs eagerly"
    engine = loop.engine()
    run = serve_demo(engine, options, model.config.vocab_size, device=device, graphs=graphs, progress=progress)
    first, arrivals = demo_requests(options, model.config.vocab_size)
    requests = first + [r for batch in arrivals.values() for r in batch]
    matching = 0
    with torch.no_grad():
        for r in requests:
            ids = torch.tensor([r.prompt], device=device)
            reference = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.max_new_tokens,
                                       do_sample=False)
            matching += reference[0].tolist() == engine.finished[r.req_id]
    return HFDemoResult(run=run, matching=matching, checked=len(requests))
