"""Launch settings of graphkv's paged decode kernel, swept against dense SDPA on the same data.

For each cell (requests x cached tokens, the shapes of ``gpu_attention.py``: bf16, 8 KV heads, GQA 4,
head 128, kernel block 16) every combination of splits per sequence, warps, pipeline stages, tokens
per tile and the cache's physical order (``--strides``: ``nhd``, the order graphkv.hf's pool has, each
token's heads side by side; ``hnd``, the same values with each page's head slab contiguous, 4 KiB per
head and page here) runs side by side with SDPA over the same K/V (each timed as a CUDA graph of
several calls, interleaved, median of ``--repeats``). The table prints each setting's milliseconds,
GB/s, its time over SDPA's (< 1 is graphkv faster) and its largest output difference from SDPA's;
the kernel's current defaults are marked ``*``. It measures; it changes nothing: a setting that wins
is adopted in ``kernels/paged_attention.py`` and ``kernels/decode_splits.py`` and checked with
``gpu_attention.py``.

    python benchmarks/decode_kernel_sweep.py --gpu                      # the default cells and grid
    python benchmarks/decode_kernel_sweep.py --gpu --cells 32x4096 32x16384 --splits 1 2 4 8
    python benchmarks/decode_kernel_sweep.py                            # CPU: one tiny cell, proves it runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from gpu_attention import LAYOUT, chosen_setup, copy_gbps, make_cell, time_cpu, time_gpu
from timing import add_common_arguments

import graphkv.kernels.paged_attention as kernel
from graphkv.kernels.decode_splits import workspace_row_floats

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "decode_kernel_sweep.json"


def _cell(text: str) -> tuple[int, int]:
    try:
        requests, tokens = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cells: {text!r} is not REQUESTSxTOKENS (e.g. 32x4096)") from None
    if requests < 1 or tokens < 1:
        raise argparse.ArgumentTypeError(f"--cells: {text!r} needs requests >= 1 and tokens >= 1")
    return requests, tokens


def hnd_copy(cache: torch.Tensor) -> torch.Tensor:
    """``cache`` (logical ``(2, blocks, kbs, heads, dim)``) with the same values, laid out heads before tokens:
    each (page, head) slab contiguous. The kernel reads either through the tensor's strides."""
    return cache.transpose(-3, -2).contiguous().transpose(-3, -2)


def sweep_cell(s: Any, requests: int, tokens: int, grid: list[tuple[int, int, int, int, str]], repeats: int,
               copy: float) -> list[dict[str, Any]]:
    """One row per setting of ``grid`` ((splits, warps, stages, tile tokens, stride order)) for one cell, SDPA timed
    beside them."""
    gen = torch.Generator().manual_seed(tokens + requests)
    cell = make_cell(s, requests, tokens, None, gen)
    sdpa = cell["calls"]["sdpa"]
    query, cache, table, seq_lens, out = cell["graphkv_inputs"]
    max_splits = max(g[0] for g in grid)
    workspace = torch.empty(requests * max_splits, query.shape[1], workspace_row_floats(query.shape[2]),
                            dtype=torch.float32, device=query.device)
    defaults = (cell["num_splits"], kernel._NUM_WARPS, kernel._num_stages(cell["num_splits"]),
                kernel._tile_tokens(max(16, query.shape[2]), cache.element_size()), "nhd")
    caches = {"nhd": cache}
    if any(g[4] == "hnd" for g in grid):
        caches["hnd"] = hnd_copy(cache)

    def setting(splits: int, warps: int, stages: int, tile: int, stride: str) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            saved = kernel._NUM_WARPS, kernel._num_stages, kernel._tile_tokens
            kernel._NUM_WARPS, kernel._num_stages, kernel._tile_tokens = warps, lambda n: stages, lambda d, e: tile
            try:
                return kernel.paged_decode_attention(query, caches[stride], table, seq_lens, layout=LAYOUT,
                                                     scale=query.shape[2] ** -0.5, out=out, workspace=workspace,
                                                     num_splits=splits)
            finally:
                kernel._NUM_WARPS, kernel._num_stages, kernel._tile_tokens = saved
        return run

    calls: dict[str, Callable[[], torch.Tensor]] = {"sdpa": sdpa}
    names = {}
    for g in grid:
        names[g] = "s{}w{}n{}t{}{}".format(*g)
        calls[names[g]] = setting(*g)
    timed = (time_gpu if s.device == "cuda" else time_cpu)(calls, repeats, requests * tokens)
    reference = sdpa().float()
    kv = s.kv_bytes(requests, tokens)
    rows = []
    for g in grid:
        name = names[g]
        row = {"requests": requests, "cached_tokens": tokens, "splits": g[0], "warps": g[1], "stages": g[2],
               "tile_tokens": g[3], "stride": g[4], "default": g == defaults, "sdpa_ms": round(timed.ms["sdpa"], 4)}
        if name in timed.ms:
            ms = timed.ms[name]
            row.update(ms=round(ms, 4), gbps=round(kv / (ms * 1e-3) / 1e9, 1), of_copy=round(kv / (ms * 1e-3) / 1e9
                                                                                           / copy, 3),
                       vs_sdpa=round(ms / timed.ms["sdpa"], 3),
                       max_diff=round((calls[name]().float() - reference).abs().max().item(), 5))
        else:
            row["failed"] = timed.failed.get(name, "not timed")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Sweep, print the table (best setting per cell first), write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, repeats=10, out=DEFAULT_OUT, gpu="sweep on CUDA (default: one tiny CPU cell)")
    parser.add_argument("--cells", type=_cell, nargs="+", help="REQUESTSxTOKENS cells (default: 32x4096 32x16384 "
                                                                "1x16384 8x4096 on a GPU)")
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--tiles", type=int, nargs="+", default=[32, 64, 128], help="tokens per tile")
    parser.add_argument("--strides", nargs="+", choices=("nhd", "hnd"), default=["nhd"],
                        help="the cache's physical order: nhd (graphkv.hf's pool) and / or hnd (a copy, head slabs "
                             "contiguous)")
    args = parser.parse_args(argv)
    chosen = chosen_setup(args)
    if chosen is None:
        return 2
    s, measured_with = chosen
    cells = args.cells or ([(32, 4096), (32, 16384), (1, 16384), (8, 4096)] if args.gpu else [(3, 97)])
    if not args.gpu:
        args.splits, args.warps, args.stages, args.tiles = [1, 2], [4], [2], [16]
    grid = list(itertools.product(args.splits, args.warps, args.stages, args.tiles, args.strides))
    copy = copy_gbps(s, args.repeats)
    rows = []
    for requests, tokens in cells:
        rows += sweep_cell(s, requests, tokens, grid, args.repeats, copy)
    device = torch.cuda.get_device_name() if args.gpu else "CPU (interpreter: proves it runs)"
    print(f"paged decode kernel settings vs dense SDPA; {device}; {measured_with}; device copy {copy:.1f} GB/s")
    print(f"{'cell':>10} {'splits':>6} {'warps':>5} {'stages':>6} {'tile':>4} {'kv':>3} | {'ms':>8} {'GB/s':>7} "
          f"{'copy':>5} | "
          f"{'sdpa ms':>8} {'vs sdpa':>7} | max diff")
    for (requests, tokens), group in itertools.groupby(rows, key=lambda r: (r["requests"], r["cached_tokens"])):
        for r in sorted(group, key=lambda r: r.get("ms", float("inf"))):  # every row: a lent GPU returns 8 files
            lead = (f"{requests:>4}x{tokens:<5} {r['splits']:>6} {r['warps']:>5} {r['stages']:>6} "
                    f"{r['tile_tokens']:>4} {r['stride']:>3}")
            mark = "*" if r["default"] else " "
            if "ms" not in r:
                print(f"{lead} | failed: {r['failed'][:120]}")
                continue
            print(f"{lead} |{mark}{r['ms']:>7.4f} {r['gbps']:>7.1f} {r['of_copy']:>5.2f} | {r['sdpa_ms']:>8.4f} "
                  f"{r['vs_sdpa']:>7.3f} | {r['max_diff']:.4f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": device, "copy_gbps": round(copy, 1), "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
