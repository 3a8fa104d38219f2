"""Step latency, host time: graphkv's decode ``Step.prepare`` against a list-to-tensor engine and vLLM V1.

Table 1 (any machine): one decode step of the demo model (tiny hybrid, a gated-recurrence group
and a flex-attention group) at batch 1..256, each contender building the step's inputs its own way,
side by side in one process, interleaved:

- graphkv: ``Step.prepare(Batch(...))`` — the ``Batch`` built from the step's tuples inside the timed
  region, every ownership check on (integer lengths, context never beyond the written tokens, pages
  covering every sequence), the metadata, slot mappings and state pages staged, the block tables
  synced; ``run`` adds copying the token ids and entering the forward context (a no-op forward);
- list-to-tensor (``baselines.list_to_tensor_decode``, nano-vllm's ``prepare_decode``): Python
  lists per request and one ``torch.tensor`` per input;
- vLLM V1 (``baselines.V1DecodeInputs``): preallocated numpy buffers, vectorized index math, the
  block tables committed by one copy each, one copy per input.

Each contender's step is timed alone (median of ``--repeats`` interleaved samples, the garbage
collector off while timing, as in ``timeit``), with ``torch.set_num_threads(1)`` (``--threads`` to
change). Exit status 1 (with a message) when ``Step.prepare`` is slower than a peer anywhere (tables 1 and 2); where
``Step.finish`` is, a line says so (not a failure: see :data:`FINISH_WORK`).

Table 2 (any machine): decode steps in which requests cross into new pages (:class:`CrossingWorkload`:
lengths spread over a page, about ``batch / 16`` requests gain a page each step), each contender giving the
crossing requests their pages and preparing the step its own way.

Table 3 (any machine): a finished request given back (``Step.finish``: its pages lose their holder,
pages it wrote keep their token counts for prefix reuse, its table row returns to the null page) for
a request holding 1-256 pages of the attention group and its state page, against nano-vllm's
``BlockManager.deallocate`` and vLLM V1's ``KVCacheManager.free`` with ``InputBatch.remove_request``
(``baselines.ListBlockManager``, ``baselines.V1Finish``); the request joins again, untimed, between rounds.

Table 4 (``--gpu``, needs CUDA): one decode step of the demo model (``Step.run``), eager vs
replaying a captured CUDA graph.

Usage: ``python benchmarks/step_latency.py [--repeats N] [--max-batch 256]``; writes
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
from typing import Any, Callable

import numpy as np
import torch
from baselines import ListBlockManager, Seq, V1DecodeInputs, V1Finish, list_to_tensor_decode
from timing import add_common_arguments, interleaved_medians, set_up

import graphkv
from graphkv.models.paged_tiny_hybrid import PagedTinyHybrid
from graphkv.models.tiny_hybrid import TinyHybridConfig, init_weights, model_kv
from graphkv.runtime import Batch, Step, allocate

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CROSS_PAGES = 8  # attention pages a request of the crossing table grows to before it joins again (128 tokens)
FINISH_PAGES = (1, 16, 64, 256)  # attention pages of the finished request (256: 4,096 tokens, the longest)
FINISH_WORK = ("graphkv's finish also returns the row's table entries to the null page (V1 leaves the row to its next "
               "condense, nano-vllm clears a list) and records each written page's token count for prefix reuse")
PROMPT = 8
CONTENDERS = ("graphkv_prepare", "graphkv_run", "list_to_tensor", "vllm_v1")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "step_latency.json"


def demo_plan(max_batch: int) -> graphkv.Plan:
    """The demo model's plan for ``max_batch`` decoding requests."""
    limits = graphkv.Limits(max_model_len=256, max_num_seqs=max_batch, max_num_batched_tokens=max(256, max_batch))
    return graphkv.compile(model_kv(TinyHybridConfig()), limits, graphkv.Budget.kv_bytes(f"{max(4, max_batch // 8)}MiB"))


class DecodeWorkload:
    """``n`` requests of ``PROMPT`` tokens, prefilled and decoded twice; each timed decode step is one token
    longer than the last (a request's state has absorbed every token: its context cannot go back), and
    :meth:`after_round` prefills them again, untimed, before they outgrow their one page per group."""

    def __init__(self, plan: graphkv.Plan, step: Step, n: int) -> None:
        self.n, self.step = n, step
        groups = plan.groups
        self.attention = [g.index for g in groups if not g.is_ssm]
        self.state = [g.index for g in groups if g.is_ssm]
        self.pages = [tuple((1 + i * len(groups) + g,) for g in range(len(groups))) for i in range(n)]
        pages = self.pages
        self.req_ids = tuple(f"req{i}" for i in range(n))
        self.per_step = plan.limits.max_num_batched_tokens // PROMPT
        self.ones = (1,) * n
        block = plan.groups[self.attention[0]].block_size
        self.capacity = block  # tokens one page of an attention group holds
        self.length = 0
        self.refill()
        self.ids = [[5] * n, [6] * n]
        self.seqs = [Seq(list(range(PROMPT + 1)), [list(p[g]) for g in range(len(groups))]) for p in pages]
        self.block = block
        self.v1 = V1DecodeInputs(plan.limits.max_num_seqs, plan.limits.max_num_batched_tokens,
                                 [g.pages_per_request for g in groups], plan.max_model_len, block, self.attention,
                                 self.state)
        for r, p in enumerate(pages):
            for g, table in enumerate(self.v1.tables):
                table.append_row(list(p[g]), r)
        self.v1.num_computed[:n] = PROMPT
        self.scheduled = np.ones(n, dtype=np.int32)

    def refill(self) -> None:
        """Finish the requests, prefill them again and decode twice (so the next decode repeats the last)."""
        step, n = self.step, self.n
        for r in list(step.active_requests):
            step.finish(r)
        for i in range(0, n, self.per_step):
            part = slice(i, min(n, i + self.per_step))
            count = part.stop - part.start
            step.prepare(Batch(req_ids=self.req_ids[part], query_lens=(PROMPT,) * count, seq_lens=(PROMPT,) * count,
                               new_pages=tuple(self.pages[part])))
        for length in (PROMPT + 1, PROMPT + 2):
            step.prepare(Batch(req_ids=self.req_ids, query_lens=self.ones, seq_lens=(length,) * n))
        self.length = PROMPT + 2

    def next_batch(self) -> Batch:
        """The next decode step: every request one token longer."""
        self.length += 1
        return Batch(req_ids=self.req_ids, query_lens=self.ones, seq_lens=(self.length,) * self.n)

    def after_round(self, _round: int = 0) -> None:
        """Untimed: prefill again when a round of two more decodes would outgrow the page."""
        if self.length + 2 > self.capacity:
            self.refill()

    def steps(self) -> dict[str, Callable[[], None]]:
        """One timed decode step per contender (graphkv's each one token longer than the last)."""
        step = self.step

        def graphkv_prepare() -> None:
            step.prepare(self.next_batch())

        def graphkv_run() -> None:
            step.run(lambda input_ids: None, self.next_batch(), input_ids=self.ids[self.length & 1])

        def list_step() -> None:
            list_to_tensor_decode(self.seqs, self.attention, self.state, self.block)

        def v1_step() -> None:
            self.v1.prepare(self.n, self.scheduled)

        return {"graphkv_prepare": graphkv_prepare, "graphkv_run": graphkv_run, "list_to_tensor": list_step,
                "vllm_v1": v1_step}


class CrossingWorkload:
    """``n`` decoding requests whose lengths are spread over a page (request ``i`` joins with ``block_size + 1 + i *
    block_size // n`` tokens), so that about ``n / block_size`` of them cross into a new page each step, as in a
    serving loop: from 16 requests on (block size 16) nearly every decode step gains a page somewhere. Each contender
    gives the crossing requests their next page its own way (graphkv: in the step's ``Batch.new_pages``, which
    ``Step.prepare`` checks and appends; nano-vllm: ``may_append``'s list append; vLLM V1: ``append_row``, with
    ``num_computed_tokens`` advanced) and prepares the step. Request ``i`` owns pages of its own; they join again,
    untimed, before outgrowing :data:`CROSS_PAGES` pages."""

    def __init__(self, plan: graphkv.Plan, step: Step, n: int) -> None:
        self.n, self.step = n, step
        groups = plan.groups
        self.attention = [g.index for g in groups if not g.is_ssm]
        self.state = [g.index for g in groups if g.is_ssm]
        self.block = block = groups[self.attention[0]].block_size
        ids = iter(range(1, plan.num_blocks))
        self.own = [[[next(ids) for _ in range(1 if g.is_ssm else CROSS_PAGES)] for g in groups] for _ in range(n)]
        self.start = [block + 1 + i * block // n for i in range(n)]  # two pages each
        self.req_ids = tuple(f"req{i}" for i in range(n))
        self.ones = (1,) * n
        self.scheduled = np.ones(n, dtype=np.int32)
        self.per_step = plan.limits.max_num_batched_tokens // (2 * block)
        self.v1 = V1DecodeInputs(plan.limits.max_num_seqs, plan.limits.max_num_batched_tokens,
                                 [g.pages_per_request for g in groups], plan.max_model_len, block, self.attention,
                                 self.state)
        self.lens: list[int] = []
        self.seqs: list[Seq] = []
        self.join()

    def held(self, i: int, length: int) -> list[list[int]]:
        """Request ``i``'s pages for ``length`` tokens, per group."""
        return [pages[:1] if g in self.state else pages[:-(-length // self.block)] for g, pages in enumerate(self.own[i])]

    def join(self) -> None:
        """Untimed: every request joins again at its first length in every contender and decodes once."""
        step, n = self.step, self.n
        for r in list(step.active_requests):
            step.finish(r)
        for a in range(0, n, self.per_step):
            part = range(a, min(n, a + self.per_step))
            step.prepare(Batch(req_ids=tuple(self.req_ids[i] for i in part),
                               query_lens=tuple(self.start[i] for i in part),
                               seq_lens=tuple(self.start[i] for i in part),
                               new_pages=tuple(tuple(map(tuple, self.held(i, self.start[i]))) for i in part)))
        self.seqs = [Seq([5] * self.start[i], self.held(i, self.start[i])) for i in range(n)]
        for g, table in enumerate(self.v1.tables):
            table.truncate(range(n), 0)
            for i in range(n):
                table.append_row(self.held(i, self.start[i])[g], i)
        self.v1.num_computed[:n] = self.start
        self.lens = list(self.start)
        self.advance()
        step.prepare(self.batch())  # one decode: the timed ones repeat it
        self.lists_step()
        self.v1_step()
        self.advance()

    def advance(self, _round: int = 0) -> None:
        """Untimed: the next step's lengths, its crossing requests and their new pages (what a scheduler decided);
        join again before a request would outgrow its pages."""
        if self.lens and max(self.lens) + 1 > CROSS_PAGES * self.block:
            self.join()
            return
        self.lens = [x + 1 for x in self.lens]
        block = self.block
        self.cross = [i for i, x in enumerate(self.lens) if x % block == 1]
        self.new_pages: tuple = ()
        if self.cross:
            new = [None] * self.n
            for i in self.cross:
                page = -(-self.lens[i] // block) - 1
                new[i] = tuple(() if g in self.state else (self.own[i][g][page],) for g in range(len(self.own[i])))
            self.new_pages = tuple(new)
        self.seq_lens = tuple(self.lens)

    def batch(self) -> Batch:
        """graphkv's Batch of the step (built inside the timed region, as a serving loop builds it each step)."""
        return Batch(req_ids=self.req_ids, query_lens=self.ones, seq_lens=self.seq_lens, new_pages=self.new_pages)

    def lists_step(self) -> None:
        for i in self.cross:  # nano-vllm's may_append: the crossing requests' next page
            for g in self.attention:
                self.seqs[i].block_tables[g].append(self.own[i][g][len(self.seqs[i].block_tables[g])])
        list_to_tensor_decode(self.seqs, self.attention, self.state, self.block)

    def v1_step(self) -> None:
        v1 = self.v1
        for i in self.cross:  # _update_states: append_row of the crossing requests' new block ids
            for g in self.attention:
                v1.tables[g].append_row([self.own[i][g][v1.tables[g].num_blocks_per_row[i]]], i)
        v1.num_computed[:self.n] += 1
        v1.prepare(self.n, self.scheduled)

    def steps(self) -> dict[str, Callable[[], None]]:
        """One timed decode step per contender, the same step of the same requests."""
        step = self.step
        return {"graphkv_prepare": lambda: step.prepare(self.batch()), "list_to_tensor": self.lists_step,
                "vllm_v1": self.v1_step}


def crossing_table(max_batch: int, repeats: int) -> list[dict[str, Any]]:
    """Table 2 rows: median microseconds per contender for decode steps with page crossings, and graphkv's ratios."""
    plan = demo_plan(max_batch)
    step = Step(plan)
    rows = []
    for n in (b for b in BATCHES if b <= max_batch):
        work = CrossingWorkload(plan, step, n)
        rows.append(_measured_row(("batch", n), work.steps(), work.advance, "prepare", repeats))
        for r in list(step.active_requests):
            step.finish(r)
    return rows


def _measured_row(key: tuple[str, int], steps: dict[str, Callable[[], None]], reset: Callable[[int], None],
                  mine: str, repeats: int) -> dict[str, Any]:
    """One table row: ``key`` (name, value), each contender's median microseconds (``{name}_us``) and graphkv's
    ``graphkv_{mine}`` ratio to each peer (``{mine}_ratio_{peer}``)."""
    us = {name: t * 1e6 for name, t in interleaved_medians(steps, repeats, reset).items()}
    row: dict[str, Any] = {key[0]: key[1], **{f"{name}_us": round(v, 2) for name, v in us.items()}}
    for peer in ("list_to_tensor", "vllm_v1"):
        row[f"{mine}_ratio_{peer}"] = round(us[f"graphkv_{mine}"] / us[peer], 3)
    return row


def format_crossing(rows: list[dict[str, Any]]) -> str:
    """The side-by-side table of decode steps with page crossings."""
    return _format_ratios(rows, "batch", "prepare", "prepare_ratio", "prep/")


def _format_ratios(rows: list[dict[str, Any]], key: str, mine: str, ratio: str, prefix: str) -> str:
    """A side-by-side table: per row ``key``, graphkv's ``graphkv_{mine}_us`` and the peers' times, then the ratios
    ``{ratio}_{peer}`` headed ``{prefix}lists`` / ``{prefix}V1`` (a ratio above 1.0 marked ``!``)."""
    heads = (f"{prefix}lists", f"{prefix}V1")
    head = (f"{key:>5} | {mine:>8} {'lists':>8} {'vLLM V1':>8} us | {heads[0]:>{max(7, len(heads[0]))}} "
            f"{heads[1]:>{max(6, len(heads[1]))}}")
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = [f"{x:.2f}" + ("!" if x > 1.0 else "") for x in (r[f"{ratio}_list_to_tensor"], r[f"{ratio}_vllm_v1"])]
        lines.append(f"{r[key]:>5} | {r[f'graphkv_{mine}_us']:>8.1f} {r['list_to_tensor_us']:>8.1f} "
                     f"{r['vllm_v1_us']:>8.1f} us | {cells[0]:>{max(7, len(heads[0]))}} "
                     f"{cells[1]:>{max(6, len(heads[1]))}}")
    return "\n".join(lines)


def host_table(max_batch: int, repeats: int) -> list[dict[str, Any]]:
    """Table 1 rows: median microseconds per contender and graphkv's ratios."""
    plan = demo_plan(max_batch)
    step = Step(plan)
    rows = []
    for n in (b for b in BATCHES if b <= max_batch):
        work = DecodeWorkload(plan, step, n)
        us = {name: s * 1e6 for name, s in interleaved_medians(work.steps(), repeats, work.after_round).items()}
        row: dict[str, Any] = {"batch": n, **{f"{name}_us": round(v, 2) for name, v in us.items()}}
        for peer in ("list_to_tensor", "vllm_v1"):
            row[f"prepare_ratio_{peer}"] = round(us["graphkv_prepare"] / us[peer], 3)
            row[f"run_ratio_{peer}"] = round(us["graphkv_run"] / us[peer], 3)
        rows.append(row)
    return rows


def format_host(rows: list[dict[str, Any]]) -> str:
    """The side-by-side table."""
    head = (f"{'batch':>5} | {'prepare':>8} {'run':>8} {'lists':>8} {'vLLM V1':>8} us | "
            f"{'prep/lists':>10} {'prep/V1':>8} {'run/lists':>9} {'run/V1':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ratios = (r["prepare_ratio_list_to_tensor"], r["prepare_ratio_vllm_v1"], r["run_ratio_list_to_tensor"],
                  r["run_ratio_vllm_v1"])
        cells = [f"{x:.2f}" + ("!" if x > 1.0 and k < 2 else "") for k, x in enumerate(ratios)]
        lines.append(f"{r['batch']:>5} | {r['graphkv_prepare_us']:>8.1f} {r['graphkv_run_us']:>8.1f} "
                     f"{r['list_to_tensor_us']:>8.1f} {r['vllm_v1_us']:>8.1f} us | "
                     f"{cells[0]:>10} {cells[1]:>8} {cells[2]:>9} {cells[3]:>7}")
    return "\n".join(lines)


def finish_plan() -> graphkv.Plan:
    """The demo model's plan for one request of up to 4,096 tokens (its ``max_position_embeddings``)."""
    limits = graphkv.Limits(max_model_len=4096, max_num_seqs=4, max_num_batched_tokens=4096)
    return graphkv.compile(model_kv(TinyHybridConfig()), limits, graphkv.Budget.kv_bytes("16MiB"))


class FinishWorkload:
    """One request holding ``pages`` attention pages (full: ``pages * block_size`` tokens written) and its state
    page, finished by each contender and joined again, untimed, after every round."""

    def __init__(self, plan: graphkv.Plan, step: Step, pages: int) -> None:
        self.step = step
        groups = plan.groups
        block = next(g.block_size for g in groups if not g.is_ssm)
        self.tokens = pages * block
        page_ids = iter(range(1, plan.num_blocks))
        self.pages = tuple(tuple(next(page_ids) for _ in range(1 if g.is_ssm else pages)) for g in groups)
        self.seq = Seq([0] * self.tokens, [])
        self.lists = ListBlockManager(plan.num_blocks)
        self.v1 = V1Finish(plan.num_blocks, len(groups), plan.limits.max_num_seqs)
        self.join()

    def join(self, _round: int = 0) -> None:
        """Untimed: the request joins (prefilled whole) in each contender."""
        self.step.prepare(Batch(req_ids=("r",), query_lens=(self.tokens,), seq_lens=(self.tokens,),
                                new_pages=(self.pages,)))
        self.lists.allocate(self.seq, self.pages)
        self.v1.allocate("r", 0, self.pages)

    def steps(self) -> dict[str, Callable[[], None]]:
        """The timed finish of each contender."""
        step, lists, v1, seq = self.step, self.lists, self.v1, self.seq
        return {"graphkv_finish": lambda: step.finish("r"), "list_to_tensor": lambda: lists.deallocate(seq),
                "vllm_v1": lambda: v1.finish("r")}


def finish_table(repeats: int) -> list[dict[str, Any]]:
    """Table 3 rows: median microseconds to give a finished request back, per contender, and graphkv's ratios."""
    plan = finish_plan()
    step = Step(plan)
    rows = []
    for pages in FINISH_PAGES:
        work = FinishWorkload(plan, step, pages)
        rows.append(_measured_row(("pages", pages), work.steps(), work.join, "finish", repeats))
        step.finish("r")
    return rows


def format_finish(rows: list[dict[str, Any]]) -> str:
    """The side-by-side finish table."""
    return _format_ratios(rows, "pages", "finish", "finish_ratio", "/")


def latency_table(max_batch: int, repeats: int) -> list[dict[str, Any]]:
    """Table 4 rows (GPU): one decode step eager vs replaying a captured graph."""
    plan = demo_plan(max_batch)
    step = Step(plan, "cuda")
    model = PagedTinyHybrid(init_weights(TinyHybridConfig()).to("cuda"), allocate(plan, "cuda"))
    fwd = graphkv.capture(plan, static_inputs={"input_ids": step.input_ids})(model.forward)
    fwd.capture(progress=True, prepare=step.capture_context)
    rows = []
    for n in (b for b in BATCHES if b <= max_batch):
        work = DecodeWorkload(plan, step, n)
        ids = torch.ones(n, dtype=torch.int64, device="cuda")

        def timed(forward: Callable[..., Any]) -> float:
            samples = []
            for _ in range(repeats):
                work.after_round()  # untimed: prefill again before the page is outgrown
                batch = work.next_batch()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step.run(forward, batch, input_ids=ids)
                torch.cuda.synchronize()
                samples.append(time.perf_counter() - t0)
            return statistics.median(samples)

        eager_s, graph_s = timed(model), timed(fwd)
        rows.append({"batch": n, "eager_ms": eager_s * 1e3, "captured_ms": graph_s * 1e3,
                     "speedup": eager_s / graph_s})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the tables, write the JSON; exit 1 (with a message) when Step.prepare is slower than a peer."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, repeats=101, out=DEFAULT_OUT, gpu="also time decode steps eager vs captured on CUDA")
    parser.add_argument("--max-batch", type=int, default=256, help="largest batch size (default: %(default)s)")
    args = parser.parse_args(argv)
    print(f"decode step host time, demo model (gated recurrence + flex attention groups), CPU tensors "
          f"({set_up(args)}; ratio = graphkv / peer)")
    host = host_table(args.max_batch, args.repeats)
    print(format_host(host))
    crossing = crossing_table(args.max_batch, args.repeats)
    print("\ndecode steps in which requests cross into new pages (about batch / 16 of them a step), host time; "
          "ratio = graphkv / peer")
    print(format_crossing(crossing))
    finish = finish_table(args.repeats)
    print("\na finished request given back (its attention pages + one state page), host time; ratio = graphkv / peer")
    print(format_finish(finish))
    result: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                              "threads": torch.get_num_threads(), "repeats": args.repeats, "host": host,
                              "crossing": crossing, "finish": finish}
    if args.gpu:
        if not torch.cuda.is_available():
            print("--gpu: skipped, CUDA is not available on this machine (graphs cannot be captured on a CPU)")
            result["latency"] = {"skipped": "CUDA not available"}
        else:
            lat = latency_table(args.max_batch, 50)
            print(f"\ndecode step latency on {torch.cuda.get_device_name()}, eager vs captured")
            for r in lat:
                print(f"{r['batch']:>6} {r['eager_ms']:>10.3f} ms {r['captured_ms']:>10.3f} ms {r['speedup']:>6.2f}x")
            result["latency"] = lat
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    slower = [f"{what} batch {r['batch']}: {peer} ratio {r[f'prepare_ratio_{peer}']}"
              for what, rows in (("repeated", host), ("crossing", crossing)) for r in rows
              for peer in ("list_to_tensor", "vllm_v1") if r[f"prepare_ratio_{peer}"] > 1.0]
    behind = [f"{r['pages']} pages ({peer} {r[f'finish_ratio_{peer}']})" for r in finish
              for peer in ("list_to_tensor", "vllm_v1") if r[f"finish_ratio_{peer}"] > 1.0]
    if behind:  # said, not failed: graphkv's finish does work the peers skip (see FINISH_WORK)
        print(f"Step.finish is slower than a peer at {'; '.join(behind)}: {FINISH_WORK}")
    if slower:
        print("Step.prepare is slower than a peer at " + "; ".join(slower), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
