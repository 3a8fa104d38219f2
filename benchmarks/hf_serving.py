"""Serving a transformers model: graphkv's continuous batching against transformers' own, side by side.

The same tiny random-weight model (``graphkv.hf.tiny_model``, Qwen3 by default: 2 layers, hidden
64, vocabulary 128, float32) and the same prompts (lengths 8-64, fixed seed) are served greedily,
``--new-tokens`` tokens each, at batch 1, 8 and 32 (all requests submitted at once, up to that many
running together):

- graphkv: :class:`graphkv.hf.ServingLoop` (plan, pool, Step, the model's own modules with paged
  flex attention; by default the whole forward compiled, ``--compile attention`` compiles only
  each attention call, both on the CPU too) and its continuous-batching engine (FIFO, chunked
  prefill, greedy);
- transformers: ``model.generate_batch(...)`` — its continuous batching over a paged cache (in
  transformers 5.23 with the plain ``sdpa`` implementation: the ``paged|sdpa`` spelling is
  deprecated and maps to it), given a cache of the same size (``ContinuousBatchingConfig``: as
  many tokens as graphkv's pool, in 16-token pages, the same step budget and request count). It
  refuses hybrid models (``Invalid layer type: linear_attention``); for those only graphkv's
  numbers are printed.

One process per batch size: both contenders are set up (each serves the prompts once to warm up:
compiles, allocators), then timed serves alternate between them, ``--repeats`` each, medians
kept. Reported: whether the tokens are identical; generated tokens per second of a serve and the
ratio — transformers' both over its whole call (which starts and stops its manager thread) and up
to its last token (the stricter ratio, which the exit status checks); mean time to first token from
submission; set-up seconds and resident-memory growth; the peak resident memory above the resident
size while serving (``/proc/self/clear_refs`` resets the peak before each serve). torch threads are
pinned (``--threads``, default 1) and printed. ``--profile`` prints where graphkv's serve time goes
(cProfile, top functions).

Usage: ``python benchmarks/hf_serving.py [--model-type qwen3] [--batches 1,8,32] [--new-tokens 32]``;
writes ``benchmarks/results/hf_serving.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from graphkv.command.compile_flag import COMPILE_BY_NAME

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "hf_serving.json"
PAGE_TOKENS = 16
STEP_TOKENS = 256


def memory_kib(field: str) -> int:
    """``field`` (``VmRSS``, ``VmHWM``) of this process, in KiB."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def serve_peak_kib(serve: Callable[[], Any]) -> tuple[Any, int]:
    """``serve()`` and the peak resident memory above the resident size while it ran."""
    resident = memory_kib("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # reset VmHWM to the current resident size
    out = serve()
    return out, memory_kib("VmHWM") - resident


def prompts_for(batch: int, seed: int = 1) -> list[list[int]]:
    """``batch`` prompts of 8-64 token ids (vocabulary 128), the same for both contenders."""
    import torch

    gen = torch.Generator().manual_seed(seed + batch)
    lengths = torch.randint(8, 65, (batch,), generator=gen).tolist()
    return [torch.randint(0, 128, (n,), generator=gen).tolist() for n in lengths]


# --compile: what graphkv compiles
COMPILED = {"model": "the whole forward", "fused": "the pieces between attention calls (Inductor)",
            "piecewise": "the pieces between attention calls (traced)", "attention": "each attention call"}


class GraphkvServer:
    """graphkv.hf: a ServingLoop sized for the prompts and its engine."""

    name = "graphkv"

    def __init__(self, model: Any, prompts: list[list[int]], new_tokens: int, compile_mode: str) -> None:
        import graphkv
        from graphkv.hf.declare import model_kv
        from graphkv.hf.generation import workload_budget
        from graphkv.hf.serving import ServingLoop

        self.prompts, self.new_tokens = prompts, new_tokens
        limits = graphkv.Limits(max_model_len=max(map(len, prompts)) + new_tokens, max_num_seqs=len(prompts),
                                max_num_batched_tokens=STEP_TOKENS, block_size=PAGE_TOKENS,
                                cudagraph_mode=graphkv.CudaGraphMode.FULL_DECODE_ONLY)
        self.loop = ServingLoop(model, limits=limits, budget=workload_budget(model_kv(model), limits),
                                compile=COMPILE_BY_NAME[compile_mode])
        self.kv_tokens = self.loop.plan.num_blocks * self.loop.plan.block_size  # the pool, null page included
        self.runs = 0

    def serve(self) -> dict[str, Any]:
        """Serve every prompt once; tokens, seconds, time to first token."""
        from graphkv.models.demo_engine import DemoRequest

        self.runs += 1
        engine = self.loop.engine()
        requests = [DemoRequest(req_id=(self.runs, i), prompt=p, max_new_tokens=self.new_tokens)
                    for i, p in enumerate(self.prompts)]
        begin = time.perf_counter()
        engine.run(requests)
        seconds = time.perf_counter() - begin
        ttft = [engine.first_token_at[(self.runs, i)] - begin for i in range(len(self.prompts))]
        return {"tokens": [engine.finished[(self.runs, i)][len(p):] for i, p in enumerate(self.prompts)],
                "seconds": seconds, "to_last_token": seconds, "ttft": statistics.mean(ttft)}


class TransformersServer:
    """transformers: ``generate_batch`` with a cache of graphkv's size."""

    name = "transformers"

    def __init__(self, model: Any, prompts: list[list[int]], new_tokens: int, kv_tokens: int) -> None:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
        self.model, self.prompts = model, prompts
        pages = kv_tokens // PAGE_TOKENS
        model.set_attn_implementation("sdpa")
        self.config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        self.cb = ContinuousBatchingConfig(num_blocks=pages, max_batch_tokens=STEP_TOKENS,
                                           max_requests_per_batch=len(prompts), page_size=PAGE_TOKENS)

    def serve(self) -> dict[str, Any]:
        """Serve every prompt once; tokens, seconds of the call and to the last token, time to first token."""
        begin = time.perf_counter()
        out = self.model.generate_batch(inputs=self.prompts, generation_config=self.config,
                                        continuous_batching_config=self.cb, record_timestamps=True)
        seconds = time.perf_counter() - begin
        ordered = sorted(out.values(), key=lambda o: int(o.request_id.rsplit("_", 1)[-1]))
        return {"tokens": [list(o.generated_tokens) for o in ordered], "seconds": seconds,
                "to_last_token": max(o.timestamps[-1] for o in ordered) - begin,
                "ttft": statistics.mean(o.timestamps[0] - begin for o in ordered)}


def measure_batch(args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """Both contenders at one batch size, in this process (see the module docstring)."""
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    from graphkv.hf import tiny_model

    model = tiny_model(args.model_type)
    prompts = prompts_for(batch)
    servers, setup, refused = [], {}, {}
    contenders = (("graphkv", lambda: GraphkvServer(model, prompts, args.new_tokens, args.compile)),
                  ("transformers", lambda: TransformersServer(model, prompts, args.new_tokens, servers[0].kv_tokens)))
    for name, build in contenders:
        resident, start = memory_kib("VmRSS"), time.perf_counter()
        try:
            server = build()
            server.serve()  # warm-up
        except Exception as error:  # noqa: BLE001 - a contender that cannot serve this model is reported
            if name == "graphkv":
                raise
            refused[name] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            continue
        servers.append(server)
        setup[server.name] = {"seconds": time.perf_counter() - start, "kib": memory_kib("VmRSS") - resident}
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    for r in range(args.repeats):
        for server in servers if r % 2 == 0 else servers[::-1]:
            if profiler is not None and server.name == "graphkv":
                profiler.enable()
            result, peak = serve_peak_kib(server.serve)
            if profiler is not None and server.name == "graphkv":
                profiler.disable()
            runs[server.name].append({**result, "serve_peak_kib": peak})
    if profiler is not None:
        import pstats

        pstats.Stats(profiler, stream=sys.stderr).sort_stats(args.profile_sort).print_stats(40)
    out: dict[str, Any] = {"batch": batch, "threads": torch.get_num_threads(), "graphs": servers[0].loop.graphs,
                           "kv_tokens": servers[0].kv_tokens, "refused": refused}
    for name, rs in runs.items():
        out[name] = {"tokens": rs[0]["tokens"], "same_every_run": all(r["tokens"] == rs[0]["tokens"] for r in rs),
                     **{k: statistics.median(r[k] for r in rs)
                        for k in ("seconds", "to_last_token", "ttft", "serve_peak_kib")},
                     "setup_seconds": setup[name]["seconds"], "setup_kib": setup[name]["kib"]}
    return out


def run_batch(args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """:func:`measure_batch` in a fresh process (so each batch size starts from the same state)."""
    argv = [sys.executable, __file__, "--child-batch", str(batch), "--model-type", args.model_type,
            "--new-tokens", str(args.new_tokens), "--threads", str(args.threads), "--repeats", str(args.repeats),
            "--profile-sort", args.profile_sort, "--compile", args.compile] + (["--profile"] if args.profile else [])
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"batch {batch} failed:\n{proc.stderr[-4000:]}")
    if args.profile:
        sys.stderr.write(f"--- batch {batch}: where graphkv's serve time goes ---\n"
                         + proc.stderr[proc.stderr.find("   Ordered by"):])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Print the table and write the JSON; exit status 1 when graphkv generates fewer tokens per
    second than transformers up to its last token at some batch size, or the tokens differ."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-type", default="qwen3", help="a family of graphkv.hf.tiny (default: %(default)s)")
    parser.add_argument("--batches", default="1,8,32", help="batch sizes (default: %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per prompt (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=7, help="timed serves per contender (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--compile", choices=tuple(COMPILED), default="model",
                        help="graphkv compiles the model's whole forward, its pieces between attention calls "
                             "(fused: by Inductor; piecewise: as traced), or only each attention call "
                             "(default: %(default)s)")
    parser.add_argument("--profile", action="store_true", help="print where graphkv's serve time goes")
    parser.add_argument("--profile-sort", default="cumulative", help="cProfile sort key (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path (default: %(default)s)")
    parser.add_argument("--child-batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_batch is not None:
        print(json.dumps(measure_batch(args, args.child_batch)))
        return 0
    import torch
    import transformers

    rows = [run_batch(args, int(b)) for b in args.batches.split(",")]
    print(f"graphkv.hf vs transformers generate_batch: tiny {args.model_type}, {args.new_tokens} new tokens per "
          "prompt, "
          f"prompts 8-64 tokens; torch {torch.__version__}, transformers {transformers.__version__}, Python "
          f"{platform.python_version()}, {platform.machine()}, torch threads {rows[0]['threads']} (--threads); "
          f"medians of {args.repeats} alternating serves; graphkv compiles "
          f"{COMPILED[args.compile]} (--compile)")
    print(f"{'batch':>5}  {'same':>5}  {'graphkv':>8}  {'transformers call':>17}  {'ratio':>5}  {'to last token':>13}  "
          f"{'ratio':>5}  {'TTFT graphkv':>12}  {'TTFT transf.':>12}  {'set-up graphkv':>16}  {'set-up transf.':>16}  "
          f"{'serve peak':>17}")
    failed = []
    for row in rows:
        g, t = row["graphkv"], row.get("transformers")
        if t is None:
            rate = sum(map(len, g["tokens"])) / g["seconds"]
            print(f"{row['batch']:>5}  {'-':>5}  {rate:>8,.0f}  transformers cannot serve this model: "
                  f"{row['refused']['transformers']}  (TTFT graphkv {g['ttft'] * 1e3:.1f} ms)")
            row["tokens_per_s"] = {"graphkv": rate}
            g.pop("tokens")
            continue
        generated = sum(map(len, g["tokens"]))
        row["identical_tokens"] = g["tokens"] == t["tokens"] and g["same_every_run"] and t["same_every_run"]
        rate = {"graphkv": generated / g["seconds"], "transformers_call": generated / t["seconds"],
                "transformers_to_last_token": generated / t["to_last_token"]}
        row["tokens_per_s"] = rate
        row["ratio"] = rate["graphkv"] / rate["transformers_call"]
        row["ratio_to_last_token"] = rate["graphkv"] / rate["transformers_to_last_token"]
        if row["ratio_to_last_token"] < 1.0 or not row["identical_tokens"]:
            failed.append(row["batch"])
        print(f"{row['batch']:>5}  {str(row['identical_tokens']):>5}  {rate['graphkv']:>8,.0f}  "
              f"{rate['transformers_call']:>17,.0f}  {row['ratio']:>5.2f}  "
              f"{rate['transformers_to_last_token']:>13,.0f}  "
              f"{row['ratio_to_last_token']:>5.2f}  {g['ttft'] * 1e3:>9.1f} ms  {t['ttft'] * 1e3:>9.1f} ms  "
              f"{g['setup_seconds']:>5.1f} s {g['setup_kib'] / 1024:>4.0f} MiB  "
              f"{t['setup_seconds']:>5.1f} s {t['setup_kib'] / 1024:>4.0f} MiB  "
              f"{g['serve_peak_kib'] / 1024:>5.1f} / {t['serve_peak_kib'] / 1024:>5.1f} MiB")
        for side in (g, t):
            side.pop("tokens")
    print("graphkv, transformers call, to last token: generated tokens per second of a serve (transformers' call "
          "starts and stops its manager thread; 'to last token' stops at its last token). set-up: from the built "
          "model to the end of a warm-up serve (graphkv: plan, pool, torch.compile; transformers: "
          f"its cache and manager), seconds and resident growth. serve peak: graphkv / transformers, resident memory "
          f"above the resident size while serving. KV cache: {', '.join(str(r['kv_tokens']) for r in rows)} tokens "
          "for each contender (transformers in pages of 16).")
    print(f"graphkv: {rows[0]['graphs']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model_type": args.model_type, "new_tokens": args.new_tokens,
                                    "repeats": args.repeats, "compile": args.compile, "rows": rows}, indent=2))
    if failed:
        print(f"graphkv is slower than transformers up to its last token, or the tokens differ, at batch {failed}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
