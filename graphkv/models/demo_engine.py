"""A small continuous-batching engine around the paged tiny hybrid model.

It is the serving loop a user writes on top of graphkv, kept short: a FIFO scheduler with
chunked prefill, a free list of pool pages, greedy sampling. Each :meth:`DemoEngine.step`
decodes one token for every running request, admits waiting requests while rows, pages and the
token budget allow, runs the step through :class:`graphkv.runtime.step.Step` and releases the
pages of finished requests (later requests reuse them).

Page accounting per KV-cache group: an attention group needs ``cdiv(seq_len, block_size)`` pages
(sliding-window groups too: pages that left the window are not freed, so a request longer than a
sliding group's table is refused when added), a state (Mamba) group one page for the request's
life. Page 0 is the null page and never handed out. A request is admitted only when the free pages
cover its whole life (prompt plus ``max_new_tokens``) besides what running requests may still take,
so running requests never wait for pages (there is no preemption: requests that all waited for
pages would wait forever). With ``record=True`` the engine keeps every computed logit row with its
request and position, so a test can compare the paged run with the dense reference.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Hashable, Mapping, Sequence

import attrs
import numpy as np
import torch

from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.models.demo_request import DemoRequest, request_list
from graphkv.models.engine_stats import EngineStats
from graphkv.models.greedy_sampler import GreedySampler, SampledTokens
from graphkv.models.prompts import check_vocab
from graphkv.plan.plan import Plan
from graphkv.runtime.step.batch import Batch
from graphkv.runtime.step.step import Step
from graphkv.spec._checks import is_hashable, whole_int

__all__ = ["DemoEngine", "DemoRequest", "EngineStats", "engine_pages"]  # DemoRequest, EngineStats: their modules


@attrs.define
class _Running:
    request: DemoRequest
    tokens: list[int]  # prompt + generated so far
    computed: int = 0  # tokens whose KV / state is in the pool
    pages: list[list[int]] = attrs.Factory(list)  # per group
    covered: int = 0  # tokens the held pages hold in every group (a step up to it takes no page)
    end: int = 0  # len(tokens) at which it has all its new tokens (prompt + max_new_tokens)
    lifetime: int = 0  # pages it holds at its end, all groups (set at admission)

    def __attrs_post_init__(self) -> None:
        self.end = len(self.request.prompt) + self.request.max_new_tokens


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
    ``time.perf_counter()`` at which a request's first token was read on the host (time to first
    token). ``overlap`` (default on): launch a decode step before the host has read the previous
    step's tokens, so the host's work for one step overlaps the device's for the last (see
    :meth:`step`; the tokens are the same either way, and ``record=True`` turns it off).
    ``vocab_size``: token ids the model embeds (default: ``forward.vocab_size`` when it has one, as
    :class:`~graphkv.models.paged_tiny_hybrid.PagedTinyHybrid` does); :meth:`add` refuses a prompt
    with an id outside ``[0, vocab_size)`` — negative ids always — before it is queued. ``step`` must hold
    no live request (:class:`SpecError` otherwise): the engine hands out every page but the null page.
    A step whose forward (or the sampling of its logits) raises — out of memory, an interrupt — is undone:
    its pages back on the free list as they were, its newly admitted requests queued again, so :meth:`run` can
    be called again to go on. A state (Mamba) layer that updated a request's state in place before the error
    may have advanced it (see :meth:`~graphkv.runtime.step.Step.run`): the step's running requests on a plan with
    state layers are queued again at the head, to prefill their tokens so far (prompt and generated) from the first,
    so the tokens are those of a run that never failed."""

    def __init__(self, plan: Plan, step: Step, forward: Callable[..., Any], *, record: bool = False,
                 logits_per_request: bool = False, vocab_size: int | None = None, overlap: bool = True) -> None:
        live = tuple(getattr(step, "active_requests", ()))  # a stand-in step without it is taken as empty
        if live:  # their pages are not on this engine's free list: it would hand them out again
            shown = ", ".join(map(repr, live[:8])) + (f" and {len(live) - 8} more" if len(live) > 8 else "")
            raise SpecError(Problem(field="step", value=f"{len(live)} live request(s): {shown}",
                                    limit="a new engine starts from an empty step (every pool page free)",
                                    fix="keep using the engine that admitted them, or finish them first "
                                        "(ServingLoop.finish(req_id) / Step.finish(req_id))"))
        self.vocab_size = vocab_size if vocab_size is not None else getattr(forward, "vocab_size", None)
        self.plan, self.step_api, self.forward = plan, step, forward
        self.record = record
        self.logits_per_request = logits_per_request
        self.records: list[tuple[Hashable, int, torch.Tensor]] = []  # (request, position, logits row)
        self.finished: dict[Hashable, list[int]] = {}  # request -> prompt + generated tokens
        self.first_token_at: dict[Hashable, float] = {}
        self.stats = EngineStats()
        self._waiting: deque[DemoRequest] = deque()
        self._waiting_ids: set[Hashable] = set()
        self._promised = 0  # pages the running requests may still take (lifetime pages less those held)
        self._running: dict[Hashable, _Running] = {}
        self._free = list(range(plan.num_blocks - 1, 0, -1))  # pop() hands out page 1 first
        self._released: set[int] = set()
        self._resume: dict[Hashable, list[int]] = {}  # a request queued again -> its tokens so far, to prefill
        self.overlap = bool(overlap)
        self._sampled: SampledTokens | None = None  # the last step's tokens, not read on the host yet
        self._sampler = GreedySampler(plan.limits.max_num_seqs)

    def add(self, request: DemoRequest) -> None:
        """Queue ``request``; it joins the batch when rows, pages and the token budget allow. Raises
        :class:`SpecError` for something else than a :class:`DemoRequest` or a prompt token id outside
        the vocabulary or a ``req_id`` already waiting, running or finished in this engine (its tokens
        would replace the other's), :class:`CapacityError` for a request the plan cannot hold; nothing is
        queued then."""
        self._check(request, ())
        self._enqueue(request)

    def holds(self, req_id: Hashable) -> bool:
        """Whether ``req_id`` is waiting or running in this engine."""
        return is_hashable(req_id) and (req_id in self._running or req_id in self._waiting_ids)

    def abort(self, req_id: Hashable) -> list[int]:
        """Stop ``req_id``, waiting or running, and return its tokens so far (prompt and generated): it leaves the
        queue or its Step row, its pages go back on the free list, and it is not in :attr:`finished`. (A token
        of an overlapped step still in flight for it is dropped.) :class:`SpecError` for an id that is neither
        waiting nor running here. Use it, not ``Step.finish`` / ``ServingLoop.finish``, for an engine's requests:
        those leave the engine holding the request's pages."""
        run = self._running.get(req_id) if is_hashable(req_id) else None
        if run is not None:
            self._release(run)
            self._resume.pop(req_id, None)
            return run.tokens
        if not self.holds(req_id):
            raise SpecError(Problem(field="req_id", value=req_id, limit="is neither waiting nor running in this engine"
                                    + (" (it finished: engine.finished holds its tokens)" if is_hashable(req_id)
                                       and req_id in self.finished else ""),
                                    fix="pass the id of a request added to this engine that has not finished"))
        request = next(r for r in self._waiting if r.req_id == req_id)
        self._waiting.remove(request)
        self._waiting_ids.discard(req_id)
        return self._resume.pop(req_id, None) or list(request.prompt)

    def _enqueue(self, request: DemoRequest) -> None:
        self._waiting.append(request)
        self._waiting_ids.add(request.req_id)

    def _check(self, request: DemoRequest, taken: "set[Hashable] | tuple[()]") -> None:
        """Raise as :meth:`add` would for ``request``, ``taken`` holding the ids of requests checked
        beside it (to be added in the same call); changes nothing."""
        if not isinstance(request, DemoRequest):
            raise SpecError(Problem(field="request", value=type(request).__name__, limit="must be a DemoRequest",
                                    fix="wrap it: DemoRequest(req_id=..., prompt=[...], max_new_tokens=...)"))
        rid = request.req_id
        if rid in self._running or rid in self.finished or rid in self._waiting_ids or rid in taken:
            where = ("running" if rid in self._running else "finished" if rid in self.finished
                     else "waiting" if rid in self._waiting_ids else "given twice in this run")
            raise SpecError(Problem(field="request.req_id", value=rid, limit=f"is {where} in this engine already",
                                    fix="give every request its own id (or read and del engine.finished[id] "
                                        "before reusing a finished one)"))
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

    @property
    def done(self) -> bool:
        """No request waiting or running, and no sampled token left unread."""
        return not self._waiting and not self._running and self._sampled is None

    def run(self, requests: Sequence[DemoRequest] = (), *, arrivals: dict[int, Sequence[DemoRequest]] | None = None,
            max_steps: int = 100_000, on_step: Callable[[EngineStats], None] | None = None) -> EngineStats:
        """Add ``requests``, then step until every request (including ``arrivals[step]``, added
        before that step) has finished, calling ``on_step(stats)`` after each step (progress).
        Returns the stats. Raises, before adding anything, what :meth:`add` raises for any of
        ``requests`` and the arrivals (an id given twice among them included), and :class:`SpecError`
        for ``requests`` or an arrival that is not a sequence of :class:`DemoRequest`, an arrival step
        that is not an int in ``[stats.steps, max_steps)`` (such requests would never be added), a
        ``max_steps`` that is not an int >= 0 or an ``on_step`` that is not callable."""
        steps = whole_int(max_steps)
        if steps is None or steps < 0:
            raise SpecError(Problem(field="max_steps", value=max_steps, limit="must be an int >= 0",
                                    fix="pass how many steps the run may take at most, e.g. 100_000"))
        if on_step is not None and not callable(on_step):
            raise SpecError(Problem(field="on_step", value=type(on_step).__name__, limit="must be callable or None",
                                    fix="pass a function of the EngineStats, e.g. on_step=lambda s: print(s.steps)"))
        if arrivals is not None and not isinstance(arrivals, Mapping):
            raise SpecError(Problem(field="arrivals", value=type(arrivals).__name__,
                                    limit="must be a dict of step -> requests",
                                    fix="pass e.g. arrivals={3: [DemoRequest(...)]}"))
        arrivals = dict(arrivals or {})
        late = [k for k in arrivals if whole_int(k) is None or not self.stats.steps <= k < steps]
        if late:
            raise SpecError(Problem(field="arrivals", value=late,
                                    limit=f"keys must be step numbers (ints) in [current step {self.stats.steps}, "
                                          f"max_steps={steps})",
                                    fix="key each list of requests by the step before which it arrives, counting "
                                        "from engine.stats.steps (or raise max_steps)"))
        requests = request_list("requests", requests)
        arrivals = {whole_int(k): request_list(f"arrivals[{k!r}]", v) for k, v in arrivals.items()}
        taken: set[Hashable] = set()
        for r in (*requests, *(r for later in arrivals.values() for r in later)):  # all checked before any is added
            self._check(r, taken)
            taken.add(r.req_id)
        for r in requests:
            self._enqueue(r)
        while not self.done or arrivals:
            for r in arrivals.pop(self.stats.steps, ()):
                self._enqueue(r)
            if self.stats.steps >= steps and self._sampled is not None:
                sampled, self._sampled = self._sampled, None
                self._read(sampled)  # the last step's tokens: reading them is no step
                continue
            if self.stats.steps >= steps:
                raise CapacityError(Problem(field="max_steps", value=steps, limit="the run did not finish",
                                            fix="raise max_steps, or check that requests fit the pool"))
            self.step()
            if on_step is not None:
                on_step(self.stats)
        return self.stats

    def step(self) -> None:
        """Schedule, run and sample one step (a no-op step when nothing can run).

        With ``overlap`` (the default), when every running request decoded in the last step and that
        step's tokens finish none of them and admit nobody, the next decode step is launched from
        the sampled tokens on the device before the host reads them: the host's work for step n+1
        (scheduling, tables, metadata) runs while the device computes step n, and step n's tokens
        are read (one sync) after step n+1 is queued. A request whose step-n token is a stop token
        has computed one token more in step n+1; that token is dropped when the request finishes.
        Otherwise the last step's tokens are read first and the step is scheduled from the host."""
        start = time.perf_counter()
        sampled, self._sampled = self._sampled, None
        unsure = bool(getattr(self.step_api, "unsure_requests", ()))  # only after a failed step on state layers
        if sampled is not None and not unsure and self._can_overlap(sampled):
            self._sampled = self._launch_decode(sampled)
            self.stats.overlapped += 1
            self._read(sampled)
        else:
            if sampled is not None:
                self._read(sampled)
            if unsure:
                self._recompute_unsure()
            batch, chunks, grown, num_admitted = self._schedule()
            if not chunks:
                if sampled is None:
                    self.stats.steps += 1  # nothing ran and nothing was read: a step with no work
                self.stats.seconds += time.perf_counter() - start
                return
            ids = [t for run, n in chunks for t in run.tokens[run.computed:run.computed + n]]
            ends, offset = [], 0
            for run, n in chunks:
                offset += n
                ends.append(offset - 1)
            rows = list(range(len(chunks))) if self.logits_per_request else ends
            sampling = [(i, run) for i, (run, n) in enumerate(chunks) if run.computed + n == len(run.tokens)]
            num_records, ran = len(self.records), False
            try:
                logits = self.step_api.run(self.forward, batch, input_ids=ids)  # undoes itself when it raises
                ran = True
                if self.record:
                    self._record(chunks, logits, rows)
                if sampling:  # requests whose query reached the end of their tokens
                    index, runs = zip(*sampling)
                    self._sampled = self._sampler.sample(logits, [rows[i] for i in index], list(runs))
            except BaseException:  # out of memory, an interrupt: undo the step, so run() can go on
                del self.records[num_records:]
                undo = getattr(self.step_api, "undo", None)
                if ran and callable(undo):  # the Step ran it: reading its logits failed
                    undo()
                self._unschedule(chunks, grown, num_admitted)
                self.stats.seconds += time.perf_counter() - start
                raise
            for run, n in chunks:
                run.computed += n
            self.stats.tokens += len(ids)
            if not self.overlap and self._sampled is not None:
                sampled, self._sampled = self._sampled, None
                self._read(sampled)
        self.stats.steps += 1
        self.stats.seconds += time.perf_counter() - start

    def _can_overlap(self, sampled: SampledTokens) -> bool:
        """Whether the next step is ``sampled``'s requests decoding once more, known before its tokens
        are read: every running request sampled, none reaches ``max_new_tokens`` with that token, and
        no waiting request would be admitted now."""
        if not self.overlap or self.record or len(sampled.owners) != len(self._running):
            return False
        if any(len(run.tokens) + 1 >= run.end for run in sampled.owners):
            return False
        budget = self.plan.limits.max_num_batched_tokens - len(sampled.owners)
        return not (self._waiting and budget > 0 and len(self._running) < self.plan.limits.max_num_seqs
                    and self._lifetime_pages(self._waiting[0]) <= len(self._free) - self._promised)

    def _launch_decode(self, sampled: SampledTokens) -> SampledTokens:
        """Run one decode step of ``sampled``'s requests with its tokens still on the device; sample it."""
        runs = sampled.owners
        new_pages = [self._grow(run, run.computed + 1) for run in runs]
        batch = Batch(req_ids=tuple(run.request.req_id for run in runs), query_lens=(1,) * len(runs),
                      seq_lens=tuple(run.computed + 1 for run in runs),
                      new_pages=tuple(p if p else None for p in new_pages) if any(new_pages) else ())
        try:
            logits = self.step_api.run(self.forward, batch, input_ids=sampled.tokens)
        except BaseException:  # the Step undid itself: give the pages back, keep the tokens to read
            for run, pages in zip(reversed(runs), reversed(new_pages)):
                self._ungrow(run, pages)
            self._sampled = sampled
            raise
        for run in runs:
            run.computed += 1
        self.stats.tokens += len(runs)
        return self._sampler.sample(logits, range(len(runs)), runs)

    def _read(self, sampled: SampledTokens) -> None:
        """Wait for ``sampled``'s tokens on the host and give them to their requests (those still
        running: a request that finished at a stop token meanwhile drops its extra token)."""
        tokens_read = sampled.read()
        now, running, generated = time.perf_counter(), self._running, 0
        for run, token in zip(sampled.owners, tokens_read):
            request = run.request
            if running.get(request.req_id) is not run:
                continue  # it finished at the token before this one
            tokens = run.tokens
            tokens.append(token)
            generated += 1
            if len(tokens) == len(request.prompt) + 1:
                self.first_token_at[request.req_id] = now
            if len(tokens) >= run.end or token in request.stop_token_ids:
                self._finish(run)
        self.stats.generated += generated

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

    def _schedule(self) -> tuple[Batch, list[tuple[_Running, int]], list[tuple[tuple[int, ...], ...]], int]:
        """The next step's batch, its ``(request, tokens)`` chunks (running requests first, then the
        requests admitted now: the last ``num_admitted``) and the pages each chunk was handed
        (:meth:`_grow`'s return values)."""
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
        num_running = len(chunks)
        while self._waiting and budget > 0 and len(self._running) < limits.max_num_seqs:
            request = self._waiting[0]
            lifetime = self._lifetime_pages(request)
            if lifetime > len(self._free) - self._promised:
                break  # FIFO: the head of the queue waits for pages (the rest is promised to running ones)
            run = _Running(request=request, tokens=self._resume.pop(request.req_id, None) or list(request.prompt),
                           pages=[[] for _ in self.plan.groups], lifetime=lifetime)
            self._promised += lifetime  # _grow takes back what it hands out
            n = min(len(run.tokens), budget)
            pages = self._grow(run, n)
            self._waiting.popleft()
            self._waiting_ids.discard(request.req_id)
            self._running[request.req_id] = run
            chunks.append((run, n))
            new_pages.append(pages)
            budget -= n
        batch = Batch(req_ids=tuple(run.request.req_id for run, _ in chunks),
                      query_lens=tuple(n for _, n in chunks),
                      seq_lens=tuple(run.computed + n for run, n in chunks),
                      new_pages=tuple(p if p else None for p in new_pages) if any(new_pages) else ())
        return batch, chunks, new_pages, len(chunks) - num_running

    def _unschedule(self, chunks: list[tuple[_Running, int]], grown: list[tuple[tuple[int, ...], ...]],
                    num_admitted: int) -> None:
        """Undo :meth:`_schedule` after its step failed: the pages it handed out back on the free list
        as they were, and the requests it admitted back at the head of the queue, in their order,
        without their promise."""
        for (run, _), pages in zip(reversed(chunks), reversed(grown)):
            self._ungrow(run, pages)
        for run, _ in reversed(chunks[len(chunks) - num_admitted:]):
            request = run.request
            del self._running[request.req_id]
            self._promised -= run.lifetime
            self._waiting.appendleft(request)
            self._waiting_ids.add(request.req_id)
            if len(run.tokens) > len(request.prompt):  # one queued again after a failed step: still to resume
                self._resume[request.req_id] = run.tokens

    def _recompute_unsure(self) -> None:
        """Queue again, at the head, the running requests whose state a failed step may have advanced (the Step's
        ``unsure_requests``): finished in the Step, their pages back on the free list, to prefill their tokens so
        far (vLLM's preemption by recompute)."""
        for req_id in reversed([r for r in self.step_api.unsure_requests if r in self._running]):
            run = self._running[req_id]
            self._release(run)
            self._resume[req_id] = run.tokens
            self._waiting.appendleft(run.request)
            self._waiting_ids.add(req_id)

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
        if seq_len <= run.covered:
            return ()  # most steps: no group crosses a page boundary
        need = [max(0, want - len(held)) for want, held in zip(self._pages_for(seq_len), run.pages)]
        assert sum(need) <= len(self._free), "admission promised every request its lifetime pages"
        if not any(need):
            return ()
        out = []
        for g, n in enumerate(need):
            ids = tuple(self._free.pop() for _ in range(n))
            self._promised -= n
            self.stats.pages_allocated += n
            self.stats.pages_reused += sum(1 for p in ids if p in self._released)
            run.pages[g].extend(ids)
            out.append(ids)
        self._cover(run)
        return tuple(out)

    def _cover(self, run: _Running) -> None:
        """Set ``run.covered`` from the pages it holds: the fewest tokens any group's pages hold (a state
        group's one page holds any length)."""
        run.covered = min((len(held) * g.block_size if not g.is_ssm else (1 << 62) if held else 0)
                          for g, held in zip(self.plan.groups, run.pages))

    def _ungrow(self, run: _Running, pages: tuple[tuple[int, ...], ...]) -> None:
        """Take back what :meth:`_grow` just gave ``run`` (``pages``, its return value), onto the free
        list as it was."""
        for g, ids in reversed(list(enumerate(pages))):  # _grow took group 0's first: give them back last
            if ids:
                del run.pages[g][-len(ids):]
                self._free.extend(reversed(ids))
                self._promised += len(ids)
                self.stats.pages_allocated -= len(ids)
                self.stats.pages_reused -= sum(1 for p in ids if p in self._released)
        self._cover(run)

    def _release(self, run: _Running) -> None:
        """``run`` leaves (finished, aborted or queued again): its Step row, what it was promised, its pages."""
        del self._running[run.request.req_id]
        self.step_api.finish(run.request.req_id)
        self._promised -= run.lifetime - sum(map(len, run.pages))  # what it would still have taken
        for pages in run.pages:
            self._free.extend(pages)

    def _finish(self, run: _Running) -> None:
        self._release(run)
        for pages in run.pages:
            self._released.update(pages)
        self.finished[run.request.req_id] = run.tokens
        self.stats.finished += 1
