"""A decode step's matmuls: graphkv's small-matmul kernel against torch's (cuBLAS), matrix by matrix.

For each weight matrix of the serving benchmark's 0.94B qwen3-like model (``gpu_serving.GPU_MODEL``, bf16: q, k, v,
o, gate, up, down, the merged q/k/v and gate/up, the LM head) and each ``--rows`` (tokens of a decode step), torch's
``linear`` and :func:`graphkv.kernels.small_matmul.small_matmul` multiply the same random data (each timed as a CUDA
graph of several calls, interleaved, median of ``--repeats``). The table prints milliseconds, the weight bytes read
per second, each one's fraction of a measured device-to-device copy's rate, graphkv's time over torch's (< 1 is
graphkv faster), and the largest difference between the two outputs relative to the output's largest magnitude.
``--sweep`` also times every launch configuration of the grid (``--tile-n``, ``--tile-k``, ``--warps``,
``--stages``; those whose partial sums would not fit the registers left out) and prints the best per cell; the
last lines sum a whole decode step's matmuls (16 layers of q/k/v/o/gate/up/down, or of the merged groups, and the
head) for torch, graphkv's default and the sweep's best.

It measures; it changes nothing: ``graphkv.hf``'s ``small_matmul=True`` serves through the kernel, and becomes the
default only where this table and ``scripts/decode_profile_gpu.py --modes fused-merged,fused-small`` show it faster.

    python benchmarks/gpu_linear.py --gpu                 # rows 1 and 8, the defaults only
    python benchmarks/gpu_linear.py --gpu --sweep --rows 1
    python benchmarks/gpu_linear.py                       # CPU: tiny shapes under the interpreter, proves it runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import attrs
import torch
from gpu_attention import device_copy_gbps, time_cpu, time_gpu
from gpu_serving import GPU_MODEL
from timing import add_common_arguments, set_up

from graphkv.errors import SpecError
from graphkv.kernels.small_matmul import MAX_SUMS_PER_THREAD, SmallMatmulConfig, small_matmul, small_matmul_config

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gpu_linear.json"
MAX_REL_DIFF = 0.02  # bf16 outputs of the same float32-accumulated sums, in another order


def model_shapes(cfg: dict[str, int]) -> dict[str, tuple[int, int]]:
    """``{name: (out_features, in_features)}`` of a qwen3-like layer's projections, their merged groups and the head."""
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    return {"q": (q, hidden), "k": (kv, hidden), "v": (kv, hidden), "o": (hidden, q), "gate": (inter, hidden),
            "up": (inter, hidden), "down": (hidden, inter), "qkv": (q + 2 * kv, hidden),
            "gate_up": (2 * inter, hidden), "head": (cfg["vocab_size"], hidden)}


CPU_MODEL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, vocab_size=200)  # the interpreter's sizes: proves it runs
GPU_SHAPES, CPU_SHAPES = model_shapes(GPU_MODEL), model_shapes(CPU_MODEL)
UNMERGED, MERGED = ("q", "k", "v", "o", "gate", "up", "down"), ("qkv", "o", "gate_up", "down")


def _config_name(config: SmallMatmulConfig) -> str:
    return f"n{config.tile_n}/k{config.tile_k}/w{config.num_warps}/s{config.num_stages}"


def measure_cell(name: str, shape: tuple[int, int], rows: int, *, device: str, dtype: torch.dtype,
                 grid: list[SmallMatmulConfig], repeats: int, copy: float, num_sms: int) -> dict[str, Any]:
    """One row: torch's and graphkv's default (and each ``grid`` configuration's) time for one matrix and row
    count; the outputs compared."""
    out_features, in_features = shape
    gen = torch.Generator().manual_seed(out_features + rows)
    x = torch.randn(rows, in_features, generator=gen).to(dtype).to(device)
    weight = (torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5).to(dtype).to(device)
    default = small_matmul_config(rows, out_features, in_features, num_sms=num_sms)
    outs = {"torch": torch.empty(rows, out_features, dtype=dtype, device=device)}
    calls: dict[str, Callable[[], Any]] = {"torch": lambda: torch.mm(x, weight.t(), out=outs["torch"])}
    # a tile whose partial sums would spill is refused by the kernel
    fits = [c for c in grid if c != default and c.sums_per_thread(rows) <= MAX_SUMS_PER_THREAD]
    for config in [default, *fits]:
        key = "graphkv" if config == default else _config_name(config)
        outs[key] = torch.empty(rows, out_features, dtype=dtype, device=device)
        calls[key] = lambda config=config, key=key: small_matmul(x, weight, out=outs[key], config=config,
                                                                 num_sms=num_sms)
    timings = (time_gpu if device == "cuda" else time_cpu)(calls, repeats, out_features)
    scale = float(outs["torch"].abs().max()) or 1.0
    weight_bytes = out_features * in_features * weight.element_size()
    row: dict[str, Any] = {"matrix": name, "out_features": out_features, "in_features": in_features, "rows": rows,
                           "weight_bytes": weight_bytes, "default": attrs.asdict(default), "failed": timings.failed}
    for key in ("torch", "graphkv"):
        if key in timings.ms:
            ms = timings.ms[key]
            row[key] = {"ms": ms, "gbps": weight_bytes / (ms * 1e-3) / 1e9,
                        "of_copy": weight_bytes / (ms * 1e-3) / 1e9 / copy, "method": timings.method[key]}
    row["max_rel_diff"] = float((outs["graphkv"].float() - outs["torch"].float()).abs().max()) / scale
    swept = sorted((ms, key) for key, ms in timings.ms.items() if key != "torch")
    if swept:
        best_ms, best = swept[0]
        row["best"] = {"config": _config_name(default) if best == "graphkv" else best, "ms": best_ms,
                       "max_rel_diff": float((outs[best].float() - outs["torch"].float()).abs().max()) / scale}
    if "graphkv" in row and "torch" in row:
        row["vs_torch"] = row["graphkv"]["ms"] / row["torch"]["ms"]
    return row


def step_totals(rows: list[dict[str, Any]], layers: int) -> list[str]:
    """A decode step's matmul time per row count, unmerged and merged: torch, graphkv's default, the sweep's best."""
    lines = []
    by_cell = {(r["matrix"], r["rows"]): r for r in rows}
    for count in sorted({r["rows"] for r in rows}):
        for label, names in (("unmerged", UNMERGED), ("merged", MERGED)):
            cells = [by_cell.get((n, count)) for n in (*names, "head")]
            if any(c is None or "torch" not in c or "graphkv" not in c for c in cells):
                continue
            weights = [layers if c["matrix"] != "head" else 1 for c in cells]
            total = {key: sum(w * c[key]["ms"] for w, c in zip(weights, cells)) for key in ("torch", "graphkv")}
            best = sum(w * c["best"]["ms"] for w, c in zip(weights, cells))
            lines.append(f"decode step, {count} row(s), {label}: torch {total['torch'] * 1e3:,.1f} us, graphkv "
                         f"{total['graphkv'] * 1e3:,.1f} us ({total['graphkv'] / total['torch']:.3f}x), sweep's best "
                         f"{best * 1e3:,.1f} us ({best / total['torch']:.3f}x)")
    return lines


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The table: one line per matrix and row count."""
    lines = [f"{'matrix':>8} {'N x K':>13} {'rows':>4} | {'torch ms':>8} {'GB/s':>7} {'copy':>5} | {'graphkv':>8} "
             f"{'GB/s':>7} {'copy':>5} {'vs':>6} | {'best of sweep':>20} {'ms':>8} | rel diff"]
    for r in rows:
        lead = f"{r['matrix']:>8} {r['out_features']:>6}x{r['in_features']:<6} {r['rows']:>4}"
        if "torch" not in r or "graphkv" not in r:
            lines.append(f"{lead} | failed: {str(r['failed'])[:150]}")
            continue
        t, g, b = r["torch"], r["graphkv"], r.get("best", {})
        lines.append(f"{lead} | {t['ms']:>8.4f} {t['gbps']:>7.1f} {t['of_copy']:>5.2f} | {g['ms']:>8.4f} "
                     f"{g['gbps']:>7.1f} {g['of_copy']:>5.2f} {r['vs_torch']:>6.3f} | {b.get('config', '-'):>20} "
                     f"{b.get('ms', float('nan')):>8.4f} | {r['max_rel_diff']:.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table and the step totals, write JSON; exit 1 when an output differs from torch's."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, repeats=10, out=DEFAULT_OUT,
                         gpu="the real table on CUDA (default: tiny shapes on the CPU, under the interpreter)")
    parser.add_argument("--rows", type=int, nargs="+", help="tokens per matmul (default: 1 8 on a GPU, 1 3 on a CPU)")
    parser.add_argument("--matrices", nargs="+", help="only these matrices (default: all of the mode's)")
    parser.add_argument("--sweep", action="store_true", help="also time every configuration of the grid below")
    parser.add_argument("--tile-n", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--tile-k", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 3])
    args = parser.parse_args(argv)
    measured_with = set_up(args)
    if args.gpu and not torch.cuda.is_available():
        print("--gpu: CUDA is not available on this machine (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    device = "cuda" if args.gpu else "cpu"
    shapes = GPU_SHAPES if args.gpu else CPU_SHAPES
    unknown = sorted(set(args.matrices or ()) - set(shapes))
    bad_rows = [r for r in args.rows or () if not 1 <= r <= 16]
    if unknown or bad_rows:
        print("; ".join(([f"--matrices: {unknown} not among {', '.join(shapes)}"] if unknown else [])
                        + ([f"--rows: {bad_rows} outside 1..16 (the kernel's limit)"] if bad_rows else [])),
              file=sys.stderr)
        return 2
    try:
        grid = [SmallMatmulConfig(tile_n=n, tile_k=k, num_warps=w, num_stages=s)
                for n, k, w, s in itertools.product(args.tile_n, args.tile_k, args.warps, args.stages)] \
            if args.sweep else []
    except SpecError as error:
        print(f"--tile-n / --tile-k / --warps / --stages: {error}", file=sys.stderr)
        return 2
    if not args.gpu:  # the interpreter: prove it runs
        grid = grid[:2]
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count if args.gpu else 1
    copy = device_copy_gbps(device, args.repeats, 1 << 30 if args.gpu else 1 << 24)
    rows = [measure_cell(name, shapes[name], count, device=device, dtype=torch.bfloat16 if args.gpu else torch.float32,
                         grid=grid, repeats=args.repeats, copy=copy, num_sms=num_sms)
            for count in (args.rows or ([1, 8] if args.gpu else [1, 3]))
            for name in (args.matrices or shapes)]
    name = torch.cuda.get_device_name() if args.gpu else "CPU (graphkv's kernel in Triton's interpreter: timings " \
                                                         "prove only that it runs)"
    print(f"decode matmuls, {'bf16' if args.gpu else 'float32'}, x [rows, K] @ W[N, K]^T; {name}\n({measured_with}; "
          f"device copy {copy:.1f} GB/s, {num_sms} SMs; GB/s = weight bytes read per second; 'copy' = fraction of "
          f"the copy's rate; 'vs' = graphkv time / torch time, < 1 is graphkv faster)")
    print(format_rows(rows))
    for line in step_totals(rows, (GPU_MODEL if args.gpu else CPU_MODEL)["num_hidden_layers"]):
        print(line)
    result = {"device": name, "torch": torch.__version__, "threads": torch.get_num_threads(), "repeats": args.repeats,
              "copy_gbps": round(copy, 1), "num_sms": num_sms, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    wrong = [f"{r['matrix']} x{r['rows']}: {r['max_rel_diff']:.4f}" for r in rows
             if r.get("max_rel_diff", 0.0) > MAX_REL_DIFF or "graphkv" not in r]
    if wrong:
        print(f"outputs differ from torch's by more than {MAX_REL_DIFF} of their largest magnitude (or failed): "
              + "; ".join(wrong), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
