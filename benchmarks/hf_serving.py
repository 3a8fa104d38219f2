"""Serving a transformers model: graphkv's continuous batching against transformers' own, side by side.

The same tiny random-weight model (``graphkv.hf.tiny_model``, Qwen3 by default: 2 layers, hidden
64, vocabulary 128, float32) and the same prompts (lengths 8-64, fixed seed) are served greedily,
``--new-tokens`` tokens each, at batch 1, 8 and 32 (all requests submitted at once, up to that many
running together):

- graphkv: :class:`graphkv.hf.ServingLoop` (plan, pool, Step, the model's modules with paged flex
  attention, compiled on the CPU too) and its continuous-batching engine (FIFO, chunked prefill);
- transformers: ``model.generate_batch(...)`` — its continuous batching with a paged cache (in
  transformers 5.23 the plain ``sdpa`` implementation; the ``paged|sdpa`` spelling is deprecated),
  given a cache of the same size (``ContinuousBatchingConfig``: the same pages of 16 tokens, step
  budget and request count).

Each contender runs in its own child process (so its peak memory is its own), sets up, serves the
prompts once to warm up (compiles, allocators) and then once timed. Reported: whether the tokens are
identical, generated tokens per second of the timed serve (the call's wall time) and the ratio,
mean time to first token (from submission), set-up seconds (graphkv: plan, allocation, capture
and the first compile), and peak resident memory above the process's resident size once the model
is built (``VmHWM - VmRSS``; both hold the same model). torch threads are pinned (``--threads``,
default 1) and printed. ``--profile`` prints where graphkv's serve time goes (cProfile, top
functions by cumulative time).

Usage: ``python benchmarks/hf_serving.py [--model-type qwen3] [--batches 1,8,32] [--new-tokens 32]``;
writes ``benchmarks/results/hf_serving.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "hf_serving.json"
PAGE_TOKENS = 16
STEP_TOKENS = 256


def _memory_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class ServeMemory:
    """Resident memory of the serving phase: created after set-up and warm-up, it resets the
    process's peak (``/proc/self/clear_refs``) so :meth:`read` reports the peak above the resident
    size while serving, and the resident growth of set-up from :data:`BASE_KIB`."""

    def __init__(self) -> None:
        self.resident = _memory_kib("VmRSS")
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")

    def read(self) -> dict[str, int]:
        """``setup_kib`` (resident growth from the model-built baseline to the end of warm-up) and
        ``serve_peak_kib`` (peak resident above that while serving)."""
        return {"setup_kib": self.resident - BASE_KIB[0], "serve_peak_kib": _memory_kib("VmHWM") - self.resident}


BASE_KIB = [0]  # resident size once the model is built (set by child())


def prompts_for(batch: int, seed: int = 1) -> list[list[int]]:
    """``batch`` prompts of 8-64 token ids (vocabulary 128), the same for both contenders."""
    import torch

    gen = torch.Generator().manual_seed(seed + batch)
    lengths = torch.randint(8, 65, (batch,), generator=gen).tolist()
    return [torch.randint(0, 128, (n,), generator=gen).tolist() for n in lengths]


def serve_graphkv(model: Any, prompts: list[list[int]], new_tokens: int, repeats: int,
                  profile: bool) -> dict[str, Any]:
    """Set up a ServingLoop, warm it up, serve ``prompts`` ``repeats`` times timed (the median run)."""
    import graphkv
    from graphkv.hf.serving import ServingLoop
    from graphkv.models.demo_engine import DemoRequest

    start = time.perf_counter()
    limits = graphkv.Limits(max_model_len=max(map(len, prompts)) + new_tokens, max_num_seqs=len(prompts),
                            max_num_batched_tokens=STEP_TOKENS, block_size=PAGE_TOKENS,
                            cudagraph_mode=graphkv.CudaGraphMode.FULL_DECODE_ONLY)
    from graphkv.hf.declare import model_kv
    from graphkv.hf.generate import workload_budget

    loop = ServingLoop(model, limits=limits, budget=workload_budget(model_kv(model), limits), compile=True)

    def run(tag: str) -> tuple[Any, float]:
        engine = loop.engine()
        requests = [DemoRequest(req_id=(tag, i), prompt=p, max_new_tokens=new_tokens) for i, p in enumerate(prompts)]
        begin = time.perf_counter()
        engine.run(requests)
        return engine, begin

    run("warm-up")
    setup = time.perf_counter() - start
    memory = ServeMemory()
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
    runs = []
    for r in range(repeats):
        engine, begin = run(f"timed {r}")
        runs.append((time.perf_counter() - begin, engine, begin, f"timed {r}"))
    if profile:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats(os.environ.get("HF_BENCH_SORT", "cumulative")).print_stats(45)
    seconds, engine, begin, tag = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    tokens = [engine.finished[(tag, i)][len(p):] for i, p in enumerate(prompts)]
    ttft = [engine.first_token_at[(tag, i)] - begin for i in range(len(prompts))]
    return {"tokens": tokens, "seconds": seconds, "ttft": sum(ttft) / len(ttft), "setup": setup,
            "kv_pages": loop.plan.num_blocks, "steps": engine.stats.steps, "graphs": loop.graphs, **memory.read()}


def serve_transformers(model: Any, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict[str, Any]:
    """``generate_batch`` with a cache of graphkv's size, warmed up, then timed ``repeats`` times
    (the median run)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
    start = time.perf_counter()
    model.set_attn_implementation("sdpa")
    pages = 1 + len(prompts) * -(-(max(map(len, prompts)) + new_tokens) // PAGE_TOKENS)
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=pages, max_batch_tokens=STEP_TOKENS, max_requests_per_batch=len(prompts),
                                  page_size=PAGE_TOKENS)

    def run() -> tuple[dict[str, Any], float]:
        begin = time.perf_counter()
        out = model.generate_batch(inputs=prompts, generation_config=config, continuous_batching_config=cb,
                                   record_timestamps=True)
        return out, begin

    run()
    setup = time.perf_counter() - start
    memory = ServeMemory()
    runs = []
    for _ in range(repeats):
        out, begin = run()
        runs.append((time.perf_counter() - begin, out, begin))
    seconds, out, begin = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    ordered = sorted(out.values(), key=lambda o: int(o.request_id.rsplit("_", 1)[-1]))
    ttft = [o.timestamps[0] - begin for o in ordered]
    # Its serving phase alone: from the call to the last token (without stopping its manager thread).
    phase = max(o.timestamps[-1] for o in ordered) - begin
    return {"tokens": [list(o.generated_tokens) for o in ordered], "seconds": seconds, "phase_seconds": phase,
            "ttft": sum(ttft) / len(ttft),
            "setup": setup, "kv_pages": pages, "steps": None, "graphs": "n/a", **memory.read()}


def child(args: argparse.Namespace) -> None:
    """One contender at one batch size, in this process; prints its result as JSON."""
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    from graphkv.hf import tiny_model

    model = tiny_model(args.model_type)
    prompts = prompts_for(args.batch)
    BASE_KIB[0] = _memory_kib("VmRSS")
    if args.child == "graphkv":
        result = serve_graphkv(model, prompts, args.new_tokens, args.repeats, args.profile)
    else:
        result = serve_transformers(model, prompts, args.new_tokens, args.repeats)
    result["threads"] = torch.get_num_threads()
    print(json.dumps(result))


def run_child(args: argparse.Namespace, who: str, batch: int) -> dict[str, Any]:
    """Run one contender in a fresh process and read its JSON line."""
    argv = [sys.executable, __file__, "--child", who, "--batch", str(batch), "--model-type", args.model_type,
            "--new-tokens", str(args.new_tokens), "--threads", str(args.threads), "--repeats", str(args.repeats)]
    if args.profile and who == "graphkv":
        argv.append("--profile")
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{who} at batch {batch} failed:\n{proc.stderr[-4000:]}")
    if args.profile and who == "graphkv":
        sys.stderr.write(f"--- graphkv, batch {batch}: where the serve time goes ---\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Print the table and write the JSON; exit status 1 when graphkv is slower at some batch size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-type", default="qwen3", help="a family of graphkv.hf.tiny (default: %(default)s)")
    parser.add_argument("--batches", default="1,8,32", help="batch sizes (default: %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per prompt (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed serves per cell, median kept (default: %(default)s)")
    parser.add_argument("--profile", action="store_true", help="print where graphkv's serve time goes")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path (default: %(default)s)")
    parser.add_argument("--child", choices=("graphkv", "transformers"), help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    import torch
    import transformers

    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        ours, theirs = run_child(args, "graphkv", batch), run_child(args, "transformers", batch)
        generated = sum(map(len, ours["tokens"]))
        rows.append({"batch": batch, "identical_tokens": ours["tokens"] == theirs["tokens"], "generated": generated,
                     "graphkv": {k: v for k, v in ours.items() if k != "tokens"},
                     "transformers": {k: v for k, v in theirs.items() if k != "tokens"},
                     "graphkv_tokens_per_s": generated / ours["seconds"],
                     "transformers_tokens_per_s": sum(map(len, theirs["tokens"])) / theirs["seconds"],
                     "transformers_phase_tokens_per_s": sum(map(len, theirs["tokens"])) / theirs["phase_seconds"]})
    threads = rows[0]["graphkv"]["threads"] if rows else args.threads
    print(f"graphkv.hf vs transformers generate_batch: tiny {args.model_type}, {args.new_tokens} new tokens per prompt, "
          f"prompts 8-64 tokens; torch {torch.__version__}, transformers {transformers.__version__}, Python "
          f"{platform.python_version()}, {platform.machine()}, torch threads {threads} (--threads)")
    print(f"{'batch':>5}  {'same tokens':>11}  {'graphkv tok/s':>13}  {'transformers tok/s':>18}  {'ratio':>6}  "
          f"{'to last token':>13}  {'ratio':>6}  "
          f"{'TTFT graphkv':>12}  {'TTFT transf.':>12}  {'set-up graphkv':>16}  {'set-up transf.':>16}  "
          f"{'serve peak graphkv':>18}  {'serve peak transf.':>18}  {'KV pages':>8}")
    slower = []
    for r in rows:
        ratio = r["graphkv_tokens_per_s"] / r["transformers_tokens_per_s"]
        phase_ratio = r["graphkv_tokens_per_s"] / r["transformers_phase_tokens_per_s"]
        if phase_ratio < 1.0:
            slower.append(r["batch"])
        g, t = r["graphkv"], r["transformers"]
        print(f"{r['batch']:>5}  {str(r['identical_tokens']):>11}  {r['graphkv_tokens_per_s']:>13,.0f}  "
              f"{r['transformers_tokens_per_s']:>18,.0f}  {ratio:>6.2f}  "
              f"{r['transformers_phase_tokens_per_s']:>13,.0f}  {phase_ratio:>6.2f}  {g['ttft'] * 1e3:>9.1f} ms  "
              f"{t['ttft'] * 1e3:>9.1f} ms  {g['setup']:>5.1f} s, {g['setup_kib'] / 1024:>3.0f} MiB  "
              f"{t['setup']:>5.1f} s, {t['setup_kib'] / 1024:>3.0f} MiB  {g['serve_peak_kib'] / 1024:>14.1f} MiB  "
              f"{t['serve_peak_kib'] / 1024:>14.1f} MiB  {g['kv_pages']:>3} / {t['kv_pages']:<3}")
    print("tok/s: generated tokens per second of the timed serve (the median of --repeats); transformers' call "
          "includes starting and stopping its manager thread, 'to last token' stops at its last token (the ratio "
          "the exit status checks)")
    print("set-up: seconds and resident memory from the built model to the end of the warm-up serve (graphkv: plan, "
          "pool, torch.compile of flex attention; transformers: its cache and manager); serve peak: resident memory "
          "above that while serving; KV pages: graphkv's pool / the pages transformers was given (16 tokens each)")
    print(f"graphkv: {rows[0]['graphkv']['graphs'] if rows else ''}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model_type": args.model_type, "new_tokens": args.new_tokens, "threads": threads,
                                    "rows": rows}, indent=2))
    if slower or not all(r["identical_tokens"] for r in rows):
        print(f"graphkv is slower at batch {slower}" if slower else "tokens differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
