"""Flex mask build time: straight from the block tables vs ``create_block_mask`` over the same cache.

For each cached-token count (1k .. 16k) a plan with the ``flex`` backend is compiled
(``max_model_len`` = the cached tokens, pool = those tokens plus slack), requests are laid out on
shuffled pages, and two batches are timed:

- ``decode``: 32 requests, one new token each;
- ``mixed``: one 512-token prefill chunk plus 31 decodes.

``direct`` is :meth:`FlexMaskBuilder.build` (everything in place, no host sync); ``create`` is
``torch.nn.attention.flex_attention.create_block_mask`` evaluating the same mask_mod densely over
(padded query tokens x every cache slot), which is what a per-step rebuild costs. Both must give
the same block lists (checked). Prints a table with the ratio and writes JSON.

A second table times the same 32-request decode step's build under a 256-token and an 8192-token
budget (``max_num_batched_tokens``): the build rebuilds only the query tiles its padded tokens
cover, so the large budget must cost at most 2x the small one (before, it rebuilt every tile the
budget allowed: 64 instead of 1).

``--gpu`` adds paged flex decode latency (the compiled decode region serving runs) vs dense SDPA over
each request's contiguous K/V on the same data; without CUDA it says so and skips.

    python benchmarks/flex_mask.py                  # CPU table, writes benchmarks/results/flex_mask.json
    python benchmarks/flex_mask.py --gpu --repeats 50
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.nn.attention.flex_attention import create_block_mask
from timing import add_common_arguments, interleaved_medians, set_up

import graphkv
from graphkv import FullAttentionSpec, Limits, ModelKV
from graphkv.runtime.flex.region import FlexRegions
from graphkv.runtime.flex.views import paged_kv_views
from graphkv.runtime.flex.mask import FlexMaskBuilder

CACHED_TOKENS = (1024, 2048, 4096, 8192, 16384)
TARGET_RATIO = 10.0  # direct must be >= 10x faster at 4k+ cached tokens
BUDGETS = (256, 8192)  # tokens per step: a decode step's build under the larger within 2x of the smaller
BUDGET_TARGET = 2.0
KBS, HQ, HKV, HEAD = 16, 8, 2, 64
NUM_REQS = 32
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "flex_mask.json"


def median_ms(fn: Callable[[], Any], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    """Median wall-clock milliseconds of ``fn`` over ``repeats`` calls, after one warm-up."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def make_step(cached: int, kind: str, device: str, budget: int = 1024) -> dict[str, Any]:
    """A plan (``budget`` tokens per step), persistent inputs filled for one step, a builder and the step's shapes."""
    query_lens = [1] * NUM_REQS if kind == "decode" else [512] + [1] * (NUM_REQS - 1)
    first = cached // NUM_REQS if kind == "decode" else max(512, cached // 2)  # the prefill row holds half
    rest = (cached - first) // (NUM_REQS - 1)
    seq_lens = [first] + [rest] * (NUM_REQS - 1)
    seq_lens[0] += cached - sum(seq_lens)  # exactly `cached` tokens in the pool
    assert all(0 < q <= n for q, n in zip(query_lens, seq_lens)), seq_lens
    pages = [-(-s // KBS) for s in seq_lens]
    num_blocks = sum(pages) + 64
    spec = FullAttentionSpec(num_kv_heads=HKV, head_size=HEAD, dtype="float32")
    plan = graphkv.compile(ModelKV.from_specs("bench", [(spec, "flex")]),
                           Limits(max_model_len=max(seq_lens), max_num_seqs=NUM_REQS, max_num_batched_tokens=budget,
                                  num_blocks_override=num_blocks))
    group = plan.groups[0]
    gen = torch.Generator().manual_seed(cached)
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros(NUM_REQS, group.block_table_width, dtype=torch.int32)
    for r, n in enumerate(pages):
        table[r, :n] = torch.tensor([free.pop() for _ in range(n)], dtype=torch.int32)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    table, qsl, lens = table.to(device), qsl.to(device), lens.to(device)
    builder = FlexMaskBuilder.from_plan(plan, 0, block_table=table, query_start_loc=qsl, seq_lens=lens)
    num_tokens = int(qsl[-1])
    return {"plan": plan, "builder": builder, "table": table, "qsl": qsl, "seq_lens": seq_lens,
            "query_lens": query_lens, "num_tokens": num_tokens, "num_blocks": num_blocks}


def block_sets(kv_num_blocks: torch.Tensor, kv_indices: torch.Tensor) -> list[set[int]]:
    """Each query tile's kernel blocks as a set."""
    nums = kv_num_blocks.reshape(-1).tolist()
    rows = kv_indices.reshape(len(nums), -1)
    return [set(rows[t, :n].tolist()) for t, n in enumerate(nums)]


def measure_masks(repeats: int) -> list[dict[str, Any]]:
    """One row per (cached tokens, batch kind): direct vs create_block_mask milliseconds."""
    rows = []
    for cached in CACHED_TOKENS:
        for kind in ("decode", "mixed"):
            s = make_step(cached, kind, "cpu")
            builder, n = s["builder"], s["num_tokens"]
            kv_len = builder.geometry.kv_tokens
            direct = median_ms(lambda: builder.build(NUM_REQS, num_tokens_padded=n), repeats)
            mask = builder.build(NUM_REQS, num_tokens_padded=n)

            def create() -> Any:
                return create_block_mask(builder.mask_mod, None, None, n, kv_len, device="cpu",
                                         BLOCK_SIZE=(builder.geometry.q_tile_tokens, KBS))

            slow = median_ms(create, max(3, repeats // 10))
            ref = create()
            ours = [partial | full for partial, full in zip(block_sets(mask.kv_num_blocks, mask.kv_indices),
                                                             block_sets(mask.full_kv_num_blocks, mask.full_kv_indices))]
            theirs = [a | b for a, b in zip(block_sets(ref.kv_num_blocks, ref.kv_indices),
                                            block_sets(ref.full_kv_num_blocks, ref.full_kv_indices))]
            rows.append({"cached_tokens": cached, "batch": kind, "query_tokens": n, "kv_slots": kv_len,
                         "direct_ms": round(direct, 4), "create_block_mask_ms": round(slow, 4),
                         "ratio": round(slow / direct, 1), "same_blocks": ours == theirs,
                         "passed": cached < 4096 or slow / direct >= TARGET_RATIO})
    return rows


def measure_budgets(repeats: int) -> list[dict[str, Any]]:
    """One row per cached-token count: the decode step's build under each budget, interleaved."""
    rows = []
    for cached in CACHED_TOKENS:
        steps = [make_step(cached, "decode", "cpu", budget) for budget in BUDGETS]
        builds = {budget: lambda s=s: s["builder"].build(NUM_REQS, num_tokens_padded=s["num_tokens"])
                  for budget, s in zip(BUDGETS, steps)}
        medians = interleaved_medians(builds, repeats)
        small, large = (medians[budget] * 1e3 for budget in BUDGETS)
        tiles = [s["builder"].geometry.num_q_tiles for s in steps]
        rows.append({"cached_tokens": cached, "budget_tiles": f"{tiles[0]} / {tiles[1]}",
                     f"build_ms_{BUDGETS[0]}": round(small, 4), f"build_ms_{BUDGETS[1]}": round(large, 4),
                     "ratio": round(large / small, 2), "passed": large / small <= BUDGET_TARGET})
    return rows


def measure_gpu(repeats: int) -> list[dict[str, Any]] | str:
    """Decode latency, compiled paged flex vs dense SDPA on contiguous per-request K/V."""
    if not torch.cuda.is_available():
        return "skipped: CUDA is not available (torch.cuda.is_available() is False)"
    rows = []
    regions = FlexRegions(compile=True, name="bench_flex")  # what serving runs: one compiled region per group, phase
    for cached in CACHED_TOKENS:
        s = make_step(cached, "decode", "cuda")
        builder, n = s["builder"], s["num_tokens"]
        nkb = builder.geometry.num_kernel_blocks
        cache = torch.randn(2, nkb, KBS, HKV, HEAD, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(n, HQ, HEAD, device="cuda", dtype=torch.bfloat16)
        builder.build(NUM_REQS, num_tokens_padded=n)
        key, value = paged_kv_views(cache)  # built once, outside the compiled region
        flex_ms = median_ms(lambda: regions.attend(q, key, value, builder, phase="decode", scale=HEAD ** -0.5),
                            repeats, torch.cuda.synchronize)
        # Dense: each request's K/V gathered once (outside the timing) into [R, Hkv, L, D].
        longest = max(s["seq_lens"])
        k = torch.zeros(NUM_REQS, HKV, longest, HEAD, device="cuda", dtype=torch.bfloat16)
        v = torch.zeros_like(k)
        keep = torch.zeros(NUM_REQS, 1, 1, longest, dtype=torch.bool, device="cuda")
        for r, length in enumerate(s["seq_lens"]):
            x = torch.arange(length, device="cuda")
            slots = s["table"][r, x // KBS].long() * KBS + x % KBS
            k[r, :, :length] = cache[0].reshape(-1, HKV, HEAD)[slots].transpose(0, 1)
            v[r, :, :length] = cache[1].reshape(-1, HKV, HEAD)[slots].transpose(0, 1)
            keep[r, ..., :length] = True
        qd = q.view(NUM_REQS, 1, HQ, HEAD).transpose(1, 2)
        sdpa_ms = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
            qd, k, v, attn_mask=keep, enable_gqa=True), repeats, torch.cuda.synchronize)
        build_ms = median_ms(lambda: builder.build(NUM_REQS, num_tokens_padded=n), repeats, torch.cuda.synchronize)
        rows.append({"cached_tokens": cached, "flex_decode_ms": round(flex_ms, 4), "sdpa_dense_ms": round(sdpa_ms, 4),
                     "mask_build_ms": round(build_ms, 4), "device": torch.cuda.get_device_name()})
    return rows


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """A fixed-width table of ``columns``."""
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(str(r[c]).rjust(w) for c, w in zip(columns, widths)))


def main(argv: list[str] | None = None) -> int:
    """Run, print, write JSON; exit 1 when a size misses the target or the block lists differ."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, repeats=30, out=DEFAULT_OUT, gpu="also time paged flex decode vs dense SDPA on CUDA")
    args = parser.parse_args(argv)
    measured_with = set_up(args)

    rows = measure_masks(args.repeats)
    print(f"flex mask build, CPU (torch threads {torch.get_num_threads()}), kbs={KBS}, q_tile=128, {NUM_REQS} requests")
    print_table(rows, ["cached_tokens", "batch", "query_tokens", "kv_slots", "direct_ms", "create_block_mask_ms",
                       "ratio", "same_blocks", "passed"])
    budgets = measure_budgets(args.repeats)
    print(f"\ndecode step ({NUM_REQS} requests) build under a {BUDGETS[0]}- and a {BUDGETS[1]}-token budget "
          f"({measured_with}); target: ratio <= {BUDGET_TARGET}")
    print_table(budgets, ["cached_tokens", "budget_tiles", f"build_ms_{BUDGETS[0]}", f"build_ms_{BUDGETS[1]}", "ratio",
                          "passed"])
    result: dict[str, Any] = {"torch": torch.__version__, "machine": platform.machine(),
                              "threads": torch.get_num_threads(), "target_ratio_at_4k_plus": TARGET_RATIO,
                              "mask_build": rows, "budgets": budgets}
    if args.gpu:
        gpu = measure_gpu(args.repeats)
        result["gpu_decode"] = gpu
        if isinstance(gpu, str):
            print(f"--gpu: {gpu}")
        else:
            print_table(gpu, ["cached_tokens", "flex_decode_ms", "sdpa_dense_ms", "mask_build_ms"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    failed = [f"{r['cached_tokens']} cached tokens, {r['batch']}" for r in rows if not (r["passed"] and r["same_blocks"])]
    failed += [f"{r['cached_tokens']} cached tokens, budget ratio {r['ratio']}" for r in budgets if not r["passed"]]
    if failed:
        print("missed: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
