"""Serving on a GPU: graphkv.hf's decode steps against transformers' serving paths and the bandwidth limit.

One random-weight Qwen3-like model (no download) and one set of prompts (fixed seed) served greedily,
one process per batch size, by:

- ``graphkv``: :class:`graphkv.hf.ServingLoop` planned as :func:`graphkv.hf.generate` plans it, every
  request admitted at once, ``--step-tokens`` per step, and its engine (CUDA graphs on a GPU);
- ``generate_batch``: transformers' continuous batching (16-token pages holding every request whole);
- ``generate``: ``model.generate`` on the left-padded batch, sdpa, dynamic cache;
- ``generate_static_compiled``: ``model.generate`` with ``cache_implementation="static"``, for which
  transformers 5.24 compiles the decoding forward itself (``CompileConfig(fullgraph=True)``, mode
  ``reduce-overhead``; prefill eager, so prompt shapes never recompile). On a CPU: mode ``default``
  (reduce-overhead is CUDA graphs), forced with ``CompileConfig._compile_all_devices``.

Per batch and contender, medians of ``--repeats`` serves (shuffled order each round, gc off) after a
warm-up serve: tokens/s to the last token; ms per decode step = (last token - the moment every
request has its first) / (new tokens - 1); mean time to first token; set-up seconds (build and
warm-up: graphkv's plan, pool, capture; transformers' compile; of it, Dynamo's tracing and the compile
backend's time, ``trace_s`` / ``backend_s`` in the JSON, Triton's run-time tuning and the graph captures in
neither; and how many Inductor compiles hit its on-disk cache, which the processes after the first share, so later
batch sizes set up warm); requests whose tokens equal
``generate``'s. A decode step's bandwidth limit = (weight bytes it reads + KV bytes of its context) /
the copy bandwidth (a large ``Tensor.copy_`` on the device at start, bytes read plus written per
second), at every request's mean decode context; graphkv's own step timings also give its
full-batch decode steps (all requests decoding) against their exact limit.

Usage: ``python benchmarks/gpu_serving.py`` (CPU: tiny 2-layer qwen3, float32, batch 1 and 4) or
``--gpu`` (CUDA: 0.94B qwen3-like bf16, batch 1,8,32,128; ``--dtype float32`` for token equality).
Writes ``benchmarks/results/gpu_serving.json`` (``--out``); exit status 1 when graphkv fails or, on a
float32 model, its greedy tokens differ from ``generate``'s.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import logging
import platform
import random
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence
from timing import add_common_arguments, set_up
from transformers.generation.streamers import BaseStreamer

from graphkv.command.compile_flag import COMPILE_BY_NAME

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gpu_serving.json"
CONTENDERS = ("graphkv", "generate_batch", "generate", "generate_static_compiled")
PAGE_TOKENS = 16  # generate_batch's page size
# 0.94B parameters: the "0.9B" model of the first H100 run (shared/gpu/README.md), so figures compare.
GPU_MODEL = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=16, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=8192)
# Per mode: batches, prompt lengths, new tokens, dtype, step budget (a flag overrides each).
MODES = {"gpu": dict(batches="1,8,32,128", min_prompt=64, max_prompt=1024, new_tokens=128, dtype="bfloat16",
                     step_tokens=2048),
         "cpu": dict(batches="1,4", min_prompt=8, max_prompt=32, new_tokens=8, dtype="float32", step_tokens=256)}
DTYPES = ("bfloat16", "float16", "float32")
# Run in a process of their own on a GPU. On the H100 (2026-11-26, torch 2.11) graphkv's next serve faulted with an
# illegal memory access after transformers' generate under torch.compile(mode="reduce-overhead") (PyTorch's
# cudagraph trees) had run on the same model in the same process; graphkv alone, and beside the other contenders,
# did not: cudagraph trees release every stream's cached cuBLAS workspace, which graphkv's graphs were captured on.
# graphkv now captures on workspaces in its own pool (not yet run on a GPU): scripts/bisect_serving_gpu.py
# --variants after_static_compile checks it, and then this isolation can go.
ISOLATED = ("generate_static_compiled",)


def sync(device: str) -> None:
    """Wait for the device (a no-op on a CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: str) -> float:
    """Bytes read plus written per second by a large ``Tensor.copy_`` on ``device`` (1 GiB on CUDA,
    256 MiB on a CPU), median of several copies after warm-up."""
    nbytes = (1 << 30) if device == "cuda" else (256 << 20)
    src, dst = torch.ones(nbytes // 4, device=device), torch.empty(nbytes // 4, device=device)
    seconds = []
    for _ in range(13):  # the first 3 warm up
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        seconds.append(time.perf_counter() - start)
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()  # the benchmark runs in child processes: leave them the memory
    return 2 * nbytes / statistics.median(seconds[3:])


def build_model(args: argparse.Namespace) -> Any:
    """The Qwen3 model of the mode (``graphkv.hf.tiny`` config, on a GPU with :data:`GPU_MODEL`'s
    sizes), random weights from ``torch.manual_seed(0)``, in ``args.dtype`` on ``args.device``, eval."""
    from transformers import AutoModelForCausalLM

    from graphkv.hf.tiny import tiny_config

    config = tiny_config("qwen3", **(GPU_MODEL if args.gpu else {}))
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    return model.eval()


def weight_bytes(model: Any) -> int:
    """Bytes of weights one decode step reads: every parameter, less the input embedding table when
    the output head does not share it (a step gathers only its rows of it)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    if embed is not model.get_output_embeddings().weight:
        total -= embed.numel() * embed.element_size()
    return total


def kv_bytes_per_token(model: Any) -> int:
    """K and V bytes one token holds over all layers."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * model.dtype.itemsize


def prompts_for(batch: int, vocab: int, lo: int, hi: int, seed: int = 1) -> list[list[int]]:
    """``batch`` prompts of ``lo``..``hi`` random token ids, the same for every contender."""
    gen = torch.Generator().manual_seed(seed + batch)
    lengths = torch.randint(lo, hi + 1, (batch,), generator=gen).tolist()
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def serving_loop_for(model: Any, prompts: list[list[int]], new_tokens: int, *, step_tokens: int,
                     **loop_kwargs: Any) -> Any:
    """graphkv.hf's :class:`~graphkv.hf.ServingLoop` for ``model``, planned as ``graphkv.hf.generate`` plans it for
    ``prompts`` and ``new_tokens`` (every request admitted at once, ``step_tokens`` per step, a pool holding them
    all); ``loop_kwargs`` go to the loop (``compile``, ``kernels``, ...). Shared by this benchmark and the GPU
    scripts that serve its model."""
    import attrs

    from graphkv.hf import ServingLoop, model_kv
    from graphkv.hf.generation import default_limits, sliding_tables_for, workload_budget

    declared = model_kv(model)
    where = loop_kwargs.get("device") or next(model.parameters()).device
    limits = attrs.evolve(default_limits(prompts, new_tokens, declared, compile=loop_kwargs.get("compile"),
                                         device_type=torch.device(where).type),
                          max_num_seqs=len(prompts),
                          max_num_batched_tokens=max(step_tokens, len(prompts)))
    limits = sliding_tables_for(limits, declared)
    return ServingLoop(model, limits=limits, budget=workload_budget(declared, limits), **loop_kwargs)


def compile_seconds() -> tuple[float, float]:
    """Seconds this process has spent so far in Dynamo's own tracing (its compiles less their backends) and in
    compile backends (graphkv's split and Inductor), from Dynamo's timing metrics; a difference of two readings
    splits a set-up's compile time."""
    import torch._dynamo.utils

    metrics = torch._dynamo.utils.compilation_time_metrics
    backends = sum(metrics.get("OutputGraph.call_user_compiler", ()))
    return sum(metrics.get("_compile.compile_inner", ())) - backends, backends


def inductor_cache_counts() -> tuple[int, int]:
    """How many compiles this process has so far found in Inductor's FX graph cache (hits) and compiled afresh
    (misses and bypasses); a difference of two readings says whether a set-up ran on a warm cache."""
    import torch._dynamo.utils

    counts = torch._dynamo.utils.counters["inductor"]
    return counts["fxgraph_cache_hit"], counts["fxgraph_cache_miss"] + counts["fxgraph_cache_bypass"]


class GraphkvServer:
    """graphkv.hf: a ServingLoop planned as ``graphkv.hf.generate`` plans it, and its engine; each
    step timed (its rows and the KV tokens it reads, from the engine's counters)."""

    def __init__(self, model: Any, prompts: list[list[int]], args: argparse.Namespace) -> None:
        start = time.perf_counter()
        self.loop = serving_loop_for(model, prompts, args.new_tokens, step_tokens=args.step_tokens,
                                     compile=COMPILE_BY_NAME[args.compile],
                                     merge_projections=args.merge_projections, small_matmul=args.small_matmul,
                                     trace_layers=args.trace_layers)
        self.build_seconds = time.perf_counter() - start  # plan + pool + capture
        self.prompts, self.new_tokens, self.device, self.runs = prompts, args.new_tokens, args.device, 0

    def serve(self) -> dict[str, Any]:
        """Serve every prompt once: tokens, seconds, first-token times, each step's (seconds, rows, KV tokens)."""
        from graphkv.models.demo_engine import DemoRequest

        self.runs += 1
        engine = self.loop.engine()
        requests = [DemoRequest(req_id=(self.runs, i), prompt=p, max_new_tokens=self.new_tokens)
                    for i, p in enumerate(self.prompts)]
        steps: list[tuple[float, int, int]] = []
        last = {"at": 0.0, "tokens": 0, "generated": 0, "finished": 0, "released": 0}

        def on_step(stats: Any) -> None:
            now = time.perf_counter()  # the engine synced when it read the last step's tokens
            tokens, generated = stats.tokens - last["tokens"], stats.generated - last["generated"]
            if tokens and tokens == generated:  # every row decoded one token
                steps.append((now - last["at"], generated, stats.tokens - last["released"]))
            done = list(engine.finished.values())[last["finished"]:]
            last.update(at=now, tokens=stats.tokens, generated=stats.generated, finished=len(engine.finished),
                        released=last["released"] + sum(len(t) - 1 for t in done))  # the last token is not in the pool

        sync(self.device)
        begin = last["at"] = time.perf_counter()
        engine.run(requests, on_step=on_step)
        sync(self.device)
        return {"tokens": [engine.finished[(self.runs, i)][len(p):] for i, p in enumerate(self.prompts)],
                "end_s": time.perf_counter() - begin, "steps": steps,
                "first_s": [engine.first_token_at[(self.runs, i)] - begin for i in range(len(self.prompts))]}


class GenerateBatchServer:
    """transformers ``generate_batch`` with a cache that holds every request whole (as graphkv's budget does)."""

    def __init__(self, model: Any, prompts: list[list[int]], args: argparse.Namespace) -> None:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
        self.model, self.prompts = model, prompts
        pages = len(prompts) * -(-(max(map(len, prompts)) + args.new_tokens) // PAGE_TOKENS) + 1
        self.config = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None,
                                       pad_token_id=0)
        # transformers 5.17.0 names the tokens per page ``block_size``; later versions rename it ``page_size``
        # (and deprecate ``block_size``). Either way ``num_blocks`` counts pages of that many tokens.
        accepted = inspect.signature(ContinuousBatchingConfig).parameters
        page_arg = "page_size" if "page_size" in accepted else "block_size"
        self.cb = ContinuousBatchingConfig(num_blocks=pages, max_batch_tokens=max(args.step_tokens, len(prompts)),
                                           max_requests_per_batch=len(prompts), **{page_arg: PAGE_TOKENS})

    def serve(self) -> dict[str, Any]:
        """Serve every prompt once: tokens, the last token's time, first-token times (its timestamps)."""
        begin = time.perf_counter()
        out = self.model.generate_batch(inputs=self.prompts, generation_config=self.config,
                                        continuous_batching_config=self.cb, record_timestamps=True)
        ordered = sorted(out.values(), key=lambda o: int(o.request_id.rsplit("_", 1)[-1]))
        return {"tokens": [list(o.generated_tokens) for o in ordered],
                "end_s": max(o.timestamps[-1] for o in ordered) - begin,
                "first_s": [o.timestamps[0] - begin for o in ordered]}


class TokenTimes(BaseStreamer):
    """A transformers streamer that notes when each ``put`` arrives (the prompt, then one per token;
    ``generate`` copies the tokens to the host first, so the device has finished them)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        """A prompt or a step's tokens arrived."""
        self.times.append(time.perf_counter())

    def end(self) -> None:
        """Generation ended (nothing to do)."""


class GenerateServer:
    """transformers ``generate`` on the left-padded batch, sdpa; ``static=True``: a static cache with
    transformers' own compile of the decoding forward (see the module docstring)."""

    def __init__(self, model: Any, prompts: list[list[int]], args: argparse.Namespace, static: bool = False) -> None:
        pad = lambda rows: pad_sequence(rows, batch_first=True, padding_side="left").to(args.device)  # noqa: E731
        self.ids = pad([torch.tensor(p) for p in prompts])
        self.mask = pad([torch.ones(len(p), dtype=torch.long) for p in prompts])
        self.model, self.new_tokens, self.device, self.extra = model, args.new_tokens, args.device, {}
        if static:
            from transformers.generation.configuration_utils import CompileConfig

            mode = "reduce-overhead" if args.device == "cuda" else "default"
            compile_config = CompileConfig(fullgraph=True, mode=mode)
            compile_config._compile_all_devices = args.device != "cuda"  # transformers compiles only on accelerators
            self.extra = {"cache_implementation": "static", "compile_config": compile_config}

    def serve(self) -> dict[str, Any]:
        """Generate for the batch once: tokens, the last token's time, the first token's time (one for all)."""
        timer = TokenTimes()
        sync(self.device)
        begin = time.perf_counter()
        out = self.model.generate(self.ids, attention_mask=self.mask, max_new_tokens=self.new_tokens,
                                  min_new_tokens=self.new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
                                  streamer=timer, **self.extra)
        tokens = out[:, self.ids.shape[1]:].tolist()
        first = timer.times[-self.new_tokens] - begin
        return {"tokens": tokens, "end_s": timer.times[-1] - begin, "first_s": [first] * len(tokens)}


SERVERS = {"graphkv": GraphkvServer, "generate_batch": GenerateBatchServer, "generate": GenerateServer,
           "generate_static_compiled": lambda m, p, a: GenerateServer(m, p, a, static=True)}


def summarize(run: dict[str, Any], batch: int, new_tokens: int, limit_s: Any) -> dict[str, float]:
    """One serve's figures: tokens/s, ms per decode step, mean TTFT; graphkv's full-batch decode steps
    against their own limit (``limit_s(kv_tokens)``)."""
    decode_s = (run["end_s"] - max(run["first_s"])) / (new_tokens - 1)
    out = {"tok_s": batch * new_tokens / run["end_s"], "ms_per_step": 1e3 * decode_s,
           "ttft_ms": 1e3 * statistics.mean(run["first_s"])}
    if run.get("steps"):  # none when every request finished before the last one's prefill ended
        full = [s for s in run["steps"] if s[1] == batch] or run["steps"]
        seconds, limits = sum(s[0] for s in full), sum(limit_s(s[2]) for s in full)
        out.update(decode_steps=len(full), step_ms=1e3 * seconds / len(full), step_limit_ms=1e3 * limits / len(full),
                   step_x_limit=seconds / limits)
    return out


def measure_batch(args: argparse.Namespace, batch: int, bandwidth: float) -> dict[str, Any]:
    """Every contender at one batch size in this process: set up (with a warm-up serve), then
    ``args.repeats`` rounds of one serve each in a shuffled order, the garbage collector off."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    model = build_model(args)
    prompts = prompts_for(batch, model.config.vocab_size, args.min_prompt, args.max_prompt)
    weights, per_token = weight_bytes(model), kv_bytes_per_token(model)
    limit_s = lambda kv_tokens: (weights + kv_tokens * per_token) / bandwidth  # noqa: E731
    decode_kv = sum(map(len, prompts)) + batch * args.new_tokens / 2  # mean over decode steps 1..new-1
    row: dict[str, Any] = {"batch": batch, "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts)),
                                                             sum(map(len, prompts))],
                           "weight_bytes": weights, "kv_bytes_per_token": per_token,
                           "limit_ms": 1e3 * limit_s(decode_kv), "limit_kv_bytes": decode_kv * per_token,
                           "params": sum(p.numel() for p in model.parameters())}
    servers, runs = {}, {}
    attention = model.config._attn_implementation
    for name in args.contenders:
        start, compiled, cached = time.perf_counter(), compile_seconds(), inductor_cache_counts()
        try:
            server = SERVERS[name](model, prompts, args)
            first = server.serve()
        except Exception as error:  # noqa: BLE001 - a contender that cannot run here is reported, not fatal
            row[name] = {"error": f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"}
            print(f"batch {batch}: {name} cannot run: {row[name]['error']}", file=sys.stderr)
            # transformers 5.17's generate_batch switches the model to its paged attention and switches it back only
            # when it ends well: the contenders after a failed one would run on it (and refuse a standard forward)
            if model.config._attn_implementation != attention:
                model.set_attn_implementation(attention)
            continue
        servers[name], runs[name] = server, [first]
        row[name] = {"setup_s": time.perf_counter() - start}
        # of the set-up: Dynamo tracing, and the compile backend (graphkv's split, Inductor) compiling what it traced
        row[name]["trace_s"], row[name]["backend_s"] = (now - then for now, then in zip(compile_seconds(), compiled))
        row[name]["inductor_cache_hits"], row[name]["inductor_cache_misses"] = (
            now - then for now, then in zip(inductor_cache_counts(), cached))
        if name == "graphkv":
            row[name].update(build_s=server.build_seconds, graphs=server.loop.graphs,
                             kv_tokens=server.loop.plan.num_blocks * server.loop.plan.block_size)
    order = random.Random(0)
    for _ in range(args.repeats):
        names = list(servers)
        order.shuffle(names)
        for name in names:
            gc.collect()  # untimed; then off while serving, as in timeit
            gc.disable()
            try:
                runs[name].append(servers[name].serve())
            finally:
                gc.enable()
    reference = runs["generate"][-1]["tokens"] if "generate" in runs else None
    for name, rs in runs.items():
        timed = [summarize(r, batch, args.new_tokens, limit_s) for r in (rs[1:] or rs)]
        row[name].update({k: statistics.median(t[k] for t in timed) for k in timed[0]})
        row[name]["x_limit"] = row[name]["ms_per_step"] / row["limit_ms"]
        row[name]["same_every_run"] = all(r["tokens"] == rs[0]["tokens"] for r in rs)
        if reference is not None:
            row[name]["equal_to_generate"] = sum(a == b for a, b in zip(rs[-1]["tokens"], reference))
    if "graphkv" in runs:  # graphkv's speed-up over each peer: tokens/s, and ms per decode step
        g = row["graphkv"]
        g["vs"] = {name: {"tok_s": g["tok_s"] / row[name]["tok_s"], "ms_per_step": row[name]["ms_per_step"]
                          / g["ms_per_step"]} for name in runs if name != "graphkv"}
    return row


def issue_targets(rows: list[dict[str, Any]]) -> dict[str, tuple[float, bool]]:
    """Issue 20's serving targets (for an H100) that ``rows`` measure: name -> (value, met)."""
    g = {r["batch"]: r.get("graphkv", {}) for r in rows}
    found = {f"batch {b}: decode step <= {bound}x its limit": (g[b]["step_x_limit"], bound, True)
             for b, bound in ((1, 1.3), (32, 1.6)) if "step_x_limit" in g.get(b, {})}
    if g.get(32, {}).get("vs"):
        found["batch 32: tok/s >= 3x transformers' fastest"] = (min(v["tok_s"] for v in g[32]["vs"].values()), 3, False)
    if any("build_s" in x for x in g.values()):
        found["plan + pool + capture <= 10 s"] = (max(x["build_s"] for x in g.values() if "build_s" in x), 10, True)
    return {k: (value, value <= bound if at_most else value >= bound) for k, (value, bound, at_most) in found.items()}


def run_batch(argv: list[str], batch: int, bandwidth: float, contenders: tuple[str, ...] = (),
              gpu: bool = False) -> dict[str, Any]:
    """:func:`measure_batch` in a fresh process (a crash or a poisoned CUDA context costs one batch size). On a
    GPU each contender of :data:`ISOLATED` runs in a process of its own beside the others' (see its comment);
    its row joins theirs, marked ``isolated``, with graphkv's ratio to it."""
    alone = [c for c in ISOLATED if c in contenders and len(contenders) > 1] if gpu else []
    groups = [tuple(c for c in contenders if c not in alone), *((c,) for c in alone)] if alone else [()]
    rows = [_run_child([*argv, *(("--contenders", ",".join(g)) if alone else ())], batch, bandwidth) for g in groups]
    row = rows[0]
    if "error" in row:
        return row
    g = row.get("graphkv", {})
    for name, other in zip(alone, rows[1:]):
        row[name] = ({"error": (other["error"].strip().splitlines() or ["no output"])[-1][:300]} if "error" in other
                     else {**other[name], "isolated": True})
        if "tok_s" in g and "tok_s" in row[name]:
            g.setdefault("vs", {})[name] = {"tok_s": g["tok_s"] / row[name]["tok_s"],
                                            "ms_per_step": row[name]["ms_per_step"] / g["ms_per_step"]}
    return row


def _run_child(argv: list[str], batch: int, bandwidth: float) -> dict[str, Any]:
    child = [sys.executable, __file__, *argv, "--child-batch", str(batch), "--bandwidth", repr(bandwidth)]
    proc = subprocess.run(child, capture_output=True, text=True, check=False, timeout=3600)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return {"batch": batch, "error": proc.stderr.strip()[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_table(rows: list[dict[str, Any]], contenders: tuple[str, ...]) -> None:
    """Per batch: the limit, then one line per contender with graphkv's ratio to it."""
    print(f"{'batch':>5}  {'contender':<25} {'tok/s':>9} {'ms/step':>8} {'x limit':>7} {'TTFT ms':>8} "
          f"{'set-up s':>8} {'equal':>7} {'graphkv x (tok/s / step)':>24}")
    for row in rows:
        if "error" in row:
            print(f"{row['batch']:>5}  failed: {(row['error'].strip().splitlines() or ['no output'])[-1]}")
            continue
        print(f"{row['batch']:>5}  limit {row['limit_ms']:.3f} ms/step: {row['weight_bytes'] / 1e6:,.1f} MB weights + "
              f"{row['limit_kv_bytes'] / 1e6:,.1f} MB KV at the mean decode context (prompts "
              f"{row['prompt_tokens'][0]}-{row['prompt_tokens'][1]} tokens; {row['params'] / 1e6:,.2f}M parameters)")
        g = row.get("graphkv", {})
        for name in contenders:
            c = row.get(name, {})
            if "error" in c:
                print(f"{'':>5}  {name:<25} cannot run: {c['error']}")
                continue
            equal = f"{c['equal_to_generate']}/{row['batch']}" if "equal_to_generate" in c else "-"
            vs = g.get("vs", {}).get(name)
            speedup = f"{vs['tok_s']:.2f}x / {vs['ms_per_step']:.2f}x" if vs else ""
            label = name + ("*" if c.get("isolated") else "")
            print(f"{'':>5}  {label:<25} {c['tok_s']:>9,.1f} {c['ms_per_step']:>8.3f} {c['x_limit']:>7.2f} "
                  f"{c['ttft_ms']:>8.1f} {c['setup_s']:>8.1f} {equal:>7} {speedup:>24}")
        if "step_ms" in g:
            print(f"{'':>5}  graphkv's {g['decode_steps']} full-batch decode steps: {g['step_ms']:.3f} ms each, limit "
                  f"{g['step_limit_ms']:.3f} ms -> {g['step_x_limit']:.2f}x the limit; plan+pool+capture "
                  f"{g['build_s']:.1f} s, set-up {g['setup_s']:.1f} s (Dynamo tracing {g['trace_s']:.1f} s, "
                  f"compiling {g['backend_s']:.1f} s; Inductor cache {g['inductor_cache_hits']} hits, "
                  f"{g['inductor_cache_misses']} compiled afresh); {g['graphs']}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options, with the mode's defaults (:data:`MODES`) filled in; exits 2 on a bad flag."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, repeats=3, out=DEFAULT_OUT,
                         gpu="serve the 0.94B bf16 model on CUDA (default: a tiny float32 model on the CPU)")
    for flag, kind, what in (("--batches", str, "batch sizes"), ("--new-tokens", int, "tokens generated per prompt"),
                             ("--min-prompt", int, "shortest prompt"), ("--max-prompt", int, "longest prompt"),
                             ("--dtype", str, "the model's dtype"), ("--step-tokens", int, "the engines' step budget")):
        key = flag[2:].replace("-", "_")
        parser.add_argument(flag, type=kind, help=f"{what} (default: {MODES['gpu'][key]} / {MODES['cpu'][key]})")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="a subset of %(default)s")
    parser.add_argument("--compile", choices=tuple(COMPILE_BY_NAME), default="auto",
                        help="graphkv: ServingLoop's compile (auto: attention regions on a GPU, eager on a CPU)")
    parser.add_argument("--merge-projections", action="store_true",
                        help="graphkv: each q/k/v and gate/up group as one matmul (with --compile piecewise or fused)")
    parser.add_argument("--small-matmul", action="store_true",
                        help="graphkv: steps of at most 8 tokens multiply through graphkv's small-matmul kernel "
                             "(with --compile piecewise or fused)")
    parser.add_argument("--trace-layers", action="store_true",
                        help="graphkv: trace and compile one decoder layer of each structure for every layer, the "
                             "forward around them eager (with --compile piecewise or fused)")
    parser.add_argument("--child-batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bandwidth", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for key, value in MODES["gpu" if args.gpu else "cpu"].items():
        setattr(args, key, value if getattr(args, key) is None else getattr(args, key))
    args.device, args.contenders = ("cuda" if args.gpu else "cpu"), tuple(args.contenders.split(","))
    unknown = sorted(set(args.contenders) - set(CONTENDERS))
    problems = [f"--contenders names {unknown}; pick from {','.join(CONTENDERS)}"] if unknown else []
    for flag, on in (("--merge-projections", args.merge_projections), ("--small-matmul", args.small_matmul),
                     ("--trace-layers", args.trace_layers)):
        if on and args.compile not in ("piecewise", "fused"):
            problems.append(f"{flag} needs --compile piecewise or fused, not --compile {args.compile}; "
                            f"pass --compile fused")
    if args.new_tokens < 2:
        problems.append(f"--new-tokens={args.new_tokens}: needs >= 2 (a decode step to time); pass 2 or more")
    if not 1 <= args.min_prompt <= args.max_prompt:
        problems.append(f"--min-prompt={args.min_prompt}, --max-prompt={args.max_prompt}: need 1 <= min <= max")
    if args.dtype not in DTYPES:
        problems.append(f"--dtype={args.dtype}: pick one of {', '.join(DTYPES)}")
    if problems:
        parser.error("; ".join(problems))
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure every batch size (one process each), print the table, write the JSON; the exit status
    is 1 when graphkv fails somewhere or, on a float32 model, its tokens differ from ``generate``'s."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.gpu and not torch.cuda.is_available():
        print("--gpu needs CUDA (torch.cuda.is_available() is False); run without --gpu for the CPU mode",
              file=sys.stderr)
        return 2
    if args.child_batch is not None:
        print(json.dumps(measure_batch(args, args.child_batch, args.bandwidth)))
        return 0
    import transformers

    described, bandwidth = set_up(args), copy_bandwidth(args.device)
    device = torch.cuda.get_device_name() if args.gpu else f"CPU ({platform.processor() or platform.machine()})"
    print(f"gpu_serving: graphkv.hf vs transformers {transformers.__version__} on {device}; {described}")
    print(f"workload: qwen3-like {args.dtype}, prompts {args.min_prompt}-{args.max_prompt} tokens (seed 1 + batch), "
          f"{args.new_tokens} new tokens, batches {args.batches}, step budget {args.step_tokens}; copy bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s (read + written); transformers' static compile mode "
          f"{'reduce-overhead' if args.gpu else 'default (reduce-overhead is CUDA graphs)'}", flush=True)
    print(f"graphkv: --compile {args.compile}" + "".join(f", {flag}" for flag, on in (
        ("--merge-projections", args.merge_projections), ("--small-matmul", args.small_matmul),
        ("--trace-layers", args.trace_layers)) if on), flush=True)
    rows: list[dict[str, Any]] = []
    result = {"device": device, "torch": torch.__version__, "transformers": transformers.__version__,
              "threads": torch.get_num_threads(), "copy_bytes_per_s": bandwidth, "rows": rows,
              **{k: getattr(args, k) for k in (*MODES["cpu"], "repeats", "compile", "contenders")}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for batch in (int(b) for b in args.batches.split(",")):
        rows.append(run_batch(argv, batch, bandwidth, args.contenders, args.gpu))
        args.out.write_text(json.dumps(result, indent=2))  # what is measured so far survives a later crash
    print_table(rows, args.contenders)
    result["targets"] = issue_targets(rows)
    args.out.write_text(json.dumps(result, indent=2))
    print("issue 20's targets (for an H100): " + ("; ".join(
        f"{k}: {v:.2f} ({'met' if ok else 'missed'})" for k, (v, ok) in result["targets"].items()) or "none measured"))
    print("x limit: ms/step over the batch's limit; equal: requests whose tokens equal generate's; graphkv x: its "
          "tok/s over the peer's, the peer's ms/step over its (the module docstring defines every column)")
    if any(c.get("isolated") for r in rows for c in r.values() if isinstance(c, dict)):
        print("*: measured in a process of its own (gpu_serving.ISOLATED: beside graphkv in one process it made "
              "graphkv's next step fault on an H100)")
    failed = [r["batch"] for r in rows if "graphkv" in args.contenders and "tok_s" not in r.get("graphkv", {})]
    if args.dtype == "float32" and {"graphkv", "generate"} <= set(args.contenders):
        failed += [r["batch"] for r in rows if r.get("graphkv", {}).get("equal_to_generate", -1) != r["batch"]]
    if failed:
        print(f"graphkv failed, or its float32 tokens differ from generate's, at batch {sorted(set(failed))}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
