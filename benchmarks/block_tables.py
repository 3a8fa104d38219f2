"""Block tables, host time: graphkv against vLLM V1, Model Runner V2 and a list-to-tensor engine.

The workload of one step: ``M`` requests (32 or 256), each holding 64 pages, each gains ``N``
pages (1, 16 or 128; page ids as Python lists, as schedulers hand them out), and the step's table
in kernel blocks is produced (``bpk`` 1 or 17 kernel blocks per page). Each contender does it its
own way, side by side in one process, interleaved, on the same CPU (a device op is real work there):

- graphkv: ``BlockTables.append_batch`` (all rows in one vectorized call, page ids type-checked) and
  ``sync`` (only the new columns written, into the persistent rows and the step's rows at once; no
  gather, the batch keeps its rows) -- the entry point of a stack that keeps its own tables. A
  ``Step`` appends through its batch checker and ``append_pages`` instead; that cost is part of
  ``benchmarks/step_latency.py``'s ``Step.prepare``;
- vLLM V1 (``baselines.V1BlockTable``): ``append_row`` per row, one copy of the table's rows, one
  broadcast add for kernel blocks;
- MRV2 (``baselines.MRV2BlockTables``): ``append_block_ids`` per row into staged lists, the staged
  writes applied by one scatter, the step's rows gathered, one add for kernel blocks;
- list-to-tensor (``baselines.ListTables``): page lists per request, ``torch.tensor`` of the padded
  lists, one add for kernel blocks.

Every contender's result is checked equal to the others'. Times are the median of ``--repeats``
interleaved samples (each sample one step, its reset untimed; the garbage collector is off while a
step is timed, as in ``timeit``), with ``torch.set_num_threads(1)``
(``--threads`` to change; on a busy 2-core machine two threads swung timings 20-40x). Exit status
1 (with a message) when graphkv is slower than a peer anywhere. ``--gpu`` adds the kernels'
throughput on a CUDA device (needs one).

    python benchmarks/block_tables.py            # writes benchmarks/results/block_tables.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from baselines import ListTables, MRV2BlockTables, V1BlockTable
from timing import add_common_arguments, interleaved_medians, set_up

import graphkv
from graphkv import Backend, CacheOrder, CudaGraphSupport, FullAttentionSpec, KVLayout, Limits, ModelKV, StrideOrder
from graphkv.runtime import BlockTables

BPKS, REQUESTS, NEW_PAGES = (1, 17), (32, 256), (1, 16, 128)
HELD, MAX_PAGES = 64, 256
CONTENDERS = ("graphkv", "vllm_v1", "mrv2", "list_to_tensor")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "block_tables.json"


def plan_for(bpk: int, num_reqs: int) -> graphkv.Plan:
    """One full-attention group: pages of ``bpk`` 16-token kernel blocks, ``MAX_PAGES`` pages per request."""
    backend = Backend(name="bench", supported_kernel_block_sizes=(16,), cudagraph_support=CudaGraphSupport.ALWAYS,
                      kv_layout=KVLayout(order=CacheOrder.KV_FIRST, stride=StrideOrder.NHD))
    spec = FullAttentionSpec(num_kv_heads=1, head_size=8, dtype="float32")
    block = 16 * bpk
    return graphkv.compile(ModelKV.from_specs("bench", [(spec, backend)]),
                           Limits(max_model_len=MAX_PAGES * block, max_num_seqs=num_reqs, max_num_batched_tokens=256,
                                  block_size=block, num_blocks_override=num_reqs * MAX_PAGES + 1), None)


class Workload:
    """The four contenders on one (bpk, M, N) cell, each reset to M rows of ``HELD`` pages."""

    def __init__(self, bpk: int, num_reqs: int, new: int) -> None:
        self.bpk, self.num_reqs, self.new = bpk, num_reqs, new
        rng = np.random.default_rng(bpk * 1000 + num_reqs + new)
        ids = rng.permutation(np.arange(1, num_reqs * MAX_PAGES + 1)).reshape(num_reqs, MAX_PAGES)
        self.held = [ids[r, :HELD].tolist() for r in range(num_reqs)]
        self.step_pages = [ids[r, HELD:HELD + new].tolist() for r in range(num_reqs)]  # lists, as schedulers give
        self.rows = np.arange(num_reqs)
        self.graphkv = BlockTables(plan_for(bpk, num_reqs))
        self.v1 = V1BlockTable(num_reqs, MAX_PAGES, bpk)
        self.mrv2 = MRV2BlockTables(num_reqs, MAX_PAGES, bpk)
        self.lists = ListTables(num_reqs, MAX_PAGES, bpk)
        self.idx = torch.arange(num_reqs)
        self.graphkv.append_batch(self.rows, [(p,) for p in self.held])
        self.graphkv.sync(self.rows, num_reqs)
        for r, p in enumerate(self.held):
            self.v1.append_row(p, r)
            self.mrv2.append_block_ids(r, (p,))
            self.lists.append(r, p)
        self.v1.commit_and_map(num_reqs)
        self.mrv2.apply_and_gather(self.idx, num_reqs)
        self.results: dict[str, torch.Tensor] = {}

    def steps(self) -> dict[str, Callable[[], None]]:
        """One timed step per contender."""
        rows, n, new_pages = self.rows, self.num_reqs, self.step_pages
        group_pages = [(p,) for p in new_pages]

        def graphkv_step() -> None:
            self.graphkv.append_batch(rows, group_pages)
            self.graphkv.sync(rows, n, same_rows=True)
            self.results["graphkv"] = self.graphkv.input_tables[0]  # the persistent tensor kernels read

        def v1_step() -> None:
            for r, pages in enumerate(new_pages):
                self.v1.append_row(pages, r)
            self.results["vllm_v1"] = self.v1.commit_and_map(n)

        def mrv2_step() -> None:
            for r, pages in enumerate(group_pages):
                self.mrv2.append_block_ids(r, pages)
            self.results["mrv2"] = self.mrv2.apply_and_gather(self.idx, n)

        def list_step() -> None:
            for r, pages in enumerate(new_pages):
                self.lists.append(r, pages)
            self.results["list_to_tensor"] = self.lists.prepare(range(n))

        return {"graphkv": graphkv_step, "vllm_v1": v1_step, "mrv2": mrv2_step, "list_to_tensor": list_step}

    def reset(self) -> None:
        """Back to ``HELD`` pages per row (untimed)."""
        for r in range(self.num_reqs):
            self.graphkv.truncate(r, [HELD])
        self.graphkv.sync(self.rows, self.num_reqs, same_rows=True)
        self.v1.truncate(range(self.num_reqs), HELD)
        self.mrv2.truncate(range(self.num_reqs), HELD)
        self.lists.truncate(range(self.num_reqs), HELD)

    def check(self) -> None:
        """Every contender produced the same kernel-block table."""
        width = (HELD + self.new) * self.bpk
        want = self.results["vllm_v1"][:, :width]
        for name, got in self.results.items():
            assert torch.equal(got[:self.num_reqs, :width], want), name


def measure(repeats: int) -> list[dict[str, Any]]:
    """One row per (bpk, requests, new pages): median microseconds per contender and graphkv's ratios."""
    rows = []
    for bpk in BPKS:
        for num_reqs in REQUESTS:
            for new in NEW_PAGES:
                work = Workload(bpk, num_reqs, new)

                def after_round(i: int, work: Workload = work) -> None:
                    if i == 0:
                        work.check()
                    work.reset()

                us = {name: s * 1e6 for name, s in interleaved_medians(work.steps(), repeats, after_round).items()}
                row = {"bpk": bpk, "requests": num_reqs, "new_pages": new,
                       **{f"{name}_us": round(v, 2) for name, v in us.items()}}
                for peer in CONTENDERS[1:]:
                    row[f"ratio_{peer}"] = round(us["graphkv"] / us[peer], 3)
                rows.append(row)
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The side-by-side table."""
    head = (f"{'bpk':>4} {'reqs':>5} {'pages':>6} | {'graphkv':>9} {'vLLM V1':>9} {'MRV2':>9} {'lists':>9} us | "
            f"{'/V1':>6} {'/MRV2':>6} {'/lists':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ratios = [r[f"ratio_{p}"] for p in CONTENDERS[1:]]
        lines.append(f"{r['bpk']:>4} {r['requests']:>5} {r['new_pages']:>6} | {r['graphkv_us']:>9.1f} "
                     f"{r['vllm_v1_us']:>9.1f} {r['mrv2_us']:>9.1f} {r['list_to_tensor_us']:>9.1f} us | "
                     + " ".join(f"{x:>6.2f}" + ("!" if x > 1.0 else "") for x in ratios))
    return "\n".join(lines)


def measure_gpu() -> dict[str, Any]:
    """Throughput of the gather and page-write kernels as a fraction of device-to-device copy bandwidth."""
    import triton.testing

    from graphkv.kernels.block_tables import PackedTables, gather_rows, write_pages

    dev = "cuda"

    def copy_gbps(nbytes: int) -> float:
        src = torch.empty(max(nbytes // 2, 1), dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        return nbytes / (triton.testing.do_bench(lambda: dst.copy_(src)) * 1e-3) / 1e9

    out = []
    for seqs in (256, 1024):
        widths = (2048, 256, 1)  # full attention (32k tokens / 16), sliding window, Mamba state
        src = PackedTables.zeros(seqs, widths, dev)
        src.flat.copy_(torch.randint(0, 1 << 20, src.flat.shape, dtype=torch.int32, device=dev))
        dst = PackedTables.zeros(seqs, widths, dev)
        idx = torch.randperm(seqs, device=dev).to(torch.int32)
        gather_ms = triton.testing.do_bench(lambda: gather_rows(src, dst, idx, seqs))
        entries = seqs * 16
        staged = torch.cat([torch.arange(entries, device=dev) * 17, torch.arange(entries, device=dev) * 17,
                            torch.full((entries,), 17, device=dev)]).long()
        flat = torch.zeros(entries * 17, dtype=torch.int32, device=dev)
        write_ms = triton.testing.do_bench(lambda: write_pages(flat, staged, entries, 17))
        for name, ms, nbytes in (("gather", gather_ms, 2 * src.flat.numel() * 4),
                                 ("write_pages", write_ms, staged.numel() * 8 + flat.numel() * 4)):
            gbps = nbytes / (ms * 1e-3) / 1e9
            out.append({"kernel": name, "max_num_seqs": seqs, "us": round(ms * 1e3, 2), "gbps": round(gbps, 1),
                        "fraction_of_copy": round(gbps / copy_gbps(nbytes), 3)})
    return {"device": torch.cuda.get_device_name(), "rows": out}


def main(argv: list[str] | None = None) -> int:
    """Run the table; exit 1 (with a message) when graphkv is slower than a peer anywhere."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, repeats=61, out=DEFAULT_OUT, gpu="also time the kernels on CUDA")
    args = parser.parse_args(argv)
    print(f"block tables, host time per step: append N pages to each of M requests holding {HELD}, produce the "
          f"kernel-block table\n({set_up(args)}; ratio = graphkv / peer, <= 1.0 is graphkv faster)")
    rows = measure(args.repeats)
    print(format_rows(rows))
    result: dict[str, Any] = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
                              "machine": platform.machine(), "threads": torch.get_num_threads(),
                              "repeats": args.repeats, "held_pages": HELD, "rows": rows}
    if args.gpu:
        if not torch.cuda.is_available():
            print("--gpu: skipped, CUDA is not available on this machine")
            result["gpu"] = {"skipped": "CUDA not available"}
        else:
            result["gpu"] = gpu = measure_gpu()
            for r in gpu["rows"]:
                print(f"  {r['kernel']:<12} max_num_seqs {r['max_num_seqs']:>5} {r['us']:>8.2f} us "
                      f"{r['gbps']:>7.1f} GB/s {r['fraction_of_copy']:.2f} of copy")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    slower = [f"bpk {r['bpk']} reqs {r['requests']} pages {r['new_pages']}: {p} ratio {r[f'ratio_{p}']}"
              for r in rows for p in CONTENDERS[1:] if r[f"ratio_{p}"] > 1.0]
    if slower:
        print("graphkv is slower than a peer in " + "; ".join(slower), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
