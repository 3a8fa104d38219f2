"""A tiny model served through Step with its own page free list, a state snapshot and the dense reference.

Used by the refusal, prefix-sharing and property tests: each runs valid steps, tries a bad one,
checks that the step state is exactly as before, then checks that a valid decode of the live
requests still gives the dense (non-paged) reference's logits.
"""

from __future__ import annotations

from typing import Any, Hashable

import numpy as np
import pytest
import torch

import graphkv
from graphkv.models.paged_tiny_hybrid import PagedTinyHybrid
from graphkv.models.tiny_hybrid import TinyHybridConfig, dense_forward, init_weights, model_kv
from graphkv.errors import SpecError
from graphkv.runtime import Batch, Step, allocate

TOLERANCE = 2e-4  # paged vs dense logits (float32); normal agreement is ~1e-6


class Harness:
    """One plan of the tiny hybrid model (``pattern``: "A" attention, "M" recurrence), a Step over its
    pool, per-request tokens and pages, and a free list handing out pages 1, 2, 3, ..."""

    def __init__(self, pattern: str = "MAMA", *, num_blocks: int = 40, max_num_seqs: int = 4, budget: int = 64,
                 max_model_len: int = 128, seed: int = 0, **limits: Any) -> None:
        config = TinyHybridConfig(pattern=pattern)
        self.plan = graphkv.compile(model_kv(config), graphkv.Limits(
            max_model_len=max_model_len, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
            num_blocks_override=num_blocks, **limits), None)
        self.weights = init_weights(config, seed=seed)
        self.model = PagedTinyHybrid(self.weights, allocate(self.plan))
        self.step = Step(self.plan)
        self.tokens: dict[Hashable, list[int]] = {}  # every token of a request (prompt + generated)
        self.computed: dict[Hashable, int] = {}  # tokens written into the pool
        self.pages: dict[Hashable, list[list[int]]] = {}  # per group
        self.free = list(range(num_blocks - 1, 0, -1))  # pop() hands out page 1 first
        self._gen = torch.Generator().manual_seed(seed + 1)
        self.attention = [g.index for g in self.plan.groups if not g.is_ssm]
        self.state = [g.index for g in self.plan.groups if g.is_ssm]
        self._joining: dict[Hashable, list[list[int]]] = {}  # cached pages a joining request starts with

    # ---- building steps ------------------------------------------------------------------------

    def add(self, req: Hashable, prompt_len: int, prompt: list[int] | None = None,
            cached_pages: list[list[int]] | None = None, cached_tokens: int = 0) -> None:
        """Queue a request with a random prompt (it joins at its first step); ``cached_pages`` (per
        group) hold its first ``cached_tokens`` tokens already (prefix caching)."""
        self.tokens[req] = prompt if prompt is not None else torch.randint(0, 97, (prompt_len,),
                                                                           generator=self._gen).tolist()
        self.computed[req] = cached_tokens
        self.pages[req] = [list(p) for p in cached_pages] if cached_pages else [[] for _ in self.plan.groups]
        if cached_pages:
            self._joining[req] = [list(p) for p in cached_pages]

    def pages_needed(self, req: Hashable, seq_len: int) -> list[int]:
        """Pages ``req`` lacks per group to hold ``seq_len`` tokens."""
        held = self.pages[req]
        return [max(0, (1 if g.is_ssm else -(-seq_len // g.block_size)) - len(held[g.index]))
                for g in self.plan.groups]

    def batch(self, chunks: dict[Hashable, int]) -> tuple[Batch, list[int], list[list[int]]]:
        """The batch that runs ``chunks[req]`` more tokens of each request, its token ids, and the new
        pages per request (taken from the free list only when :meth:`commit` is called)."""
        new_pages, ids, taken = [], [], 0
        for req, n in chunks.items():
            start = self.computed[req]
            ids += self.tokens[req][start:start + n]
            need = self.pages_needed(req, start + n)
            per_group = []
            cached = self._joining.get(req, [[] for _ in self.plan.groups])
            for g, count in enumerate(need):
                fresh = self.free[len(self.free) - taken - count:len(self.free) - taken][::-1]
                per_group.append(tuple(cached[g]) + tuple(fresh))
                taken += count
            new_pages.append(tuple(per_group) if any(per_group) else None)
        batch = Batch(req_ids=tuple(chunks), query_lens=tuple(chunks.values()),
                      seq_lens=tuple(self.computed[r] + n for r, n in chunks.items()),
                      new_pages=tuple(new_pages) if any(p is not None for p in new_pages) else ())
        return batch, ids, [list(p) if p else [] for p in new_pages]

    def run(self, chunks: dict[Hashable, int], *, check: bool = True) -> torch.Tensor:
        """Run a valid step (pages from the free list), generate where a request's query reached its
        end, and check every token's logits against the dense reference."""
        batch, ids, new_pages = self.batch(chunks)
        logits = self.step.run(self.model, batch, input_ids=ids)
        offset = 0
        for (req, n), pages in zip(chunks.items(), new_pages):
            cached = self._joining.pop(req, [[] for _ in self.plan.groups])
            for g, group_pages in enumerate(pages):
                for p in group_pages:
                    if p in self.free:  # a claimed page only a finished request wrote is taken from the free list
                        self.free.remove(p)
                self.pages[req][g] += [p for p in group_pages if p not in cached[g]]
            start = self.computed[req]
            if check:
                want = dense_forward(self.weights, self.tokens[req][:start + n])[start:start + n]
                worst = (logits[offset:offset + n] - want).abs().max().item()
                assert worst < TOLERANCE, (req, worst)
            self.computed[req] = start + n
            if self.computed[req] == len(self.tokens[req]):
                self.tokens[req].append(int(logits[offset + n - 1].argmax()))
            offset += n
        return logits

    def group_pages(self, attention=(), state=()) -> tuple:
        """One request's ``new_pages`` entry: ``attention`` for every attention group, ``state`` for every
        state group."""
        out = [()] * len(self.plan.groups)
        for g in self.attention:
            out[g] = tuple(attention)
        for g in self.state:
            out[g] = tuple(state)
        return tuple(out)

    def run_failing(self, batch: Batch, input_ids: list[int], message: str = "the forward failed", *,
                    recover: bool = True) -> None:
        """``batch`` with a forward that raises ``RuntimeError(message)``: the error reaches the caller and
        the step state (the per-step rows aside) is exactly as before, but for the batch's state pages, which
        vouch for no finished request's state any more (``filled`` 0, ``filled_at`` -1: the forward may have
        advanced them in place), and for its running requests on a plan with state layers, which are the
        Step's ``unsure_requests``: their next step is refused, so each is finished and prefilled again from its
        first token (:meth:`prefill_again`, unless ``recover`` is false), as an engine does."""
        running = [r for r in batch.req_ids if r in self.step.active_requests]
        before = self.snapshot(inputs=False)

        def failing(input_ids):
            raise RuntimeError(message)

        with pytest.raises(RuntimeError, match=message):
            self.step.run(failing, batch, input_ids=input_ids)
        own, state_pages = self.step.ownership, set()
        for i, req in enumerate(batch.req_ids):
            for g in self.state:
                state_pages.update(self.pages.get(req, [[]] * len(self.plan.groups))[g][:1])
                if batch.new_pages and batch.new_pages[i] is not None:
                    state_pages.update(batch.new_pages[i][g][:1])
        for name, now in (("filled", 0), ("filled_at", -1)):
            changed = np.flatnonzero(before[name] != getattr(own, name))
            assert set(changed.tolist()) <= state_pages and (getattr(own, name)[changed] == now).all(), name
            before[name] = getattr(own, name).copy()
        self.assert_unchanged(before)
        unsure = running if self.state else []
        assert list(self.step.unsure_requests) == unsure, (self.step.unsure_requests, unsure)
        for req in unsure if recover else ():
            self.prefill_again(req)

    def prefill_again(self, req: Hashable) -> None:
        """A request whose state a failed forward may have advanced: its next step is refused (naming it); it is
        finished and prefilled again from its first token (prompt and generated tokens), the logits checked."""
        batch, ids, _ = self.batch({req: 1})
        with pytest.raises(SpecError, match=r"raised and was taken back \(Step.undo\), and may have advanced"):
            self.step.prepare(batch)
        tokens = self.tokens[req][:self.computed[req]]  # those in the pool; the last sampled one is fed next
        rest = self.tokens[req][self.computed[req]:]
        self.finish(req)
        self.add(req, 0, prompt=tokens + rest)
        budget = self.plan.limits.max_num_batched_tokens
        for start in range(0, len(tokens), budget):  # the prefilled tokens again, in chunks the step allows
            self.run({req: min(budget, len(tokens) - start)})
        assert req not in self.step.unsure_requests

    def decode_all(self) -> torch.Tensor:
        """One decode step of every live request (checked against the dense reference)."""
        return self.run({r: 1 for r in self.step.active_requests})

    def finish(self, req: Hashable) -> None:
        """The request leaves; its pages no live request holds any more go back to the free list."""
        self.step.finish(req)
        holders = self.step.ownership.holders
        for group_pages in self.pages.pop(req):
            self.free.extend(p for p in group_pages if holders[p] == 0)
        del self.tokens[req], self.computed[req]

    # ---- state ---------------------------------------------------------------------------------

    def snapshot(self, *, inputs: bool = True) -> dict[str, Any]:
        """Everything a refused step must leave as it was: rows, free rows, host and device tables
        (the per-step rows too with ``inputs``), holder counts and written tokens."""
        step, tables, own = self.step, self.step.tables, self.step.ownership
        snap = {"rows": {r: step.row_of(r) for r in step.active_requests}, "free_rows": list(step._requests.free),
                "pages": [p.copy() for p in tables.pages_np], "num_pages": tables.num_pages_np.copy(),
                "device": [t.clone() for t in tables.tables]}
        for name in ("holders", "group_of", "written", "writer_row", "writer_col", "filled", "filled_at"):
            snap[name] = getattr(own, name).copy()
        snap["num_shared"] = own.num_shared
        if inputs:
            snap["inputs"] = [t.clone() for t in tables.input_tables]
        return snap

    def assert_unchanged(self, before: dict[str, Any]) -> None:
        """The step state equals ``before`` (see :meth:`snapshot`)."""
        after = self.snapshot(inputs="inputs" in before)
        assert after.keys() == before.keys()
        for name, value in before.items():
            now = after[name]
            if isinstance(value, list) and value and isinstance(value[0], (np.ndarray, torch.Tensor)):
                assert all((a == b).all() for a, b in zip(value, now)), name
            elif isinstance(value, np.ndarray):
                assert np.array_equal(value, now), name
            else:
                assert value == now, name

    def check_accounting(self) -> None:
        """Held pages + free pages == usable pages, the holder counts equal the tables' entries, and the
        shared-page count kept step by step equals a count over the pool."""
        own, tables = self.step.ownership, self.step.tables
        assert int((own.holders > 0).sum()) + len(self.free) == self.plan.num_blocks - 1
        assert int(own.holders.sum()) == int(tables.num_pages_np.sum())
        assert own.num_shared == int((own.holders > 1).sum())
        assert own.holders[0] == 0 and (own.holders >= 0).all()
