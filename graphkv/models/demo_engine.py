"""A small continuous-batching engine around the paged tiny hybrid model.

It is the serving loop a user writes on top of graphkv, kept short: a FIFO scheduler with
chunked prefill, a free list of pool pages, greedy sampling. Each :meth:`DemoEngine.step`
decodes one token for every running request, admits waiting requests while rows, pages and the
token budget allow, runs the step through :class:`graphkv.runtime.step.Step` and releases the
pages of finished requests (later requests reuse them).

Page accounting per KV-cache group: an attention group needs ``cdiv(seq_len, block_size)`` pages
(sliding-window groups too: pages that left the window are not freed, so a request longer than a
sliding group's table is refused when added), a state (Mamba) group one page for the request's
life. Page 0 is the null page and never handed out. A request is admitted only when the free pages cover its whole life (prompt plus
``max_new_tokens``) besides what running requests may still take, so running requests never wait
for pages (there is no preemption: requests that all waited for pages would wait forever). With
``record=True`` the engine keeps every computed logit row with its request and position, so a
test can compare the paged run with the dense reference.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Hashable, Sequence

import attrs
import numpy as np
import torch

from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.models.prompts import check_vocab, prompt_ids
from graphkv.plan.plan import Plan
from graphkv.runtime.step.batch import Batch
from graphkv.runtime.step.step import Step
from graphkv.spec._checks import count_arg

__all__ = ["DemoEngine", "DemoRequest", "EngineStats", "engine_pages"]


def _prompt(value: Any) -> tuple[int, ...]:
    return tuple(prompt_ids(value, "DemoRequest.prompt").tolist())


def _new_tokens(value: Any) -> int:
    return count_arg("DemoRequest.max_new_tokens", value, 1, "pass how many tokens to generate, e.g. 16")


@attrs.frozen(kw_only=True)
class DemoRequest:
    """A request: its prompt token ids (a list of ints, a 1-D integer array or tensor; kept as a
    tuple of ints), how many tokens to generate (>= 1), and the token ids that end it early (an
    end-of-sequence token: generated, then the request finishes). Raises :class:`SpecError` for an
    empty prompt, ids that are not integers, a count that is not an integer >= 1 or an unhashable
    ``req_id``; :meth:`DemoEngine.add` checks the ids against the model's vocabulary."""

    req_id: Hashable
    prompt: tuple[int, ...] = attrs.field(converter=_prompt)
    max_new_tokens: int = attrs.field(converter=_new_tokens)
    stop_token_ids: frozenset[int] = attrs.field(default=frozenset(), converter=frozenset)

    def __attrs_post_init__(self) -> None:
        try:
            hash(self.req_id)
        except TypeError:
            raise SpecError(Problem(field="DemoRequest.req_id", value=self.req_id, limit="must be hashable (it keys "
                                    "the request's batch row)", fix="use a str or int request id")) from None


@attrs.define
class _Running:
    request: DemoRequest
    tokens: list[int]  # prompt + generated so far
    computed: int = 0  # tokens whose KV / state is in the pool
    pages: list[list[int]] = attrs.Factory(list)  # per group

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.request.prompt)


@attrs.define
class EngineStats:
    """Counters of a run: steps, tokens processed / generated, pages handed out, pages that were
    handed out again after a finished request released them, and seconds in :meth:`DemoEngine.step`."""

    steps: int = 0
    tokens: int = 0
    generated: int = 0
    pages_allocated: int = 0
    pages_reused: int = 0
    finished: int = 0
    seconds: float = 0.0


def engine_pages(groups: Sequence[Any], seq_len: int) -> list[int]:
    """Pages a request of ``seq_len`` tokens holds per group of ``groups`` (a plan's) in this engine:
    its state page, or ``cdiv(seq_len, block_size)`` attention pages (it frees no window pages)."""
    return [1 if g.is_ssm else -(-seq_len // g.block_size) for g in groups]


class DemoEngine:
    """Continuous batching over ``plan``'s pool with ``forward`` (an eager model, or a
    :class:`~graphkv.runtime.capture.CapturedForward` of it) driven through ``step``.

    ``forward`` returns one logits row per packed token, or with ``logits_per_request=True`` one
    row per batch row (the logits of each request's last token of the step, as
    :class:`graphkv.hf.PagedModel` computes by default). ``first_token_at[req_id]`` is the
    ``time.perf_counter()`` at which a request's first token was sampled (time to first token).
    ``vocab_size``: token ids the model embeds (default: ``forward.vocab_size`` when it has one, as
    :class:`~graphkv.models.paged_tiny_hybrid.PagedTinyHybrid` does); :meth:`add` refuses a prompt
    with an id outside ``[0, vocab_size)`` — negative ids always — before it is queued."""

    def __init__(self, plan: Plan, step: Step, forward: Callable[..., Any], *, record: bool = False,
                 logits_per_request: bool = False, vocab_size: int | None = None) -> None:
        self.vocab_size = vocab_size if vocab_size is not None else getattr(forward, "vocab_size", None)
        self.plan, self.step_api, self.forward = plan, step, forward
        self.record = record
        self.logits_per_request = logits_per_request
        self.records: list[tuple[Hashable, int, torch.Tensor]] = []  # (request, position, logits row)
        self.finished: dict[Hashable, list[int]] = {}  # request -> prompt + generated tokens
        self.first_token_at: dict[Hashable, float] = {}
        self.stats = EngineStats()
        self._waiting: deque[DemoRequest] = deque()
        self._running: dict[Hashable, _Running] = {}
        self._free = list(range(plan.num_blocks - 1, 0, -1))  # pop() hands out page 1 first
        self._released: set[int] = set()

    def add(self, request: DemoRequest) -> None:
        """Queue ``request``; it joins the batch when rows, pages and the token budget allow. Raises
        :class:`SpecError` for something else than a :class:`DemoRequest` or a prompt token id outside
        the vocabulary, :class:`CapacityError` for a request the plan cannot hold; nothing is queued then."""
        if not isinstance(request, DemoRequest):
            raise SpecError(Problem(field="request", value=type(request).__name__, limit="must be a DemoRequest",
                                    fix="wrap it: DemoRequest(req_id=..., prompt=[...], max_new_tokens=...)"))
        check_vocab([np.asarray(request.prompt, dtype=np.int64)], self.vocab_size,
                    lambda _: f"request {request.req_id!r}.prompt")
        limit = self.plan.max_model_len
        if not request.prompt or len(request.prompt) + request.max_new_tokens > limit:
            raise CapacityError(Problem(field=f"request {request.req_id!r}", value=(len(request.prompt),
                                                                                    request.max_new_tokens),
                                        limit=f"needs 1 <= prompt + max_new_tokens <= max_model_len={limit}",
                                        fix="shorten the prompt or generate fewer tokens"))
        need = self._lifetime_need(request)
        for group, pages in zip(self.plan.groups, need):
            if pages > group.pages_per_request:
                raise CapacityError(Problem(
                    field=f"request {request.req_id!r}", value=len(request.prompt) + request.max_new_tokens,
                    limit=f"needs {pages} pages in group {group.index} ({group.kind.value}) but its table holds "
                          f"{group.pages_per_request} (this engine keeps every page of a request to its end; it "
                          "frees none that left a sliding window)",
                    fix="plan with max_concurrent_batches >= cdiv(max_model_len, max_num_batched_tokens) "
                        "(graphkv.hf.generation.sliding_tables_for), or shorten the request"))
        self._waiting.append(request)

    @property
    def done(self) -> bool:
        """No request waiting or running."""
        return not self._waiting and not self._running

    def run(self, requests: Sequence[DemoRequest] = (), *, arrivals: dict[int, Sequence[DemoRequest]] | None = None,
            max_steps: int = 100_000, on_step: Callable[[EngineStats], None] | None = None) -> EngineStats:
        """Add ``requests``, then step until every request (including ``arrivals[step]``, added
        before that step) has finished, calling ``on_step(stats)`` after each step (progress).
        Returns the stats."""
        for r in requests:
            self.add(r)
        arrivals = dict(arrivals or {})
        while not self.done or arrivals:
            for r in arrivals.pop(self.stats.steps, ()):
                self.add(r)
            if self.stats.steps >= max_steps:
                raise CapacityError(Problem(field="max_steps", value=max_steps, limit="the run did not finish",
                                            fix="raise max_steps, or check that requests fit the pool"))
            self.step()
            if on_step is not None:
                on_step(self.stats)
        return self.stats

    def step(self) -> None:
        """Schedule, run and sample one step (a no-op step when nothing can run)."""
        start = time.perf_counter()
        batch, chunks = self._schedule()
        if not chunks:
            self.stats.steps += 1
            return
        ids = [t for run, n in chunks for t in run.tokens[run.computed:run.computed + n]]
        logits = self.step_api.run(self.forward, batch, input_ids=ids)
        ends, offset = [], 0
        for run, n in chunks:
            offset += n
            ends.append(offset - 1)
        rows = list(range(len(chunks))) if self.logits_per_request else ends
        if self.record:
            self._record(chunks, logits, rows)
        next_tokens = logits[rows].argmax(-1).tolist()
        now = time.perf_counter()
        for (run, n), token in zip(chunks, next_tokens):
            run.computed += n
            if run.computed == len(run.tokens):  # the query reached the end: sample
                run.tokens.append(int(token))
                self.stats.generated += 1
                self.first_token_at.setdefault(run.request.req_id, now)
                if run.generated >= run.request.max_new_tokens or token in run.request.stop_token_ids:
                    self._finish(run)
        self.stats.steps += 1
        self.stats.tokens += len(ids)
        self.stats.seconds += time.perf_counter() - start

    def _record(self, chunks: list[tuple[_Running, int]], logits: torch.Tensor, rows: list[int]) -> None:
        """Keep the step's logits rows with their request and position (every token, or each
        request's last token of the step)."""
        if self.logits_per_request:
            for (run, n), row in zip(chunks, rows):
                self.records.append((run.request.req_id, run.computed + n - 1, logits[row].detach().cpu()))
            return
        offset = 0
        for run, n in chunks:
            for i in range(n):
                self.records.append((run.request.req_id, run.computed + i, logits[offset + i].detach().cpu()))
            offset += n

    def _schedule(self) -> tuple[Batch, list[tuple[_Running, int]]]:
        limits = self.plan.limits
        budget = limits.max_num_batched_tokens
        chunks: list[tuple[_Running, int]] = []
        new_pages: list[tuple[tuple[int, ...], ...]] = []
        for run in self._running.values():  # running requests first: decode or the next prefill chunk
            n = min(len(run.tokens) - run.computed, budget)
            if n == 0:
                continue
            pages = self._grow(run, run.computed + n)
            chunks.append((run, n))
            new_pages.append(pages)
            budget -= n
        # Pages the running requests may still take; the rest can be promised to a new request.
        promised = sum(self._lifetime_pages(run.request) - sum(map(len, run.pages))
                       for run in self._running.values())
        while self._waiting and budget > 0 and len(self._running) < limits.max_num_seqs:
            request = self._waiting[0]
            if self._lifetime_pages(request) > len(self._free) - promised:
                break  # FIFO: the head of the queue waits for pages
            run = _Running(request=request, tokens=list(request.prompt), pages=[[] for _ in self.plan.groups])
            n = min(len(run.tokens), budget)
            pages = self._grow(run, n)
            promised += self._lifetime_pages(request) - sum(map(len, run.pages))
            self._waiting.popleft()
            self._running[request.req_id] = run
            chunks.append((run, n))
            new_pages.append(pages)
            budget -= n
        batch = Batch(req_ids=tuple(run.request.req_id for run, _ in chunks),
                      query_lens=tuple(n for _, n in chunks),
                      seq_lens=tuple(run.computed + n for run, n in chunks),
                      new_pages=tuple(p if p else None for p in new_pages) if any(new_pages) else ())
        return batch, chunks

    def _lifetime_pages(self, request: DemoRequest) -> int:
        """Pages ``request`` holds at its end, all groups: its last computed token is at
        ``prompt + max_new_tokens - 1`` (the last sampled token is never fed back)."""
        return sum(self._lifetime_need(request))

    def _lifetime_need(self, request: DemoRequest) -> list[int]:
        """Per group, the pages ``request`` holds at its end (see :meth:`_lifetime_pages`)."""
        return self._pages_for(len(request.prompt) + max(request.max_new_tokens - 1, 0))

    def _pages_for(self, seq_len: int) -> list[int]:
        return engine_pages(self.plan.groups, seq_len)

    def _grow(self, run: _Running, seq_len: int) -> tuple[tuple[int, ...], ...]:
        """Pages ``run`` gains to hold ``seq_len`` tokens, per group (``()`` when it needs none).
        Admission promised every request its lifetime pages, so the free list always has them."""
        need = [max(0, want - len(held)) for want, held in zip(self._pages_for(seq_len), run.pages)]
        assert sum(need) <= len(self._free), "admission promised every request its lifetime pages"
        if not any(need):
            return ()
        out = []
        for g, n in enumerate(need):
            ids = tuple(self._free.pop() for _ in range(n))
            self.stats.pages_allocated += n
            self.stats.pages_reused += sum(1 for p in ids if p in self._released)
            run.pages[g].extend(ids)
            out.append(ids)
        return tuple(out)

    def _finish(self, run: _Running) -> None:
        req_id = run.request.req_id
        del self._running[req_id]
        self.step_api.finish(req_id)
        for pages in run.pages:
            self._free.extend(pages)
            self._released.update(pages)
        self.finished[req_id] = run.tokens
        self.stats.finished += 1
