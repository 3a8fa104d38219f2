"""The ``graphkv`` command: plan a KV cache from a preset, a config.json or a checkpoint directory,
print it as a report, JSON or the ``vllm serve`` command that realizes it; list the presets; run
the demo.

``graphkv plan`` with no flags plans the embedded default (a hybrid model, see ``--help``). Every
mistake — a flag, a file, a plan that cannot fit — ends in one line, ``graphkv: error: <flag>=<value>:
<limit>; <fix>``, with exit status 2 and no traceback; a closed pipe (``graphkv plan | head -1``)
ends quietly with status 0. Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections import Counter
from typing import Any, Sequence

import attrs

from graphkv import __version__
from graphkv.command.args import OneLineParser, count, nonempty, real_fraction
from graphkv.command.budget import BudgetFlags, PlannedBudget, plan_with_budget
from graphkv.command.device_flag import DEVICE_CHOICES
from graphkv.command.flag_errors import in_flag_terms, in_tp_terms, tp_split_problems
from graphkv.command.gpu_flags import gpu_override, gpu_problems_as_typed
from graphkv.command.model_source import ModelSource, load_model_source, tp_sizes_that_split
from graphkv.command.ranks import RankedPlans, check_pipeline_flags, plan_ranks
from graphkv.emit.vllm import VllmTarget, vllm_serve_command
from graphkv.errors import GraphkvError
from graphkv.command.compile_flag import COMPILE_BY_NAME, check_hf_only_flags
from graphkv.memory.command import add_bench_parser
from graphkv.models.demo import MAX_SEED, DemoOptions
from graphkv.plan import Plan
from graphkv.plan.block_size import choose_block_size
from graphkv.presets import list_presets, load_preset_config, preset_model
from graphkv.report import format_consensus, format_plan, format_table
from graphkv.spec.budget import KNOWN_GPUS
from graphkv.spec.hf.families import FAMILIES
from graphkv.spec.hf.gpu_backends import PLANNED_ARCHS
from graphkv.spec.layers import MambaCacheMode
from graphkv.spec.limits import AUTO, CudaGraphMode, Limits
from graphkv.spec.split_rules import MAX_TP_TRIED

__all__ = ["DEFAULT_KV_MEMORY", "DEFAULT_PRESET", "build_parser", "main", "models_table", "plan_from_args",
           "ranks_from_args"]

DEFAULT_PRESET = "qwen3-next-80b-a3b"  # hybrid: gated-delta states + full attention every 4th layer
DEFAULT_KV_MEMORY = "20GiB"
EXIT_ERROR = 2  # same code as argparse's usage errors

_LIMIT_DEFAULTS = {f.name: f.default for f in attrs.fields(Limits)}


def _max_model_len(text: str) -> int | str:
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return count(1)(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a whole number of tokens ({e})") from None


def _partition(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",")]
    # ASCII digits only ("²".isdigit() is true, but int() refuses it), at most 9 per count (a layer count)
    if not all(part.isascii() and part.isdigit() and len(part) <= 9 for part in parts):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} must be layer counts separated by commas, e.g. 10,12,12,10")
    return tuple(int(part) for part in parts)


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (default: --preset %s)" % DEFAULT_PRESET)
    src = g.add_mutually_exclusive_group()
    src.add_argument("--preset", metavar="NAME", type=nonempty("a preset name (`graphkv presets`)"),
                     help="a bundled model preset (see `graphkv presets`); its checkpoint's weight bytes are known")
    src.add_argument("--hf-config", metavar="PATH", type=nonempty("a config.json or checkpoint directory"),
                     help="a Hugging Face config.json, or a checkpoint directory (config.json + safetensors: the "
                          "weight bytes are read from model.safetensors.index.json or the safetensors headers)")
    g.add_argument("--tp", type=count(1, maximum=4096), default=1, metavar="N",
                   help="tensor-parallel degree the per-rank cache is planned for (default: %(default)s)")
    g.add_argument("--pp", type=count(1, maximum=4096), default=1, metavar="M",
                   help="pipeline-parallel stages (default: %(default)s); with --tp, every rank is planned and the "
                        "ranks' agreed plan printed")
    g.add_argument("--pp-partition", type=_partition, metavar="N,N,...",
                   help="model layers per pipeline stage, as VLLM_PP_LAYER_PARTITION: --pp counts summing to the "
                        "model's layers (a partition of another length is refused, never taken as --pp; default: "
                        "vLLM's even split, the remainder on the stages before the last)")
    g.add_argument("--kv-cache-dtype", metavar="DTYPE", type=nonempty("a dtype, e.g. fp8"),
                   help="attention cache dtype, e.g. bfloat16, fp8 (default: the model's)")
    g.add_argument("--mamba-ssm-dtype", metavar="DTYPE", type=nonempty("a dtype, e.g. float32"),
                   help="Mamba / gated-delta state dtype (default: the model's)")
    g.add_argument("--attention-backend", metavar="NAME", type=nonempty("a backend name"),
                   help="attention backend, e.g. flash_attn, flex, flashinfer, triton_paged for attention layers, or "
                        "flash_attn_mla, flashmla, triton_mla for MLA layers (default: what vLLM 0.33 picks on --arch: "
                        "flash_attn; MLA on sm_90 flash_attn_mla, flashmla for fp8 caches and indexed MLA, on sm_80 / "
                        "sm_89 triton_mla)")
    g.add_argument("--arch", choices=PLANNED_ARCHS,
                   help="GPU architecture whose backends to plan for, as vLLM 0.33 picks them there (default: "
                        "--gpu's, else sm_90, an H100's)")


def _add_budget_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(f"budget (default: --kv-memory {DEFAULT_KV_MEMORY}, or none with --num-blocks-override)")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--kv-memory", metavar="SIZE", type=nonempty("a size, e.g. 40GiB"),
                     help="bytes for the KV pool, e.g. 40GiB, 512MiB")
    src.add_argument("--gpu", metavar="NAME", type=nonempty("a GPU name"),
                     help=f"one of {', '.join(g.name for g in KNOWN_GPUS.values())}: the pool gets total x "
                          "utilization - weights - activations - graph reserve; the layers take the backends vLLM "
                          "0.33 runs on that GPU")
    g.add_argument("--utilization", type=real_fraction, metavar="F",
                   help="fraction of the GPU's memory to use (--gpu only; default 0.9)")
    g.add_argument("--weights-memory", metavar="SIZE", type=nonempty("a size, e.g. 16GiB"),
                   help="weights per GPU (--gpu only; default: the preset's or checkpoint's weights / --tp)")
    g.add_argument("--activation-memory", metavar="SIZE", type=nonempty("a size, e.g. 2GiB"),
                   help="peak activation memory of a forward step (--gpu only; default 0: not estimated)")
    g.add_argument("--graph-reserve", metavar="SIZE", type=nonempty("a size, e.g. 1GiB"),
                   help="memory beside the pool for CUDA graphs and static buffers (--gpu only; default: sized from "
                        "the plan's static buffers, the caching allocator's rounding, PyTorch's cuBLAS workspaces and the "
                        "estimated graph pool)")
    g.add_argument("--graph-calibration", metavar="PATH", type=nonempty("a graph_calibration.json"),
                   help="graph memory per capture key measured by `graphkv bench memory --out DIR` (default with "
                        "--gpu: the calibration shipped for the preset on that GPU's architecture, else the "
                        "uncalibrated estimate)")


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    d = _LIMIT_DEFAULTS
    g = p.add_argument_group("limits")
    g.add_argument("--max-model-len", type=_max_model_len, default=d["max_model_len"], metavar="auto|N",
                   help="tokens per request; auto = the longest one request (or --concurrency requests) can use "
                        "(default: %(default)s)")
    g.add_argument("--concurrency", type=count(1), metavar="N",
                   help="requests of max_model_len that must fit at once: with auto, the longest length for N; "
                        "with a fixed length, an error when fewer fit")
    g.add_argument("--max-num-seqs", type=count(1), default=d["max_num_seqs"], metavar="N",
                   help="running requests per step (default: %(default)s)")
    g.add_argument("--max-num-batched-tokens", type=count(1), default=d["max_num_batched_tokens"], metavar="N",
                   help="tokens per step (default: %(default)s)")
    g.add_argument("--num-blocks-override", type=count(2), metavar="N",
                   help="exact pool size in pages; replaces the memory budget for every check")
    g.add_argument("--mamba-cache-mode", type=str.lower, choices=[m.value for m in MambaCacheMode],
                   default=d["mamba_cache_mode"].value,
                   help="Mamba states per request: none 1, align 2 (3 for Mamba2), all one per page (default: %(default)s)")
    g.add_argument("--num-speculative-tokens", type=count(0, maximum=1024), default=d["num_speculative_tokens"],
                   metavar="K", help="draft tokens per step (default: %(default)s)")
    g.add_argument("--block-size", type=count(1), metavar="N", help="tokens per page (default: chosen by the planner)")
    g.add_argument("--mamba-block-size", type=count(1), metavar="N",
                   help="Mamba block size for --mamba-cache-mode align/all (default: chosen by the planner)")
    g.add_argument("--max-concurrent-batches", type=count(1, maximum=1024), default=d["max_concurrent_batches"],
                   metavar="N", help="steps in flight whose sliding-window pages are not freed yet (default: --pp + 1, "
                                     "as vLLM's async scheduling: 2 on one stage; a synchronous scheduler keeps --pp)")
    g.add_argument("--speculative-lookahead-tokens", type=count(0, maximum=1024),
                   default=d["speculative_lookahead_tokens"], metavar="N",
                   help="prefill tokens a drafter reads ahead (multi-module MTP: the draft length); sliding windows "
                        "keep N - 1 more (default: %(default)s)")
    g.add_argument("--disable-hybrid-kv-cache-manager", action=argparse.BooleanOptionalAction, default=None,
                   help="allocate sliding-window and chunked-local layers as full attention, as vLLM's flag of this "
                        "name (--no-...: keep vLLM's hybrid manager for chunked-local attention too; default: vLLM "
                        "0.33's own choice, off for chunked-local attention)")
    g.add_argument("--cudagraph-mode", type=str.upper, choices=[m.value for m in CudaGraphMode],
                   default=d["cudagraph_mode"].value, help="requested capture mode; downgraded with a note if the "
                                                           "backends cannot (default: %(default)s)")
    g.add_argument("--max-cudagraph-capture-size", type=count(1), metavar="N",
                   help="largest step (tokens) captured in a CUDA graph; larger steps run uncaptured (default: vLLM's "
                        "min(2 x max-num-seqs x (1 + K), 512); --max-num-batched-tokens captures every size)")


def _add_demo(sub: Any) -> None:
    demo = sub.add_parser("demo", help="serve a tiny hybrid model end to end on the planned pool (tokens/s)",
                          description="Plan, allocate and serve a tiny random-weight hybrid model (gated linear "
                                      "recurrences + flex attention in one shared pool) with continuous batching; "
                                      "captures CUDA graphs on a GPU, runs eagerly on a CPU. Needs the runtime "
                                      "extra: pip install 'graphkv[runtime]'.")
    d = DemoOptions()
    demo.add_argument("--requests", type=count(1, maximum=100_000), default=d.requests,
                      help="requests to serve (default: %(default)s)")
    demo.add_argument("--new-tokens", type=count(1, maximum=100_000), default=d.new_tokens,
                      help="tokens generated per request (default: %(default)s)")
    demo.add_argument("--max-num-seqs", type=count(1), default=d.max_num_seqs, help="default: %(default)s")
    demo.add_argument("--max-num-batched-tokens", type=count(1), default=d.max_num_batched_tokens,
                      help="default: %(default)s")
    demo.add_argument("--kv-memory", type=nonempty("a size, e.g. 2MiB"), default=d.kv_memory,
                      help="KV pool bytes (default: %(default)s)")
    demo.add_argument("--device", default=d.device, choices=DEVICE_CHOICES,
                      help="default: %(default)s (cuda when available)")
    demo.add_argument("--no-capture", action="store_true", help="run every step eagerly, even on a GPU")
    demo.add_argument("--kernels", default=d.kernels, choices=("auto", "triton", "torch"),
                      help="runtime kernels (default: %(default)s: Triton on a GPU, torch on a CPU); 'triton' on a "
                           "CPU runs the GPU path there: the Triton kernels in Triton's interpreter, the staged "
                           "tables, the GPU's flex query tile and a rehearsed capture (every step padded to its "
                           "graph key)")
    demo.add_argument("--seed", type=count(0, maximum=MAX_SEED), default=d.seed,
                      help="weights and prompts seed (default: %(default)s)")
    demo.add_argument("--threads", type=count(1, maximum=1024), default=d.threads,
                      help="torch CPU threads (torch.set_num_threads; default: %(default)s, for timings that do not "
                           "depend on how busy the machine is)")
    demo.add_argument("--compile", default=d.compile, choices=tuple(COMPILE_BY_NAME),
                      help="with --hf: what graphkv.hf compiles (default: %(default)s: each attention call on a GPU, "
                           "nothing on a CPU; fused: the pieces between attention calls by Inductor, mixed steps "
                           "captured too)")
    demo.add_argument("--trace-layers", action="store_true", help="with --hf and --compile fused or piecewise: trace "
                      "and compile one decoder layer for all (graphkv.hf.layer_compile: a shorter set-up)")
    demo.add_argument("--hf", metavar="MODEL_TYPE", default=None,
                      help="serve a tiny random-weight transformers model of this family instead (llama, qwen3, "
                           "mistral, gemma3_text, gpt_oss, qwen3_next, nemotron_h, or an attention-only family such "
                           "as qwen2, qwen3_moe, mixtral, phi3, olmo2, granite, glm4: graphkv.hf.FAMILIES); needs "
                           "the hf extra")


def build_parser() -> argparse.ArgumentParser:
    """The ``graphkv`` argument parser with its ``plan``, ``presets``, ``models``, ``demo`` and ``bench`` subcommands."""
    parser = OneLineParser(prog="graphkv", description="Plan paged KV caches and CUDA graphs for hybrid "
                           "(attention + Mamba) models on a CPU, before any weight is loaded.")
    parser.add_argument("--version", action="version", version=f"graphkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    plan = sub.add_parser(
        "plan", help="plan a model's KV cache and CUDA graphs and print the report",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=("Plan a model's KV cache and CUDA graphs and print every decision with its reason.\n\n"
                     f"With no flags it plans the embedded default: --preset {DEFAULT_PRESET} (a hybrid of\n"
                     f"gated-delta states and full attention) with --kv-memory {DEFAULT_KV_MEMORY}, --tp 1 and the\n"
                     "default limits below (max_model_len auto, 256 sequences, 8192 tokens per step)."))
    _add_model_flags(plan)
    _add_budget_flags(plan)
    _add_limit_flags(plan)
    out = plan.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the plan as JSON (Plan.to_dict(), the budget and "
                                                         "the inputs)")
    out.add_argument("--emit", choices=["vllm"], help="print the engine command that realizes the plan, each value "
                                                      "that differs from the engine's default commented")
    sub.add_parser("presets", help="list the bundled model presets")
    models = sub.add_parser("models", help="list the model families graphkv reads from a config.json",
                            description="The families graphkv reads (each checked against transformers' reference "
                                        "config), the layer kinds each maps to, and a reference checkpoint. Other "
                                        "configs plan too when their fields say what their layers are.")
    models.add_argument("--markdown", action="store_true", help="print a Markdown table (the README's)")
    _add_demo(sub)
    add_bench_parser(sub)
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The model reader's keyword overrides the flags give: dtypes, a backend, the GPU (:func:`gpu_override`)."""
    names = ("kv_cache_dtype", "mamba_ssm_dtype", "attention_backend")
    overrides = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    return {**overrides, **gpu_override(getattr(args, "arch", None), getattr(args, "gpu", None))}


def _build_limits(args: argparse.Namespace) -> Limits:
    return Limits(max_model_len=args.max_model_len, concurrency=args.concurrency, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens, num_blocks_override=args.num_blocks_override,
                  mamba_cache_mode=args.mamba_cache_mode, num_speculative_tokens=args.num_speculative_tokens,
                  tensor_parallel_size=args.tp, block_size=args.block_size, mamba_block_size=args.mamba_block_size,
                  cudagraph_mode=args.cudagraph_mode, max_concurrent_batches=args.max_concurrent_batches,
                  max_cudagraph_capture_size=args.max_cudagraph_capture_size,
                  speculative_lookahead_tokens=args.speculative_lookahead_tokens,
                  disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager)


def _budget_flags(args: argparse.Namespace) -> BudgetFlags:
    return BudgetFlags(kv_memory=args.kv_memory, gpu=args.gpu, utilization=args.utilization,
                       weights_memory=args.weights_memory, activation_memory=args.activation_memory,
                       graph_reserve=args.graph_reserve, num_blocks_override=args.num_blocks_override,
                       default_kv_memory=DEFAULT_KV_MEMORY, graph_calibration=args.graph_calibration)


def _inputs(source: ModelSource, limits: Limits, args: argparse.Namespace) -> dict[str, Any]:
    limit_dict = {name: (value.value if hasattr(value, "value") else value)
                  for name, value in attrs.asdict(limits, recurse=False).items()}
    dtypes = {"kv_cache_dtype": args.kv_cache_dtype, "mamba_ssm_dtype": args.mamba_ssm_dtype,
              "attention_backend": args.attention_backend, "arch": args.arch}
    partition = list(args.pp_partition) if args.pp_partition is not None else None
    return {**source.description, "tp": args.tp, "pp": args.pp, "pp_partition": partition, **dtypes,
            "limits": limit_dict}


def _source_and_limits(args: argparse.Namespace) -> tuple[ModelSource, Limits]:
    """The model ``--preset`` / ``--hf-config`` names, split for ``--tp`` and checked against ``--pp`` /
    ``--pp-partition``, and the limits the flags set."""
    source = load_model_source(preset=args.preset, hf_config=args.hf_config, default_preset=DEFAULT_PRESET,
                               tp=args.tp, overrides=_overrides(args),
                               read_weights=args.gpu is not None and args.weights_memory is None)
    check_pipeline_flags(source.whole, args.pp, args.pp_partition, tp=args.tp, gpu=args.gpu is not None)
    return source, _build_limits(args)


def plan_from_args(args: argparse.Namespace) -> tuple[ModelSource, PlannedBudget, dict[str, Any]]:
    """Compile the plan the ``plan`` subcommand's flags describe (one rank: ``--tp 1 --pp 1``): the
    model, the planned budget (``.plan`` is the plan) and the JSON-ready inputs."""
    source, limits = _source_and_limits(args)
    planned = plan_with_budget(_budget_flags(args), source, limits, tp=args.tp)
    return source, planned, _inputs(source, limits, args)


def ranks_from_args(args: argparse.Namespace) -> tuple[ModelSource, RankedPlans, dict[str, Any]]:
    """Plan every rank ``--tp`` x ``--pp`` describe and agree: the model, the agreed plans and the inputs."""
    source, limits = _source_and_limits(args)
    ranked = plan_ranks(_budget_flags(args), source, limits, tp=args.tp, pp=args.pp, partition=args.pp_partition)
    return source, ranked, _inputs(source, limits, args)


def _engine_block_size(source: ModelSource, plan: Plan) -> int | None:
    """The page size the planner (like the engine) picks when no --block-size is given."""
    if plan.limits.block_size is None and plan.limits.mamba_block_size is None:
        return plan.block_size
    try:
        free = attrs.evolve(plan.limits, block_size=None, mamba_block_size=None)
        return choose_block_size(source.model, free).block_size
    except GraphkvError:
        return None


def _vllm_command(source: ModelSource, planned: PlannedBudget, args: argparse.Namespace,
                  plan: Plan | None = None) -> str:
    budget = planned.budget
    gpu = budget.gpu if budget is not None else None
    plan = planned.plan if plan is None else plan
    target = VllmTarget(model=source.serve_name, tensor_parallel_size=args.tp, pipeline_parallel_size=args.pp,
                        engine_block_size=_engine_block_size(source, plan),
                        gpu_name=gpu.name if gpu is not None else None,
                        gpu_bytes=gpu.total_memory_bytes if gpu is not None else None,
                        kv_cache_dtype=args.kv_cache_dtype, mamba_ssm_dtype=args.mamba_ssm_dtype,
                        attention_backend=args.attention_backend,
                        notes=(source.serve_note,) if source.serve_note is not None else ())
    return vllm_serve_command(plan, target)


def _run_ranks(args: argparse.Namespace) -> int:
    source, ranked, inputs = ranks_from_args(args)
    consensus, planned = ranked.consensus, ranked.planned
    if args.json:
        data = {**consensus.stages[0].to_dict(), "budget": planned.as_json, "inputs": inputs,
                "consensus": consensus.to_dict(stages=args.pp > 1)}
        print(json.dumps(data, indent=2))
    elif args.emit == "vllm":
        print(_vllm_command(source, planned, args, ranked.widest_stage))
    else:
        print(format_consensus(consensus, budget_text=planned.text))
    return 0


def _run_plan(args: argparse.Namespace) -> int:
    if args.tp > 1 or args.pp > 1:
        return _run_ranks(args)
    source, planned, inputs = plan_from_args(args)
    plan: Plan = planned.plan
    if args.json:
        print(json.dumps({**plan.to_dict(), "budget": planned.as_json, "inputs": inputs}, indent=2))
    elif args.emit == "vllm":
        print(_vllm_command(source, planned, args))
    else:
        print(format_plan(plan, budget_text=planned.text))
    return 0


def _run_presets() -> int:
    rows = []
    for name in list_presets():
        config = load_preset_config(name)
        arch = (config.get("architectures") or [config.get("model_type", "?")])[0]
        kinds = Counter(layer.spec.kind.value for layer in preset_model(name).layers)
        rows.append([name, arch, ", ".join(f"{n} {k}" for k, n in kinds.items()), config.get("_source", "")])
    print("\n".join(format_table(["preset", "architecture", "KV layers", "source"], rows, indent="")))
    return 0


def models_table(*, markdown: bool = False) -> str:
    """The families graphkv reads (``graphkv models``): family, layer kinds, reference checkpoint."""
    headers = ["family", "layer kinds", "reference checkpoint"]
    rows = [[f.model_type, ", ".join(f.kinds), f.checkpoint] for f in FAMILIES]
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "| --- | --- | --- |"]
        lines += ["| " + " | ".join(f"`{c}`" if i != 1 else c for i, c in enumerate(row)) + " |" for row in rows]
        return "\n".join(lines)
    return "\n".join(format_table(headers, rows, indent=""))


def _run_demo(args: argparse.Namespace) -> int:
    from graphkv.extras import require

    require("runtime", "torch", needed_by="graphkv demo")
    from graphkv.models.demo import run_demo

    options = DemoOptions(requests=args.requests, new_tokens=args.new_tokens, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens, kv_memory=args.kv_memory,
                          device=args.device, capture=not args.no_capture, seed=args.seed, threads=args.threads,
                          kernels=args.kernels, compile=args.compile, trace_layers=args.trace_layers)
    check_hf_only_flags(hf=args.hf, compile_name=args.compile, trace_layers=args.trace_layers)
    if args.hf is not None:
        require("hf", "transformers", needed_by="graphkv demo --hf")
        from graphkv.hf.demo import run_hf_demo

        print(run_hf_demo(args.hf, options))
        return 0
    print(run_demo(options))
    return 0


def _budget_flag(args: argparse.Namespace) -> str:
    if getattr(args, "gpu", None) is not None:
        return "--gpu"
    if getattr(args, "kv_memory", None) is None and getattr(args, "num_blocks_override", None) is not None:
        return "--num-blocks-override"
    return "--kv-memory"


def _in_flag_terms(error: GraphkvError, args: argparse.Namespace) -> GraphkvError:
    """``error`` as the flags the user typed: one --tp problem for the head counts --tp cannot split, field
    names as flags, the budget's value as typed."""
    tp = getattr(args, "tp", 1)
    if args.command == "plan" and tp > 1 and tp_split_problems(error, tp):
        try:
            valid = tp_sizes_that_split(preset=args.preset, hf_config=args.hf_config, default_preset=DEFAULT_PRESET,
                                        overrides=_overrides(args))
            error = in_tp_terms(error, tp, valid, up_to=MAX_TP_TRIED)
        except GraphkvError:  # the config could not be read again: keep the problems as they were
            pass
    error = gpu_problems_as_typed(error, arch=getattr(args, "arch", None), gpu=getattr(args, "gpu", None))
    typed = {flag: getattr(args, name, None) for flag, name in (("--kv-memory", "kv_memory"), ("--gpu", "gpu"))}
    return in_flag_terms(error, budget_flag=_budget_flag(args), typed=typed,
                         has_flag=lambda flag: hasattr(args, flag.lstrip("-").replace("-", "_")))


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        return _run_demo(args)
    if args.command == "bench":
        from graphkv.memory.command import run_bench

        return run_bench(args)
    if args.command == "models":
        print(models_table(markdown=args.markdown))
        return 0
    return _run_plan(args) if args.command == "plan" else _run_presets()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``graphkv`` command; returns the exit code (0 ok, 2 usage or planning error).

    Usage errors exit through ``SystemExit(2)`` with one line on stderr; a reader that closes the
    pipe early (``| head``) ends the command quietly with 0.
    """
    _tolerate_narrow_encodings()
    args = build_parser().parse_args(argv)
    try:
        code = _run(args)
        sys.stdout.flush()  # surface a closed pipe here, not at interpreter exit
        return code
    except GraphkvError as e:
        print(f"graphkv: error: {_in_flag_terms(e, args).one_line()}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader is gone (`graphkv plan | head -1`): stop writing, as Unix tools do. Point stdout at
        # /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
    except OSError as e:
        if e.errno not in _OUTPUT_ERRNOS or e.filename is not None:  # a write to a stream has no file name
            raise
        # A full disk or a failing device under stdout (`> /dev/full`) or an open output file: say so, no
        # traceback. Where stdout itself cannot be flushed, point it at /dev/null so the interpreter's final
        # flush does not fail again.
        print(f"graphkv: error: writing the output failed: {e.strerror or e}; free space or write elsewhere",
              file=sys.stderr)
        try:
            sys.stdout.flush()
        except OSError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return EXIT_ERROR


_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT})


def _tolerate_narrow_encodings() -> None:
    """Let stdout and stderr print the reports' typography (—, …, ×) in any encoding: where the
    stream's encoding is not UTF-8 (``PYTHONIOENCODING=latin-1``, an ASCII locale), a character it
    cannot encode is written as ``?`` instead of ending the command in ``UnicodeEncodeError``."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        reconfigure = getattr(stream, "reconfigure", None)
        if encoding not in ("utf8", "utf8sig") and callable(reconfigure):
            reconfigure(errors="replace")


if __name__ == "__main__":
    raise SystemExit(main())
