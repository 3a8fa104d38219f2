"""Paged decode attention: graphkv's split-KV kernel against paged flex attention and dense SDPA.

One decode step (one query token per request, every request holding the same number of cached
tokens; bf16, 8 KV heads, GQA 4, head size 128, kernel block 16) for 1, 8, 32, 128 and 256 requests
x 512, 4k, 16k and 32k cached tokens. The K/V sit in a kv-first NHD paged cache on shuffled kernel
blocks; three contenders read the same data, side by side in one run:

- ``graphkv``: :func:`graphkv.kernels.paged_attention.paged_decode_attention` reading the block
  table (persistent ``out`` and workspace, the split count of its rule, the device's SM count);
- ``flex``: graphkv's paged flex decode as served today (``FlexRegions(compile=True)``, phase
  "decode", graphkv's paged mask built once before timing), for cells of at most ``FLEX_MAX_TOKENS``
  cached tokens in all (it is linear in cached tokens and slow, and one pool serves every flex cell
  so it compiles once);
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` over K/V gathered once (untimed)
  into contiguous ``[requests, 8, tokens, 128]`` tensors, the 4 query heads of a KV head as 4 query
  rows (exactly GQA for one query token, and no ``enable_gqa`` copy).

Each cell prints milliseconds, GB/s of K/V bytes read (requests x tokens x 2 x 8 x 128 x 2 bytes)
and that as a fraction of a measured device-to-device copy (bytes read + written per second of a
1 GiB ``copy_``), graphkv's ratio to each peer (time / time, < 1 is graphkv faster) and each
output's largest difference from SDPA's. Times are medians of ``--repeats`` interleaved rounds (a
fresh random order each round); on a GPU each contender is a CUDA graph of several calls timed with
CUDA events (plain event-timed calls where capture fails, marked ``*``). Cells whose K/V fit in L2
are marked ``L2``: their bandwidth is not HBM's. A cell that does not fit in free memory is skipped.

Targets (GPU only; exit 1 when missed): graphkv at >= 0.75 of the copy bandwidth for 32 requests x
4k-16k tokens, and faster than SDPA in every cell.

    python benchmarks/gpu_attention.py          # CPU: four tiny cells under Triton's interpreter (proves it runs)
    python benchmarks/gpu_attention.py --gpu    # the table on CUDA, writes benchmarks/results/gpu_attention.json
    python benchmarks/gpu_attention.py --gpu --requests 32 --tokens 4096 16384   # the target rows only
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import attrs
import torch
import torch.nn.functional as F
from timing import add_common_arguments, interleaved_medians, set_up

import graphkv
from graphkv import CacheOrder, FullAttentionSpec, KVLayout, Limits, ModelKV
from graphkv.kernels.paged_attention import decode_workspace, num_decode_splits, paged_decode_attention
from graphkv.runtime.flex.mask import FlexMaskBuilder
from graphkv.runtime.flex.region import FlexRegions
from graphkv.runtime.flex.views import paged_kv_views

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gpu_attention.json"
CONTENDERS = ("graphkv", "flex", "sdpa")
LAYOUT = KVLayout(order=CacheOrder.KV_FIRST)  # what flex's flat K/V views need; graphkv reads every layout
TARGET_FRACTION, TARGET_CELLS = 0.75, {(32, 4096), (32, 16384)}
MAX_DIFF = 0.05  # bf16 outputs of one softmax over the same data


@attrs.frozen(kw_only=True)
class Setup:
    """One mode's shapes: the cells, the model's heads and the flex cap."""

    device: str
    requests: tuple[int, ...]
    cached_tokens: tuple[int, ...]
    kv_heads: int
    group: int
    head_size: int
    kernel_block_size: int
    flex_max_tokens: int
    copy_bytes: int

    @property
    def q_heads(self) -> int:
        return self.kv_heads * self.group

    def kv_bytes(self, requests: int, tokens: int) -> int:
        """K/V bytes a decode step over this cell reads (bf16)."""
        return requests * tokens * 2 * self.kv_heads * self.head_size * 2


GPU = Setup(device="cuda", requests=(1, 8, 32, 128, 256), cached_tokens=(512, 4096, 16384, 32768), kv_heads=8,
            group=4, head_size=128, kernel_block_size=16, flex_max_tokens=1 << 20, copy_bytes=1 << 30)
CPU = Setup(device="cpu", requests=(1, 3), cached_tokens=(97, 600), kv_heads=2, group=4, head_size=64,
            kernel_block_size=16, flex_max_tokens=4096, copy_bytes=1 << 26)


class FlexPool:
    """The one paged cache, table and mask builder every flex cell shares (one compiled region)."""

    def __init__(self, s: Setup) -> None:
        spec = FullAttentionSpec(num_kv_heads=s.kv_heads, head_size=s.head_size, dtype="bfloat16")
        limits = Limits(max_model_len=max(s.cached_tokens), max_num_seqs=max(s.requests),
                        max_num_batched_tokens=max(s.requests),
                        num_blocks_override=s.flex_max_tokens // s.kernel_block_size + 1)
        plan = graphkv.compile(ModelKV.from_specs("bench", [(spec, "flex")]), limits)
        seqs, width = max(s.requests), plan.groups[0].block_table_width
        dev = s.device
        self.table = torch.zeros(seqs, width, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(seqs + 1, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(seqs, dtype=torch.int32, device=dev)
        self.builder = FlexMaskBuilder.from_plan(plan, 0, block_table=self.table, query_start_loc=self.query_start_loc,
                                                 seq_lens=self.seq_lens)
        nkb = self.builder.geometry.num_kernel_blocks
        self.cache = torch.randn(2, nkb, s.kernel_block_size, s.kv_heads, s.head_size, device=dev,
                                 dtype=torch.bfloat16)
        self.key, self.value = paged_kv_views(self.cache)
        self.regions = FlexRegions(compile=dev == "cuda", name="bench_gpu_attention")


def make_cell(s: Setup, requests: int, tokens: int, flex: FlexPool | None, gen: torch.Generator) -> dict[str, Any]:
    """The cell's cache (the flex pool's when it serves this cell), a table of shuffled distinct kernel blocks, the
    query, and each contender's call."""
    kbs, dev = s.kernel_block_size, s.device
    per_req = -(-tokens // kbs)
    if flex is not None:
        cache = flex.cache
    else:
        cache = torch.randn(2, requests * per_req + 1, kbs, s.kv_heads, s.head_size, device=dev, dtype=torch.bfloat16)
    blocks = (torch.randperm(cache.shape[1] - 1, generator=gen)[:requests * per_req] + 1).view(requests, per_req)
    table = blocks.to(dev, torch.int32).contiguous()
    seq_lens = torch.full((requests,), tokens, dtype=torch.int32, device=dev)
    query = torch.randn(requests, s.q_heads, s.head_size, generator=gen).to(dev, torch.bfloat16)
    scale = s.head_size ** -0.5
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev == "cuda" else 132
    out = torch.empty_like(query)
    workspace = decode_workspace(requests, num_q_heads=s.q_heads, num_kv_heads=s.kv_heads, head_size=s.head_size,
                                 table_width_kernel_blocks=per_req, kernel_block_size=kbs, device=dev, num_sms=num_sms)

    def run_graphkv() -> torch.Tensor:
        return paged_decode_attention(query, cache, table, seq_lens, layout=LAYOUT, scale=scale, out=out,
                                      workspace=workspace, num_sms=num_sms)

    # Dense K/V for SDPA, gathered once request by request (one request's temporary at a time).
    k = torch.empty(requests, s.kv_heads, tokens, s.head_size, device=dev, dtype=torch.bfloat16)
    v = torch.empty_like(k)
    for r in range(requests):
        k[r] = cache[0][table[r].long()].reshape(-1, s.kv_heads, s.head_size)[:tokens].transpose(0, 1)
        v[r] = cache[1][table[r].long()].reshape(-1, s.kv_heads, s.head_size)[:tokens].transpose(0, 1)
    q_rows = query.view(requests, s.kv_heads, s.group, s.head_size)  # GQA: a KV head's query heads as query rows

    def run_sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q_rows, k, v, scale=scale).view(requests, s.q_heads, s.head_size)

    calls: dict[str, Callable[[], torch.Tensor]] = {"graphkv": run_graphkv, "sdpa": run_sdpa}
    if flex is not None:
        flex.table[:requests, :per_req] = table
        flex.seq_lens.zero_()
        flex.seq_lens[:requests] = tokens
        flex.builder.build(requests, num_tokens_padded=requests)

        def run_flex() -> torch.Tensor:
            return flex.regions.attend(query, flex.key, flex.value, flex.builder, phase="decode", scale=scale)

        calls["flex"] = run_flex
    splits = num_decode_splits(requests, num_kv_heads=s.kv_heads, table_width_kernel_blocks=per_req,
                               kernel_block_size=kbs, num_sms=num_sms)
    return {"calls": calls, "num_splits": splits, "graphkv_inputs": (query, cache, table, seq_lens, out)}


@attrs.frozen(kw_only=True)
class Timings:
    """Median milliseconds per call of each contender that ran, how each was timed, and why any failed."""

    ms: dict[str, float]
    method: dict[str, str]  # "cuda graph", "events" (eager calls; capture failed) or "wall" (CPU)
    failed: dict[str, str]


def time_gpu(calls: dict[str, Callable[[], Any]], repeats: int, seed: int) -> Timings:
    """Each contender as a CUDA graph of ``inner`` calls (about 1 ms of work), replayed in interleaved rounds (a
    fresh random order each) and timed with CUDA events; event-timed eager calls where capture fails. A contender
    whose warm-up raises (a flex compile, memory) is reported in ``failed`` and left out."""
    stream = torch.cuda.Stream()
    replays, inner, method, failed = {}, {}, {}, {}
    for name, fn in calls.items():
        try:
            with torch.cuda.stream(stream):  # compile and warm up outside any capture
                fn()
                fn()
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001 - reported in the row, the other contenders still run
            failed[name] = f"{type(error).__name__}: {error}"[:300]
            torch.cuda.synchronize()
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        n = inner[name] = max(1, min(32, round(1.0 / max(start.elapsed_time(end), 1e-3))))
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(n):
                    fn()
            replays[name], method[name] = graph.replay, "cuda graph"
        except Exception:  # noqa: BLE001 - any capture failure: time eager calls instead
            torch.cuda.synchronize()
            replays[name], method[name] = (lambda fn=fn, n=n: [fn() for _ in range(n)]), "events"
    order, samples = random.Random(seed), {name: [] for name in replays}
    names = list(replays)
    for i in range(repeats + 1):
        order.shuffle(names)
        events = {}
        for name in names:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            replays[name]()
            end.record()
            events[name] = (start, end)
        torch.cuda.synchronize()
        if i:  # round 0 warms up
            for name, (start, end) in events.items():
                samples[name].append(start.elapsed_time(end) / inner[name])
    return Timings(ms={name: statistics.median(x) for name, x in samples.items()}, method=method, failed=failed)


def time_cpu(calls: dict[str, Callable[[], Any]], repeats: int, seed: int) -> Timings:
    """Median wall-clock milliseconds of each contender over interleaved rounds (``timing.interleaved_medians``)."""
    seconds = interleaved_medians(calls, repeats, seed=seed)
    return Timings(ms={k: v * 1e3 for k, v in seconds.items()}, method={k: "wall" for k in calls}, failed={})


def device_copy_gbps(device: str, repeats: int, num_bytes: int) -> float:
    """Bytes read + written per second of a device-to-device ``copy_`` of ``num_bytes // 2`` bytes on ``device``, in
    GB/s (timed as :func:`time_gpu` / :func:`time_cpu` time the contenders)."""
    src = torch.empty(num_bytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timings = (time_gpu if device == "cuda" else time_cpu)({"copy": lambda: dst.copy_(src)}, repeats, 0)
    return num_bytes / (timings.ms["copy"] * 1e-3) / 1e9


def copy_gbps(s: Setup, repeats: int) -> float:
    """:func:`device_copy_gbps` of ``s.copy_bytes`` on the mode's device."""
    return device_copy_gbps(s.device, repeats, s.copy_bytes)


def measure(s: Setup, repeats: int) -> tuple[list[dict[str, Any]], float]:
    """One row per (requests, cached tokens); the copy bandwidth they are compared with."""
    copy = copy_gbps(s, repeats)
    l2_bytes = 0 if s.device != "cuda" else getattr(torch.cuda.get_device_properties(s.device), "L2_cache_size",
                                                    50 << 20)
    # The flex cells first: afterwards the flex pool is given back before the large cells.
    cells = sorted(((r, t) for r in s.requests for t in s.cached_tokens),
                   key=lambda c: (c[0] * c[1] > s.flex_max_tokens, c))
    flex = FlexPool(s) if any(r * t <= s.flex_max_tokens for r, t in cells) else None
    rows = []
    for requests, tokens in cells:
        kv = s.kv_bytes(requests, tokens)
        row: dict[str, Any] = {"requests": requests, "cached_tokens": tokens, "kv_mib": round(kv / 2**20, 3)}
        uses_flex = requests * tokens <= s.flex_max_tokens
        if not uses_flex and flex is not None:
            flex = None  # every flex cell is done (they come first): give its pool back
            if s.device == "cuda":
                torch.cuda.empty_cache()
        if s.device == "cuda":
            need = (1 if uses_flex else 2) * kv * 1.02 + (64 << 20)  # cache (unless the flex pool's) + dense K/V
            free = torch.cuda.mem_get_info()[0]
            if need > free:
                row["skipped"] = f"needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
                rows.append(row)
                continue
        gen = torch.Generator().manual_seed(tokens + requests)
        cell = make_cell(s, requests, tokens, flex if uses_flex else None, gen)
        calls = cell["calls"]
        timings = (time_gpu if s.device == "cuda" else time_cpu)(calls, repeats, requests * tokens)
        ms = timings.ms
        outs = {name: calls[name]().float() for name in ms}
        row.update(num_splits=cell["num_splits"], l2=kv < l2_bytes, failed=timings.failed)
        for name in CONTENDERS:
            if name not in ms:
                row[f"{name}_ms"] = None
                continue
            gbps = kv / (ms[name] * 1e-3) / 1e9
            row.update({f"{name}_ms": round(ms[name], 4), f"{name}_gbps": round(gbps, 1),
                        f"{name}_of_copy": round(gbps / copy, 3), f"{name}_timing": timings.method[name]})
            if name != "sdpa" and "sdpa" in outs:
                row[f"{name}_max_diff"] = round((outs[name] - outs["sdpa"]).abs().max().item(), 5)
            if name != "graphkv" and "graphkv" in ms:
                row[f"ratio_{name}"] = round(ms["graphkv"] / ms[name], 3)
        rows.append(row)
        del cell, calls, outs
        if s.device == "cuda":
            torch.cuda.empty_cache()
    return sorted(rows, key=lambda r: (r["requests"], r["cached_tokens"])), copy


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The table: per contender ms, GB/s and fraction of copy; graphkv / peer ratios; max diffs."""
    head = (f"{'reqs':>5} {'tokens':>6} {'KV MiB':>9} {'splits':>6} | {'graphkv ms':>10} {'GB/s':>7} {'copy':>5} | "
            f"{'flex ms':>9} {'GB/s':>7} {'copy':>5} | {'sdpa ms':>9} {'GB/s':>7} {'copy':>5} | {'vs flex':>7} "
            f"{'vs sdpa':>7} | max diff")
    lines = [head, "-" * len(head)]
    for r in rows:
        lead = f"{r['requests']:>5} {r['cached_tokens']:>6} {r['kv_mib']:>9.2f}"
        if "skipped" in r:
            lines.append(f"{lead} skipped: {r['skipped']}")
            continue
        parts = [f"{lead} {r['num_splits']:>6}"]
        for name, width in (("graphkv", 10), ("flex", 9), ("sdpa", 9)):
            if r.get(f"{name}_ms") is None:
                parts.append(f"{'-':>{width}} {'-':>7} {'-':>5}")
                continue
            mark = "*" if r[f"{name}_timing"] == "events" else ""
            parts.append(f"{r[f'{name}_ms']:>{width}.4f}{mark} {r[f'{name}_gbps']:>7.1f} {r[f'{name}_of_copy']:>5.2f}")
        ratios = " ".join(f"{r[f'ratio_{p}']:>7.3f}" if f"ratio_{p}" in r else f"{'-':>7}" for p in ("flex", "sdpa"))
        diffs = ", ".join(f"{n} {r[f'{n}_max_diff']:.4f}" for n in ("graphkv", "flex") if f"{n}_max_diff" in r)
        lines.append(" | ".join(parts) + f" | {ratios} | {diffs}" + (" L2" if r["l2"] else ""))
        lines += [f"      {name} failed: {why}" for name, why in r["failed"].items()]
    return "\n".join(lines)


def misses(rows: list[dict[str, Any]], gpu: bool) -> list[str]:
    """Outputs that differ from SDPA's; on a GPU also the bandwidth and speed targets."""
    out = []
    for r in rows:
        if "skipped" in r:
            continue
        cell = f"{r['requests']} x {r['cached_tokens']}"
        out += [f"{cell}: {name} failed ({why})" for name, why in r["failed"].items() if name != "flex"]
        if r["graphkv_ms"] is None or r["sdpa_ms"] is None:
            continue
        out += [f"{cell}: {n} differs from sdpa by {r[f'{n}_max_diff']}" for n in ("graphkv", "flex")
                if r.get(f"{n}_max_diff", 0) > MAX_DIFF]
        if gpu and (r["requests"], r["cached_tokens"]) in TARGET_CELLS and r["graphkv_of_copy"] < TARGET_FRACTION:
            out.append(f"{cell}: graphkv at {r['graphkv_of_copy']} of copy bandwidth (target {TARGET_FRACTION})")
        if gpu and r["ratio_sdpa"] > 1.0:
            out.append(f"{cell}: graphkv {r['ratio_sdpa']}x sdpa's time")
    return out


def chosen_setup(args: argparse.Namespace) -> tuple[Setup, str] | None:
    """The mode's :class:`Setup` and the measuring conditions (torch threads pinned by ``timing.set_up``); ``None``
    after saying why when ``--gpu`` was asked on a machine without CUDA."""
    measured_with = set_up(args)
    if args.gpu and not torch.cuda.is_available():
        print("--gpu: CUDA is not available on this machine (torch.cuda.is_available() is False)", file=sys.stderr)
        return None
    return (GPU if args.gpu else CPU), measured_with


def main(argv: list[str] | None = None) -> int:
    """Run the CPU or GPU table, print it, write JSON; exit 1 when a target or a check is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, repeats=10, out=DEFAULT_OUT,
                         gpu="the real table on CUDA (default: tiny cells on the CPU, under the interpreter)")
    parser.add_argument("--requests", type=int, nargs="+", help="only these request counts (default: the mode's)")
    parser.add_argument("--tokens", type=int, nargs="+", help="only these cached-token counts (default: the mode's)")
    args = parser.parse_args(argv)
    chosen = chosen_setup(args)
    if chosen is None:
        return 2
    s, measured_with = chosen
    s = attrs.evolve(s, requests=tuple(args.requests or s.requests),
                     cached_tokens=tuple(args.tokens or s.cached_tokens))
    if not args.gpu:  # eager flex on a CPU says it is unfused: known, and not what a GPU runs
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    device_name = torch.cuda.get_device_name() if args.gpu else "CPU (graphkv's kernel in Triton's interpreter: " \
                                                                "timings prove only that it runs)"
    started = time.perf_counter()
    rows, copy = measure(s, args.repeats)
    print(f"paged decode attention, bf16, {s.kv_heads} KV heads x GQA {s.group}, head {s.head_size}, kernel block "
          f"{s.kernel_block_size}; {device_name}\n({measured_with}; device copy {copy:.1f} GB/s; 'copy' = fraction "
          f"of it; 'vs' = graphkv time / peer time, < 1 is graphkv faster; * event-timed eager calls)")
    print(format_rows(rows))
    print(f"{time.perf_counter() - started:.1f} s")
    result = {"device": device_name, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "repeats": args.repeats, "setup": attrs.asdict(s), "copy_gbps": round(copy, 1), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    missed = misses(rows, args.gpu)
    if missed:
        print("missed: " + "; ".join(missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
