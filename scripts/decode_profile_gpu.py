"""Where a graphkv.hf decode step's time goes, per compile mode: kernels launched, their device time, the wall.

A GPU diagnostic for issue 20 (decode within 1.3x of the bandwidth limit). ``python scripts/decode_profile_gpu.py``
serves ``--batch`` requests of ``--context`` prompt tokens on the serving benchmark's 0.94B qwen3-like bf16 model
(``benchmarks/gpu_serving.py``'s ``GPU_MODEL``, ``--layers`` of its 16 layers) under each ``--modes`` compile mode, each
in its own process, and for the decode steps in which every request decodes prints:

- ``kernels``: device kernels per step (the profiler's CUDA kernel events; memcpy / memset apart);
- ``kernel us``: their summed device time per step, and what it would be at the device's copy bandwidth for the
  weights and KV bytes the step reads (the step's bandwidth limit);
- ``wall ms``: the step's wall time in the engine (unprofiled steps), with the engine's overlap (each decode step
  launched before the host reads the last one's tokens), so ``wall - kernel`` is what the gaps between kernels and
  the host work the overlap could not hide add;
- ``sync ms``: the same serve with ``overlap=False`` (every step's tokens read before the next is scheduled): the
  host's work per step is ``sync - wall`` more;
- ``device ms``: the device's own time between consecutive timed steps (CUDA events recorded on the serving stream
  after each step's launch, unprofiled): a step's kernels plus any idle gap, without the profiler's overhead, to
  check ``kernel us`` and ``wall ms`` against each other;
- then, per mode, the step's kernels by kind (:func:`kernel_kinds`: matmuls, Inductor's fused kernels, graphkv's
  decode attention and K/V write, flex attention, the rest), each with its launches, microseconds per step and per
  launch: a kind of many launches of 2-3 us each is bound by launches, a kind near the bandwidth limit by bytes;
- and the ``--top`` kernels by device time per step (name, launches and microseconds per step, share of the step's
  kernel time): where the time above the bandwidth limit goes (matmuls reading weights, attention, the fused
  elementwise kernels, the sampler).

``fused`` traces the forward once for every step size: the step's sizes are backed (Inductor sizes its kernels by
them) and the shape guard Dynamo's specialisation at 1 wrote is dropped (:mod:`graphkv.runtime.capture.size_guards`),
so a batch-1 decode step runs the trace of 2 tokens or more. ``fused-1tok`` keeps that guard, as graphkv.hf served
from 2026-11-26 (ninth session) to 2026-11-27: 1-token steps get a trace of their own, every piece compiled by
Inductor a second time for exactly one token. Run the two at ``--batch 1`` to see what the second trace (Dynamo's
second trace was 6-7 s of a 16-layer tiny Qwen3's set-up on a 2-core CPU) buys the decode step, if anything.
``fused-unbacked`` is ``fused`` with the step's sizes unbacked, as graphkv.hf served from 2026-11-26 (sixth session)
until an H100 showed what that costs the decode step: 433 kernels and 1.547 ms at batch 1 against 291 and 1.359 ms
with backed sizes.

``fused-merged`` is ``fused`` with ``merge_projections=True`` (:mod:`graphkv.hf.projections`): each layer's q / k / v
and gate / up projections run as one matmul, 3 launches fewer per layer. Run it beside ``fused`` to see whether the
merge pays on the device before it becomes the default. ``fused-small`` is ``fused-merged`` with
``small_matmul=True``: the decode step's matmuls (at most 8 tokens) run graphkv's small-matmul kernel
(:mod:`graphkv.kernels.small_matmul`) instead of cuBLAS, which read the weights at about 2.0 TB/s (0.7x a copy) in the
ninth session's profile; ``benchmarks/gpu_linear.py`` compares the two matmul by matmul.

A traced Qwen3 layer launches about 57 kernels per decode step; ``compile="fused"`` compiles the pieces between
attention calls with Inductor. ``--device cpu`` runs the GPU path on a CPU (Triton interpreted; no device kernels to
count, the wall only) for this script's test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gpu_serving import (COMPILE_BY_NAME, GPU_MODEL, copy_bandwidth, kv_bytes_per_token,  # noqa: E402
                         prompts_for, serving_loop_for, sync, weight_bytes)  # the serving benchmark's model, prompts and byte counts, not copies

MODES = ("attention", "model", "piecewise", "fused", "fused-1tok", "fused-unbacked", "fused-merged", "fused-small")
ONE_TOKEN = "fused-1tok"  # "fused" with a second trace for 1-token steps (see the docstring)
UNBACKED = "fused-unbacked"  # "fused" with the step's sizes unbacked, one trace (see the docstring)
MERGED = "fused-merged"  # "fused" with merged q/k/v and gate/up projections (see the docstring)
SMALL = "fused-small"  # "fused-merged" with graphkv's small-matmul kernel for steps of a few tokens


def _summed(kernels: list[tuple[str, float]], label: Any) -> tuple[list[tuple[str, int, float]], float]:
    """``(label, launches, device us)`` of ``(name, device us)`` events summed by ``label(name)``, largest time
    first (ties by label), and the time of them all (1.0 when there is none, a share's denominator)."""
    by_label: dict[str, list[float]] = {}
    for name, us in kernels:
        entry = by_label.setdefault(label(name), [0, 0.0])
        entry[0] += 1
        entry[1] += us
    ranked = sorted(by_label.items(), key=lambda item: (-item[1][1], item[0]))
    return [(key, int(n), us) for key, (n, us) in ranked], sum(us for _, us in kernels) or 1.0


def top_kernels(kernels: list[tuple[str, float]], steps: int, top: int) -> list[dict[str, Any]]:
    """The ``top`` kernel names by summed device time, from ``(name, device us)`` events over ``steps`` steps:
    each name's launches and microseconds per step and share of all kernels' time, largest first (ties by name)."""
    ranked, total = _summed(kernels, lambda name: name)
    return [{"name": name, "launches_per_step": n / steps, "us_per_step": us / steps, "share": us / total}
            for name, n, us in ranked[:top]]


# (kind, name fragments) in the order a kernel's name is matched; the first match wins.
KERNEL_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("graphkv decode attention", ("_paged_decode",)),
    ("graphkv K/V write", ("reshape_and_cache",)),
    ("graphkv small matmul", ("_small_matmul",)),
    ("flex attention", ("flex", "triton_tem_")),
    ("inductor fused", ("triton_poi_", "triton_red_", "triton_per_", "triton_")),
    ("matmul", ("gemm", "gemv", "cutlass", "nvjet", "xmma", "cublas", "splitk", "sm90_", "sm80_")),
)


def kernel_kind(name: str) -> str:
    """The kind of a device kernel by its name (:data:`KERNEL_KINDS`; ``"other"`` for none of them)."""
    lowered = name.lower()
    return next((kind for kind, fragments in KERNEL_KINDS if any(f in lowered for f in fragments)), "other")


def kernel_kinds(kernels: list[tuple[str, float]], steps: int) -> list[dict[str, Any]]:
    """The kernels of ``steps`` steps summed by :func:`kernel_kind`: each kind's launches and microseconds per step,
    microseconds per launch and share of all kernels' time, largest first (ties by kind)."""
    ranked, total = _summed(kernels, kernel_kind)
    return [{"kind": kind, "launches_per_step": n / steps, "us_per_step": us / steps, "us_per_launch": us / n,
             "share": us / total} for kind, n, us in ranked]


def profile_mode(mode: str, *, layers: int, batch: int, context: int, steps: int, device: str,
                 top: int = 8) -> dict[str, Any]:
    """Serve one mode and measure its full-batch decode steps (see the module docstring)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from graphkv.hf.tiny import tiny_config
    from graphkv.models.demo_engine import DemoRequest

    if mode in (UNBACKED, ONE_TOKEN):  # how graphkv.hf traced before (see the docstring)
        import graphkv.hf.model as paged_model

        if mode == UNBACKED:  # the marks of the sixth to eighth sessions
            paged_model._mark_step_dynamic = torch._dynamo.decorators.mark_unbacked
        else:  # every guard kept: Dynamo traces 1-token steps again
            paged_model.step_size_guard_filter = lambda *args, **kwargs: None
    torch.manual_seed(0)
    widths = {**GPU_MODEL, "num_hidden_layers": layers} if device == "cuda" else {"num_hidden_layers": layers}
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(tiny_config("qwen3", **widths),
                                                 dtype=torch.bfloat16 if device == "cuda" else torch.float32).eval()
    vocab = int(model.config.vocab_size)
    prompts = prompts_for(batch, vocab, context, context)
    new_tokens = 2 * steps + 4  # warm-up, profiled and timed decode steps
    start = time.perf_counter()
    compile_name = "fused" if mode in (ONE_TOKEN, UNBACKED, MERGED, SMALL) else mode
    loop = serving_loop_for(model, prompts, new_tokens, step_tokens=2048, compile=COMPILE_BY_NAME[compile_name],
                            kernels="auto" if device == "cuda" else "triton",
                            merge_projections=mode in (MERGED, SMALL), small_matmul=mode == SMALL)
    build_s = time.perf_counter() - start
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    prof = profile(activities=activities)
    state = {"decode": 0, "at": 0.0, "tokens": 0, "generated": 0, "profiling": False}
    walls: list[float] = []
    events: list[Any] = []  # a CUDA event per timed step, recorded on the serving stream after its launch

    def on_step(stats: Any) -> None:
        now = time.perf_counter()
        tokens, generated = stats.tokens - state["tokens"], stats.generated - state["generated"]
        state.update(tokens=stats.tokens, generated=stats.generated)
        full = tokens == generated == batch  # every request decoded one token
        if full:
            state["decode"] += 1
            if state["profiling"] and state["decode"] == 4 + steps:
                sync(device)
                prof.stop()
                state["profiling"] = False
            elif state["decode"] > 4 + steps:
                walls.append(now - state["at"])
                if device == "cuda":  # after step n+1's kernels in the stream: consecutive events are one step apart
                    events.append(torch.cuda.Event(enable_timing=True))
                    events[-1].record()
            if state["decode"] == 3:  # three warm decode steps, then profile the next ``steps``
                prof.start()
                state["profiling"] = True
        state["at"] = time.perf_counter()

    engine = loop.engine()
    engine.run([DemoRequest(req_id=i, prompt=p, max_new_tokens=new_tokens) for i, p in enumerate(prompts)],
               on_step=on_step)
    sync(device)
    # The same serve with every step's tokens read before the next is scheduled: the host's work is not overlapped.
    sync_walls: list[float] = []
    last = {"at": 0.0, "tokens": 0, "generated": 0, "decode": 0}

    def on_sync_step(stats: Any) -> None:
        now = time.perf_counter()
        if stats.tokens - last["tokens"] == stats.generated - last["generated"] == batch:  # every request decoded
            last["decode"] += 1
            if last["decode"] > 3:
                sync_walls.append(now - last["at"])
        last.update(at=time.perf_counter(), tokens=stats.tokens, generated=stats.generated)

    loop.engine(overlap=False).run([DemoRequest(req_id=("sync", i), prompt=p, max_new_tokens=new_tokens)
                                    for i, p in enumerate(prompts)], on_step=on_sync_step)
    sync(device)
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA
               and not e.name.lower().startswith(("memcpy", "memset"))]
    kv_tokens = batch * (context + 3 + steps // 2)  # what the middle profiled step reads
    traces = len(loop.model.piecewise.splits) if loop.model.piecewise is not None else None
    graphs = loop.graphs if traces is None else f"{traces} trace(s); {loop.graphs}"
    return {"mode": mode, "build_s": build_s, "graphs": graphs, "kernels_per_step": len(kernels) / steps,
            "kernel_us_per_step": sum(e.device_time_total for e in kernels) / steps,
            "wall_ms_per_step": 1e3 * statistics.median(walls) if walls else None,
            "sync_wall_ms_per_step": 1e3 * statistics.median(sync_walls) if sync_walls else None,
            "device_ms_per_step": (statistics.median(a.elapsed_time(b) for a, b in zip(events, events[1:]))
                                   if len(events) > 1 else None),
            "overlapped_steps": engine.stats.overlapped,
            "top": top_kernels([(e.name, e.device_time_total) for e in kernels], steps, top),
            "kinds": kernel_kinds([(e.name, e.device_time_total) for e in kernels], steps),
            "read_bytes": weight_bytes(model) + kv_tokens * kv_bytes_per_token(model),
            "kept_guards": [list(g) for g in getattr(getattr(loop.model, "size_guards", None), "kept", None) or ()]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES), help="compile modes (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=16, help="model layers (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=1, help="requests (default: %(default)s)")
    parser.add_argument("--context", type=int, default=512, help="prompt tokens per request (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=20,
                        help="profiled (and timed) decode steps (default: %(default)s)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="default: %(default)s")
    parser.add_argument("--top", type=int, default=8, help="kernels listed per mode (default: %(default)s)")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one mode, in this process
    args = parser.parse_args(argv)
    sizes = dict(layers=args.layers, batch=args.batch, context=args.context, steps=args.steps, device=args.device,
                 top=args.top)
    if args.mode:
        print(json.dumps(profile_mode(args.mode, **sizes)))
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("decode_profile_gpu.py: CUDA is not available here (use --device cpu for the GPU path on a CPU)",
              file=sys.stderr)
        return 2
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        print(f"--modes: {unknown or modes} not among {', '.join(MODES)}", file=sys.stderr)
        return 2
    bandwidth = copy_bandwidth(args.device)
    where = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"graphkv.hf decode steps on {where}: qwen3-like, {args.layers} layers, batch {args.batch}, context "
          f"{args.context}, {args.steps} profiled steps; copy bandwidth {bandwidth / 1e9:,.0f} GB/s; torch "
          f"{torch.__version__}")
    print(f"{'mode':<12} {'kernels':>8} {'kernel us':>10} {'limit us':>9} {'wall ms':>8} {'sync ms':>8} "
          f"{'device ms':>9} {'build s':>8}  graphs")
    failed = 0
    for mode in modes:
        cmd = [sys.executable, __file__, "--mode", mode] + [f"--{k}={v}" for k, v in sizes.items()]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            failed += 1
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:200]
            print(f"{mode:<12} FAILED: {tail}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        wall, sync_wall, device_ms = ("n/a" if r[k] is None else f"{r[k]:.3f}" for k in (
            "wall_ms_per_step", "sync_wall_ms_per_step", "device_ms_per_step"))
        print(f"{mode:<12} {r['kernels_per_step']:>8.1f} {r['kernel_us_per_step']:>10.1f} "
              f"{1e6 * r['read_bytes'] / bandwidth:>9.1f} {wall:>8} {sync_wall:>8} {device_ms:>9} "
              f"{r['build_s']:>8.1f}  {r['graphs'][:80]}")
        for guard in r.get("kept_guards") or ():  # why it traced again (size_guards)
            print(f"{'':<12} kept shape guard: {'; '.join(guard)[:400]}")
        # each mode's kernels printed as soon as it ends: a step cut off at its limit keeps the modes done
        for title, rows in (("kernels by kind, per step", r.get("kinds", [])), ("top kernels by device time per step",
                                                                                 r["top"])):
            if rows:
                print(f"  {mode}: {title}")
                for k in rows:  # a kind's row also says its microseconds per launch
                    each = f"{k['us_per_launch']:>6.2f} us each  " if "kind" in k else ""
                    print(f"    {k['us_per_step']:>9.1f} us  {100 * k['share']:>5.1f}%  "
                          f"{k['launches_per_step']:>6.1f} x  {each}{k.get('kind', k.get('name', ''))[:100]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
