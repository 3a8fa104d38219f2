"""The ``graphkv`` command: plan a KV cache from a preset or a config.json, or list the presets.

``graphkv plan`` with no flags plans the embedded default (a hybrid model, see ``--help``) and
prints the report; ``--json`` prints ``Plan.to_dict()`` plus the inputs. Any graphkv error is
printed as ``graphkv: error: <message>`` (no traceback) with exit code 2, like argparse's own
usage errors. Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any, Sequence

import attrs

from graphkv.errors import GraphkvError, Problem, SpecError
from graphkv.models.demo import DemoOptions
from graphkv.plan import Plan, compile_plan
from graphkv.presets import list_presets, load_preset_config, preset_model
from graphkv.report import format_plan, format_table
from graphkv.spec.budget import KNOWN_GPUS, Budget, parse_bytes
from graphkv.spec.hf.families import FAMILIES
from graphkv.spec.layers import MambaCacheMode
from graphkv.spec.limits import AUTO, CudaGraphMode, Limits
from graphkv.spec.model import ModelKV

__all__ = ["DEFAULT_KV_MEMORY", "DEFAULT_PRESET", "build_parser", "main", "models_table"]

DEFAULT_PRESET = "qwen3-next-80b-a3b"  # hybrid: gated-delta states + full attention every 4th layer
DEFAULT_KV_MEMORY = "20GiB"
EXIT_ERROR = 2  # same code as argparse's usage errors

_LIMIT_DEFAULTS = {f.name: f.default for f in attrs.fields(Limits)}


def _max_model_len(text: str) -> int | str:
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer, got {text!r}") from None


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (default: --preset %s)" % DEFAULT_PRESET)
    src = g.add_mutually_exclusive_group()
    src.add_argument("--preset", metavar="NAME", help="a bundled model preset (see `graphkv presets`)")
    src.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree the per-rank cache is planned for "
                                                      "(default: %(default)s)")
    g.add_argument("--kv-cache-dtype", metavar="DTYPE", help="attention cache dtype, e.g. bfloat16, fp8 "
                                                             "(default: the model's)")
    g.add_argument("--mamba-ssm-dtype", metavar="DTYPE", help="Mamba / gated-delta state dtype (default: the model's)")
    g.add_argument("--attention-backend", metavar="NAME", help="attention backend of non-MLA layers, e.g. flash_attn, "
                                                               "flex, flashinfer, triton_paged")


def _add_budget_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(f"budget (default: --kv-memory {DEFAULT_KV_MEMORY}, or none with --num-blocks-override)")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--kv-memory", metavar="SIZE", help="bytes for the KV pool, e.g. 40GiB, 512MiB")
    src.add_argument("--gpu", metavar="NAME", help=f"one of {', '.join(g.name for g in KNOWN_GPUS.values())}: the pool "
                                                   "gets total x utilization - weights")
    g.add_argument("--utilization", type=float, metavar="F", help="fraction of the GPU's memory to use (--gpu only; "
                                                                  "default 0.9)")
    g.add_argument("--weights-memory", metavar="SIZE", help="model weights per GPU, subtracted (--gpu only; default 0)")


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    d = _LIMIT_DEFAULTS
    g = p.add_argument_group("limits")
    g.add_argument("--max-model-len", type=_max_model_len, default=d["max_model_len"], metavar="auto|N",
                   help="tokens per request; auto = the longest one request can use (default: %(default)s)")
    g.add_argument("--max-num-seqs", type=int, default=d["max_num_seqs"], metavar="N",
                   help="running requests per step (default: %(default)s)")
    g.add_argument("--max-num-batched-tokens", type=int, default=d["max_num_batched_tokens"], metavar="N",
                   help="tokens per step (default: %(default)s)")
    g.add_argument("--num-blocks-override", type=int, metavar="N",
                   help="exact pool size in pages; replaces the memory budget for every check")
    g.add_argument("--mamba-cache-mode", choices=[m.value for m in MambaCacheMode], default=d["mamba_cache_mode"].value,
                   help="Mamba states per request: none 1, align 2, all one per page (default: %(default)s)")
    g.add_argument("--num-speculative-tokens", type=int, default=d["num_speculative_tokens"], metavar="K",
                   help="draft tokens per step (default: %(default)s)")
    g.add_argument("--block-size", type=int, metavar="N", help="tokens per page (default: chosen by the planner)")
    g.add_argument("--mamba-block-size", type=int, metavar="N", help="Mamba block size for --mamba-cache-mode "
                                                                     "align/all (default: chosen by the planner)")
    g.add_argument("--max-concurrent-batches", type=int, default=d["max_concurrent_batches"], metavar="N",
                   help="steps in flight whose sliding-window pages are not freed yet: 2 with async scheduling, "
                        "the pipeline depth with pipeline parallelism (default: %(default)s)")
    g.add_argument("--speculative-lookahead-tokens", type=int, default=d["speculative_lookahead_tokens"],
                   metavar="N", help="prefill tokens a drafter reads ahead (multi-module MTP: the draft length); "
                                     "sliding windows keep N - 1 more (default: %(default)s)")
    g.add_argument("--cudagraph-mode", type=str.upper, choices=[m.value for m in CudaGraphMode],
                   default=d["cudagraph_mode"].value, help="requested capture mode; downgraded with a note if the "
                                                           "backends cannot (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    """The ``graphkv`` argument parser with its ``plan`` and ``presets`` subcommands."""
    parser = argparse.ArgumentParser(prog="graphkv", description="Plan paged KV caches and CUDA graphs for hybrid "
                                     "(attention + Mamba) models on a CPU, before any weight is loaded.")
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
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (Plan.to_dict() plus the inputs)")
    sub.add_parser("presets", help="list the bundled model presets")
    models = sub.add_parser("models", help="list the model families graphkv reads from a config.json",
                            description="The families graphkv reads (each checked against transformers' reference "
                                        "config), the layer kinds each maps to, and a reference checkpoint. Other "
                                        "configs plan too when their fields say what their layers are.")
    models.add_argument("--markdown", action="store_true", help="print a Markdown table (the README's)")
    demo = sub.add_parser("demo", help="serve a tiny hybrid model end to end on the planned pool (tokens/s)",
                          description="Plan, allocate and serve a tiny random-weight hybrid model (gated linear "
                                      "recurrences + flex attention in one shared pool) with continuous batching; "
                                      "captures CUDA graphs on a GPU, runs eagerly on a CPU.")
    d = DemoOptions()
    demo.add_argument("--requests", type=int, default=d.requests, help="requests to serve (default: %(default)s)")
    demo.add_argument("--new-tokens", type=int, default=d.new_tokens, help="tokens generated per request "
                                                                           "(default: %(default)s)")
    demo.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="default: %(default)s")
    demo.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                      help="default: %(default)s")
    demo.add_argument("--kv-memory", default=d.kv_memory, help="KV pool bytes (default: %(default)s)")
    demo.add_argument("--device", default=d.device, choices=["auto", "cpu", "cuda"],
                      help="default: %(default)s (cuda when available)")
    demo.add_argument("--no-capture", action="store_true", help="run every step eagerly, even on a GPU")
    demo.add_argument("--seed", type=int, default=d.seed, help="weights and prompts seed (default: %(default)s)")
    return parser


def _flag_error(flag: str, value: Any, limit: str, fix: str) -> SpecError:
    return SpecError(Problem(field=flag, value=value, limit=limit, fix=fix))


def _load_hf_config(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise _flag_error("--hf-config", path, "no such file", "pass the path of a Hugging Face config.json") from None
    except json.JSONDecodeError as e:
        raise _flag_error("--hf-config", path, f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})",
                          "pass an unmodified config.json") from None
    except (OSError, UnicodeDecodeError) as e:
        raise _flag_error("--hf-config", path, f"cannot be read ({type(e).__name__}: {e})",
                          "pass a readable config.json file") from None
    if not isinstance(config, dict):
        raise _flag_error("--hf-config", path, f"holds a JSON {type(config).__name__}, not an object",
                          "pass a config.json whose top level is an object")
    return config


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    names = ("kv_cache_dtype", "mamba_ssm_dtype", "attention_backend")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _build_model(args: argparse.Namespace) -> tuple[ModelKV, dict[str, Any]]:
    """The model and a JSON-ready description of where it came from."""
    if args.hf_config is not None:
        config = _load_hf_config(args.hf_config)
        return ModelKV.from_hf_config(config, tp=args.tp, **_overrides(args)), {"hf_config": args.hf_config}
    name = args.preset or DEFAULT_PRESET
    if name not in list_presets():
        raise _flag_error("--preset", name, f"is not a bundled preset; known: {', '.join(list_presets())}",
                          "pick one of those (`graphkv presets` lists them) or pass --hf-config PATH")
    return preset_model(name, tp=args.tp, **_overrides(args)), {"preset": name}


def _gpu_budget(args: argparse.Namespace) -> Budget:
    if args.gpu.strip().lower() not in KNOWN_GPUS:
        known = ", ".join(g.name for g in KNOWN_GPUS.values())
        raise _flag_error("--gpu", args.gpu, f"is not a known GPU; known: {known}",
                          "pick one of those or give the KV pool size directly with --kv-memory SIZE")
    weights = parse_bytes(args.weights_memory, field="--weights-memory") if args.weights_memory else 0
    return Budget.for_gpu(args.gpu, utilization=0.9 if args.utilization is None else args.utilization,
                          weights_bytes=weights)


def _build_budget(args: argparse.Namespace) -> tuple[Budget | None, str]:
    """The KV budget and its description; ``None`` when only --num-blocks-override sizes the pool."""
    if args.gpu is not None:
        budget = _gpu_budget(args)
        return budget, budget.describe()
    for flag, value in (("--utilization", args.utilization), ("--weights-memory", args.weights_memory)):
        if value is not None:
            raise _flag_error(flag, value, "only applies with --gpu", f"add --gpu NAME or drop {flag}")
    if args.kv_memory is None and args.num_blocks_override is not None:
        return None, f"no memory budget: --num-blocks-override {args.num_blocks_override} sizes the pool"
    budget = Budget(kv_cache_bytes=parse_bytes(args.kv_memory or DEFAULT_KV_MEMORY, field="--kv-memory"))
    return budget, budget.describe() + ("" if args.kv_memory else " (default --kv-memory)")


def _build_limits(args: argparse.Namespace) -> Limits:
    return Limits(max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens, num_blocks_override=args.num_blocks_override,
                  mamba_cache_mode=args.mamba_cache_mode, num_speculative_tokens=args.num_speculative_tokens,
                  tensor_parallel_size=args.tp, block_size=args.block_size, mamba_block_size=args.mamba_block_size,
                  cudagraph_mode=args.cudagraph_mode, max_concurrent_batches=args.max_concurrent_batches,
                  speculative_lookahead_tokens=args.speculative_lookahead_tokens)


def _inputs(source: dict[str, Any], budget: Budget | None, limits: Limits, args: argparse.Namespace) -> dict[str, Any]:
    budget_dict = None if budget is None else {
        "kv_pool_bytes": budget.kv_pool_bytes(), "gpu": budget.gpu.name if budget.gpu else None,
        "utilization": budget.utilization if budget.gpu else None, "weights_bytes": budget.weights_bytes}
    limit_dict = {name: (value.value if hasattr(value, "value") else value)
                  for name, value in attrs.asdict(limits, recurse=False).items()}
    dtypes = {"kv_cache_dtype": args.kv_cache_dtype, "mamba_ssm_dtype": args.mamba_ssm_dtype,
              "attention_backend": args.attention_backend}
    return {**source, "tp": args.tp, **dtypes, "budget": budget_dict, "limits": limit_dict}


def plan_from_args(args: argparse.Namespace) -> tuple[Plan, str, dict[str, Any]]:
    """Compile the plan the ``plan`` subcommand's flags describe: plan, budget text, inputs."""
    model, source = _build_model(args)
    budget, budget_text = _build_budget(args)
    limits = _build_limits(args)
    plan = compile_plan(model, limits, budget)
    return plan, budget_text, _inputs(source, budget, limits, args)


def _run_plan(args: argparse.Namespace) -> int:
    plan, budget_text, inputs = plan_from_args(args)
    if args.json:
        print(json.dumps({**plan.to_dict(), "inputs": inputs}, indent=2))
    else:
        print(format_plan(plan, budget_text=budget_text))
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
    for flag in ("requests", "new_tokens", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(args, flag) < 1:
            raise _flag_error("--" + flag.replace("_", "-"), getattr(args, flag), "must be >= 1",
                              "pass a positive integer")
    from graphkv.models.demo import run_demo

    options = DemoOptions(requests=args.requests, new_tokens=args.new_tokens, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens, kv_memory=args.kv_memory,
                          device=args.device, capture=not args.no_capture, seed=args.seed)
    print(run_demo(options))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``graphkv`` command; returns the exit code (0 ok, 2 usage or planning error)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _run_demo(args)
        if args.command == "models":
            print(models_table(markdown=args.markdown))
            return 0
        return _run_plan(args) if args.command == "plan" else _run_presets()
    except GraphkvError as e:
        print(f"graphkv: error: {e}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
