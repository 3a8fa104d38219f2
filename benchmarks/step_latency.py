"""Step latency of the demo model: host-side step preparation, and decode steps eager vs captured.

Two tables:

1. **Host step preparation** (CPU and GPU): per decode step at batch 1..256, the host
   bookkeeping (checks, request rows, staging array) and the whole ``Step.prepare`` (bookkeeping
   plus one staging copy, the table gather, slot mappings, state pages and flex mask build
   launched). On a GPU the device work is only launched (Triton kernels for the tables and
   slots), so ``prepare`` is host time; on a CPU it also runs (the runtime's torch kernels), so
   the CPU ``prepare`` column is an upper bound, not a launch cost. ``device ops`` counts the
   torch operations one prepare dispatches (on a GPU add 2 Triton launches, gather and slot
   mapping, which replace the CPU's torch ops for them). Target: < 100 us host time at batch 256.
2. **Decode step latency** (GPU only): one decode step of the demo model (``Step.run``),
   eager vs replaying a captured CUDA graph, side by side in one run, median of repeats.

Usage: ``python benchmarks/step_latency.py [--repeats N] [--max-batch 256]``. Writes
``benchmarks/results/step_latency.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import graphkv
from graphkv.models.paged_tiny_hybrid import PagedTinyHybrid
from graphkv.models.tiny_hybrid import TinyHybridConfig, init_weights, model_kv
from graphkv.runtime.capture.graphs import capture
from graphkv.runtime.pool.allocate import allocate
from graphkv.runtime.step.batch import Batch
from graphkv.runtime.step.step import Step

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PROMPT = 8


def build(max_batch: int, device: str):
    """The demo model's plan for ``max_batch`` decoding requests, its pool, a Step and the model."""
    config = TinyHybridConfig()
    limits = graphkv.Limits(max_model_len=256, max_num_seqs=max_batch, max_num_batched_tokens=max(256, max_batch))
    plan = graphkv.compile(model_kv(config), limits, graphkv.Budget.kv_bytes(f"{max(4, max_batch // 8)}MiB"))
    pool = allocate(plan, device)
    model = PagedTinyHybrid(init_weights(config).to(device), pool)
    return plan, Step(plan, device), model


def admit(step: Step, plan, n: int) -> tuple[list[Batch], Batch]:
    """The prefill batches (256 tokens each) of ``n`` requests of PROMPT tokens (pages 1..) and
    the decode batch after them."""
    pages = []
    next_page = 1
    for _ in range(n):
        per_group = []
        for g in plan.groups:
            per_group.append((next_page,))
            next_page += 1
        pages.append(tuple(per_group))
    per_step = 256 // PROMPT
    prefills = [Batch(req_ids=tuple(range(i, min(n, i + per_step))), query_lens=(PROMPT,) * min(per_step, n - i),
                      seq_lens=(PROMPT,) * min(per_step, n - i), new_pages=tuple(pages[i:i + per_step]))
                for i in range(0, n, per_step)]
    decode = Batch(req_ids=tuple(range(n)), query_lens=(1,) * n, seq_lens=(PROMPT + 1,) * n)
    return prefills, decode


def fresh_batch(step: Step, plan, n: int, run_prefill) -> Batch:
    """Finish every request, prefill ``n`` new ones with ``run_prefill(batch)``; the decode batch."""
    for r in list(step.active_requests):
        step.finish(r)
    prefills, decode = admit(step, plan, n)
    for prefill in prefills:
        run_prefill(prefill)
    return decode


def timed(fn, repeats: int, sync: bool) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs (after one warm-up)."""
    fn()
    samples = []
    for _ in range(repeats):
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def count_device_ops(step: Step, batch: Batch) -> int:
    """Torch operations one ``prepare`` of ``batch`` dispatches (Triton launches not included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    with Count() as c:
        step.prepare(batch)
    return c.n


def host_table(max_batch: int, repeats: int, device: str) -> list[dict]:
    """Table 1 rows."""
    plan, step, _ = build(max_batch, device)
    rows = []
    for n in (b for b in BATCHES if b <= max_batch):
        decode = fresh_batch(step, plan, n, step.prepare)

        def bookkeeping() -> None:
            n_req, num_tokens, qlens, slens, known = step._check(decode)
            rows_ = step._assign_rows(decode, known, slens)
            step._stage(n_req, num_tokens, n_req, qlens, slens, rows_)

        host_s = timed(bookkeeping, repeats, sync=False)
        prep_s = timed(lambda: step.prepare(decode), repeats, sync=False)
        rows.append({"batch": n, "bookkeeping_us": host_s * 1e6, "prepare_us": prep_s * 1e6,
                     "device_ops": count_device_ops(step, decode)})
    return rows


def latency_table(max_batch: int, repeats: int) -> list[dict]:
    """Table 2 rows (GPU): decode step eager vs captured."""
    plan, step, model = build(max_batch, "cuda")
    fwd = capture(plan, static_inputs={"input_ids": step.input_ids})(model.forward)
    fwd.capture(progress=True, prepare=step.capture_context)
    rows = []
    for n in (b for b in BATCHES if b <= max_batch):
        decode = fresh_batch(step, plan, n, lambda b: step.run(model, b, input_ids=[1] * b.num_tokens))
        ids = torch.ones(n, dtype=torch.int64, device="cuda")
        eager_s = timed(lambda: step.run(model, decode, input_ids=ids), repeats, sync=True)
        graph_s = timed(lambda: step.run(fwd, decode, input_ids=ids), repeats, sync=True)
        rows.append({"batch": n, "eager_ms": eager_s * 1e3, "captured_ms": graph_s * 1e3,
                     "speedup": eager_s / graph_s})
    return rows


def main() -> None:
    """Run both tables and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--max-batch", type=int, default=256)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or platform.machine()}, " \
                                                                 f"{torch.get_num_threads()} threads, torch kernels)"
    print(f"step preparation, demo model (MAMA, flex + gated recurrence), decode steps, {where}")
    host = host_table(args.max_batch, args.repeats, device)
    print(f"{'batch':>6} {'bookkeeping_us':>15} {'prepare_us':>12} {'device_ops':>11}")
    for r in host:
        print(f"{r['batch']:>6} {r['bookkeeping_us']:>15.1f} {r['prepare_us']:>12.1f} {r['device_ops']:>11}")
    result = {"device": where, "host": host}
    if device == "cuda":
        lat = latency_table(args.max_batch, args.repeats)
        print(f"\ndecode step latency, eager vs captured ({where})")
        print(f"{'batch':>6} {'eager_ms':>10} {'captured_ms':>12} {'speedup':>8}")
        for r in lat:
            print(f"{r['batch']:>6} {r['eager_ms']:>10.3f} {r['captured_ms']:>12.3f} {r['speedup']:>8.2f}")
        result["latency"] = lat
    else:
        print("\ndecode step latency eager vs captured: skipped, needs a CUDA GPU (graphs cannot be captured on CPU)")
    out = Path(__file__).parent / "results" / "step_latency.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
