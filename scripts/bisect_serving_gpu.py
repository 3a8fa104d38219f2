"""Which part of graphkv.hf's GPU serving path faults: the gpu_serving benchmark's graphkv flow, bisected.

A GPU diagnostic. ``python scripts/bisect_serving_gpu.py``
runs every variant below (or ``--variants``) at once, each in its own process (a CUDA error is sticky), on the benchmark's
qwen3 widths (hidden 2048, 16 query / 8 KV heads, head 128, vocab 32000, bf16; ``--layers`` of them),
``--batch`` random prompts of 64..1024 tokens (the benchmark's own), a 2048-token step budget and
``--new`` new tokens, and prints one line per variant: ``ok``, or the error with the step it reached and
the last frames of its traceback. ``--variant NAME`` runs one variant in this process.

- ``bench``: as ``benchmarks/gpu_serving.py --gpu`` builds it (split-KV decode kernel, compiled flex
  regions, CUDA graphs for decode);
- ``bench_blocking``: the same under ``CUDA_LAUNCH_BLOCKING=1``, so the traceback names the faulting op;
- ``one_split``: the decode kernel forced to one split (no workspace, no combine kernel);
- ``flex_decode``: decode steps through flex attention (no decode kernel);
- ``eager_flex``: flex regions not compiled (the compiled CUDA flex kernel out);
- ``no_graphs``: no CUDA graphs (every step eager);
- ``model`` / ``fused``: the forward compiled whole by Inductor (``compile="model"``), or split at the
  attention ops with each piece compiled by Inductor and mixed steps captured too (``compile="fused"``);
- ``after_static_compile``: as ``bench``, but between two serves the same model runs transformers'
  ``generate`` with a static cache under ``torch.compile(mode="reduce-overhead")`` (PyTorch's cudagraph
  trees) in the same process — what ``benchmarks/gpu_serving.py`` does when it runs every contender.

On the H100 (2026-11-26, torch 2.11, 2 layers, batch 1) the first six were ok; the benchmark's graphkv
serve failed with an illegal memory access only after its ``generate_static_compiled`` contender had run
in the process (``--contenders graphkv,generate_static_compiled``), not with graphkv alone.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

VARIANTS = ("bench", "bench_blocking", "one_split", "flex_decode", "eager_flex", "no_graphs", "model", "fused",
            "after_static_compile")
COMPILE = {"eager_flex": False, "model": "model", "fused": "fused"}  # ServingLoop's compile per variant (else None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gpu_serving import GPU_MODEL, prompts_for, serving_loop_for  # noqa: E402 - the benchmark's model, prompts, plan


def serve(variant: str, *, layers: int, batch: int, new_tokens: int, device: str = "cuda") -> str:
    """Build and serve one variant once on ``device`` (a CPU runs the GPU path: Triton kernels interpreted,
    capture rehearsed); returns a one-line verdict."""
    import torch
    from transformers import AutoModelForCausalLM

    import graphkv.hf.attention as attention
    from graphkv.hf.tiny import tiny_config
    from graphkv.models.demo_engine import DemoRequest

    if variant == "one_split":
        attention.paged_decode_attention = functools.partial(attention.paged_decode_attention, num_splits=1)
    torch.manual_seed(0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(tiny_config("qwen3", **{**GPU_MODEL, "num_hidden_layers": layers}),
                                                 dtype=torch.bfloat16).eval()
    prompts = prompts_for(batch, GPU_MODEL["vocab_size"], 64, 1024)  # the benchmark's GPU mode's prompts
    lengths = [len(p) for p in prompts]
    loop = serving_loop_for(model, prompts, new_tokens, step_tokens=2048, compile=COMPILE.get(variant),
                            capture_graphs=variant != "no_graphs",
                            decode_attention="flex" if variant == "flex_decode" else None, kernels="triton")
    sync()
    steps = []
    try:
        rounds = 2 if variant == "after_static_compile" else 1
        for round_ in range(rounds):
            if round_:  # transformers' fastest path on the same model, in this process, between two serves
                from transformers.generation.configuration_utils import CompileConfig

                ids = torch.tensor([prompts[0]], device=device)
                model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                               eos_token_id=None, pad_token_id=0, cache_implementation="static",
                               compile_config=CompileConfig(fullgraph=True, mode="reduce-overhead"))
                sync()
            engine = loop.engine()
            engine.run([DemoRequest(req_id=(round_, i), prompt=p, max_new_tokens=new_tokens)
                        for i, p in enumerate(prompts)], on_step=lambda stats: steps.append(stats.tokens))
            sync()
    except Exception as error:  # noqa: BLE001 - the verdict names it
        frames = [f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_tb(error.__traceback__)]
        return (f"FAIL after {len(steps)} steps (prompts {lengths}): {type(error).__name__}: "
                f"{str(error).splitlines()[0][:120]} | {' <- '.join(reversed(frames[-6:]))}")
    return f"ok: {len(steps)} steps, prompts {lengths}, {loop.graphs}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS, help="run this one variant here")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated variants to run at once")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=150)
    parser.add_argument("--device", default="cuda", help="cpu: the GPU path rehearsed (slow)")
    args = parser.parse_args()
    if args.variant:
        try:
            verdict = serve(args.variant, layers=args.layers, batch=args.batch, new_tokens=args.new,
                            device=args.device)
            print(f"{args.variant}: {verdict}", flush=True)
        except Exception as error:  # noqa: BLE001 - a failed build is a verdict too
            print(f"{args.variant}: FAIL while building: {type(error).__name__}: {str(error).splitlines()[0][:200]}",
                  flush=True)
        return 0
    start = time.perf_counter()
    procs = {}
    for name in args.variants.split(","):
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1" if name == "bench_blocking" else "0")
        procs[name] = subprocess.Popen([sys.executable, __file__, "--variant", name, "--layers", str(args.layers),
                                        "--batch", str(args.batch), "--new", str(args.new),
                                        "--device", args.device],
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=max(1.0, args.timeout - (time.perf_counter() - start)))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            out = f"{name}: TIMEOUT"
        lines = [line for line in out.splitlines() if line.startswith(f"{name}:")]
        print(lines[-1] if lines else f"{name}: no verdict (rc={proc.returncode}): {err.strip().splitlines()[-1:]}",
              flush=True)
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
