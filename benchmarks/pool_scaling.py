"""A compiled decode step's cost against the pool's size: 4 MiB and 512 MiB pools, side by side.

A step's cost must not grow with the pool. It did: the K/V write compiled into the attention call
(an ``index_put_`` into a view of the pool) was functionalized into a copy of the whole layer cache
every call — on this CPU a tiny Qwen3's decode step (4 requests) took 7 ms over a 4 MiB pool and
892 ms over a 512 MiB one. Now the write is a mutating custom op outside the compiled flex regions
(``compile=True``), and a model compiled whole (``compile="model"``) calls its attention layers as
opaque ops, so the pool never enters a compiled graph.

For each compile mode, one :class:`~graphkv.hf.ServingLoop` per pool size serves the same 4-request
decode step (after a 5-token prefill each); the loops' steps are timed interleaved (medians, each
round in a fresh seeded random order), and the table prints each pool's median and the ratio of the
largest pool to the smallest. Exits non-zero when a ratio is above :data:`TARGET_RATIO`.

    python benchmarks/pool_scaling.py                 # CPU, torch threads 1; writes benchmarks/results/pool_scaling.json
    python benchmarks/pool_scaling.py --gpu --pools 64MiB,8GiB
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from timing import add_common_arguments, interleaved_medians, set_up

import graphkv
from graphkv.hf import ServingLoop, tiny_model
from graphkv.runtime import Batch

TARGET_RATIO = 1.5  # the largest pool's decode step within 1.5x of the smallest's
NUM_REQS = 4
LIMITS = graphkv.Limits(max_model_len=256, max_num_seqs=NUM_REQS, max_num_batched_tokens=64,
                        cudagraph_mode=graphkv.CudaGraphMode.FULL_DECODE_ONLY)


def decode_step(model: Any, pool: str, compile_mode: "bool | str", device: str) -> tuple[Callable[[], None], int]:
    """A loop over a ``pool`` KV budget, prefilled, and a callable running one 4-request decode step
    (the same step each time: a rollback to the same lengths is allowed); returns it and the pool's pages."""
    loop = ServingLoop(model, limits=LIMITS, budget=graphkv.Budget.kv_bytes(pool), device=device,
                       compile=compile_mode)
    groups = len(loop.plan.groups)
    ids = tuple(range(NUM_REQS))
    new = tuple(tuple((1 + i * groups + g,) for g in range(groups)) for i in ids)
    loop.run(Batch(req_ids=ids, query_lens=(5,) * NUM_REQS, seq_lens=(5,) * NUM_REQS, new_pages=new),
             input_ids=list(range(5 * NUM_REQS)))
    decode = Batch(req_ids=ids, query_lens=(1,) * NUM_REQS, seq_lens=(6,) * NUM_REQS)
    tokens = list(range(1, NUM_REQS + 1))

    def step() -> None:
        loop.run(decode, input_ids=tokens)
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # compiles the decode region
    return step, loop.plan.num_blocks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, repeats=30, out=Path("benchmarks/results/pool_scaling.json"),
                         gpu="serve on the GPU (CUDA graphs replay the decode steps)")
    parser.add_argument("--pools", default="4MiB,512MiB", help="KV pool sizes, smallest first (default: %(default)s)")
    parser.add_argument("--model-type", default="qwen3", help="tiny graphkv.hf family (default: %(default)s)")
    args = parser.parse_args(argv)
    setup = set_up(args)
    if args.gpu and not torch.cuda.is_available():
        print("--gpu: CUDA is not available here (torch.cuda.is_available() is False); nothing measured")
        return 0
    device = "cuda" if args.gpu else "cpu"
    pools = [p.strip() for p in args.pools.split(",") if p.strip()]
    model = tiny_model(args.model_type).to(device)
    from graphkv.hf.declare import model_kv

    if any(layer.spec.is_ssm for layer in model_kv(model).layers):
        print(f"--model-type {args.model_type}: has state (Mamba / gated-delta) layers, whose one state per request "
              "has absorbed every written token, so the same decode step cannot be timed again (graphkv refuses the "
              "rollback); pick an attention-only family, e.g. qwen3 (the default)", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    print(f"compiled decode step ({NUM_REQS} requests, tiny {args.model_type}) against the pool size on {device}; "
          f"{setup}")
    print(f"{'compile':>8} {'pool':>8} {'pages':>8} {'median ms':>10} {'ratio':>6}")
    rows, worst = [], 0.0
    for mode in (True, "model"):
        steps, pages = {}, {}
        for pool in pools:
            steps[pool], pages[pool] = decode_step(model, pool, mode, device)
        medians = interleaved_medians(steps, args.repeats)
        base = medians[pools[0]]
        for pool in pools:
            ratio = medians[pool] / base
            worst = max(worst, ratio)
            rows.append({"compile": str(mode), "pool": pool, "pages": pages[pool], "median_ms": medians[pool] * 1e3,
                         "ratio": ratio})
            print(f"{str(mode):>8} {pool:>8} {pages[pool]:>8,} {medians[pool] * 1e3:>10.2f} {ratio:>6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"setup": setup, "device": device, "target_ratio": TARGET_RATIO, "rows": rows},
                                   indent=2) + "\n")
    ok = worst <= TARGET_RATIO
    print(f"largest/smallest pool: {worst:.2f}x (target <= {TARGET_RATIO}x): {'ok' if ok else 'ABOVE TARGET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
