"""The serving-stack step API: describe a batch, fill the persistent buffers, run the forward.

A serving loop owns the scheduling (which requests run, which pages they get); graphkv owns the
buffers. Per step the loop builds a :class:`Batch` (request ids, new page ids per group, query
lengths, sequence lengths) and calls :meth:`Step.run`, which

1. maps request ids to persistent block-table rows (new ids get a free row) and appends the new
   pages, then commits every changed row in one copy and one launch;
2. chooses the graph key (:func:`graphkv.runtime.capture.keys.dispatch`) and so the padded size;
3. writes the per-request and per-token metadata (query start locations, sequence lengths,
   positions, each token's batch row and offset, each Mamba row's state page) into two reused
   host staging arrays and copies them to the device in two copies (none on a CPU, where the
   persistent buffers are the staging arrays);
4. gathers the step's table rows and computes every group's slot mapping, one launch each;
5. enters ``with forward_context(step.context)`` and calls the (captured) forward. The forward
   builds the flex masks itself (:meth:`StepContext.build_masks`), so inside a CUDA graph the
   mask build is replayed with the forward instead of costing host launches every step.

Every tensor the forward reads is allocated once, in :class:`Step`'s constructor: the same
``data_ptr()`` every step, so a CUDA graph captured over them stays valid. Nothing is allocated
per step on the device (the host staging arrays are reused too).

Example (one step of a serving loop)::

    step = Step(plan, device="cuda")
    fwd = graphkv.capture(plan, static_inputs={"input_ids": step.input_ids})(model.forward)
    fwd.capture(prepare=step.capture_context)
    logits = step.run(fwd, Batch(req_ids=("a", "b"), query_lens=(5, 1), seq_lens=(5, 40),
                                 new_pages=(((7, 8), (3,)), ((), ()))), input_ids=ids)
    step.finish("b")  # the request left; its row is free, its pages are the caller's again
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence

import attrs
import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask

from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.plan.plan import Plan
from graphkv.runtime.tables.block_tables import BlockTables
from graphkv.runtime.flex.mask import FlexMaskBuilder
from graphkv.runtime.step.batch import Batch, PreparedStep
from graphkv.runtime.step.context import StepContext, forward_context
from graphkv.runtime.capture.keys import GraphKey, dispatch

__all__ = ["Step"]


_I64 = np.int64


class Step:
    """Persistent per-step buffers of a plan, and the host logic that fills them.

    Owns a :class:`BlockTables` (``.tables``), the token and request metadata buffers, one
    :class:`FlexMaskBuilder` per flex group, and the map from request ids to table rows. The
    forward's own inputs live in :attr:`input_ids` (``[max_num_batched_tokens] int64``), which
    :meth:`run` fills and a captured forward can take as its static input buffer.
    """

    def __init__(self, plan: Plan, device: "str | torch.device" = "cpu") -> None:
        self.plan = plan
        self.device = torch.device(device)
        limits = plan.limits
        seqs, tokens = limits.max_num_seqs, limits.max_num_batched_tokens
        self.max_num_seqs, self.max_num_tokens = seqs, tokens
        self.decode_query_len = 1 + limits.num_speculative_tokens
        self.tables = BlockTables(plan, self.device)
        dev = self.device

        ssm_groups = [g.index for g in plan.groups if g.is_ssm]
        # Host staging: one int32 and one int64 array; the persistent buffers are views of their
        # device copies (on a CPU, of the arrays themselves: no copy at all). Layouts, in entries:
        #   int32: qsl [S+1] | seq_lens [S] | idx_mapping [S] | row_valid [S] | num_reqs [1]
        #   int64: query_lens [S] | context_lens [S] | state page [S] per Mamba group
        #          | positions [T] | token_row [T] | token_offset [T]
        s32 = {"qsl": 0, "seq": seqs + 1, "idx": 2 * seqs + 1, "valid": 3 * seqs + 1, "nreq": 4 * seqs + 1}
        o_pos = (2 + len(ssm_groups)) * seqs
        s64 = {"qlen": 0, "ctx": seqs, **{f"state{g}": (2 + i) * seqs for i, g in enumerate(ssm_groups)},
               "pos": o_pos, "row": o_pos + tokens, "off": o_pos + 2 * tokens}
        self._o32, self._o64 = s32, s64
        self._host32, self._dev32 = self._staging(4 * seqs + 2, torch.int32)
        self._host64, self._dev64 = self._staging(o_pos + 3 * tokens, torch.int64)
        self._np32, self._np64 = self._host32.numpy(), self._host64.numpy()
        self._copied: torch.cuda.Event | None = None
        self._ids_host: torch.Tensor | None = None  # pinned staging of host token ids (CUDA)
        if dev.type == "cuda":
            with torch.cuda.device(dev):
                self._copied = torch.cuda.Event()
            self._ids_host = torch.zeros(tokens, dtype=torch.int64, pin_memory=True)

        def view32(name: str, n: int) -> torch.Tensor:
            return self._dev32[s32[name]:s32[name] + n]

        def view64(name: str, n: int) -> torch.Tensor:
            return self._dev64[s64[name]:s64[name] + n]

        self.query_start_loc = view32("qsl", seqs + 1)
        self.seq_lens = view32("seq", seqs)
        self.idx_mapping = view32("idx", seqs)
        self.row_valid = view32("valid", seqs)
        self.num_reqs = self._dev32[s32["nreq"]]
        self.query_lens = view64("qlen", seqs)
        self.context_lens = view64("ctx", seqs)
        self.state_indices = {g: view64(f"state{g}", seqs) for g in ssm_groups}
        self.positions = view64("pos", tokens)
        self.token_row = view64("row", tokens)
        self.token_offset = view64("off", tokens)
        self.input_ids = torch.zeros(tokens, dtype=torch.int64, device=dev)
        self.mask_builders = {
            g.index: FlexMaskBuilder.from_plan(plan, g.index, block_table=self.tables.input_tables[g.index],
                                               query_start_loc=self.query_start_loc, seq_lens=self.seq_lens)
            for g in plan.groups if f"flex.{g.index}.kv_indices" in plan.buffers}
        self._group_of_layer = {d.name: plan.group_of(d.index).index for d in plan.layers}
        self._rows: dict[Hashable, int] = {}
        self._free_rows = list(range(seqs - 1, -1, -1))  # pop() hands out row 0 first
        self._ssm_groups = ssm_groups
        # Tokens one page holds per group (0 for state groups, which need exactly one page).
        self._state_group = np.array([[g.is_ssm] for g in plan.groups])
        self._page_tokens = np.array([[g.block_size] for g in plan.groups], dtype=_I64)
        self._tokens_per_page = np.where(self._state_group, plan.max_model_len, self._page_tokens)
        self._last_reqs = 0  # batch rows the last staged step used
        self._arange = np.arange(max(seqs, tokens), dtype=_I64)
        self._context = StepContext(
            plan=plan, query_start_loc=self.query_start_loc, seq_lens=self.seq_lens, query_lens=self.query_lens,
            context_lens=self.context_lens, row_valid=self.row_valid, num_reqs=self.num_reqs,
            positions=self.positions, token_row=self.token_row, token_offset=self.token_offset,
            slot_mappings=self.tables.slot_mappings, block_tables=self.tables.input_tables,
            state_indices=self.state_indices, mask_builders=self.mask_builders, group_of_layer=self._group_of_layer)

    def _staging(self, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """A host staging tensor (pinned on CUDA) and its device twin (the same tensor on CPU)."""
        if self.device.type == "cpu":
            host = torch.zeros(n, dtype=dtype)
            return host, host
        pinned = torch.zeros(n, dtype=dtype, pin_memory=self.device.type == "cuda")
        return pinned, torch.zeros(n, dtype=dtype, device=self.device)

    # ---- requests ---------------------------------------------------------------------------

    @property
    def active_requests(self) -> tuple[Hashable, ...]:
        """Request ids holding a table row (joined and not finished)."""
        return tuple(self._rows)

    def row_of(self, req_id: Hashable) -> int:
        """The persistent table row of ``req_id``."""
        try:
            return self._rows[req_id]
        except KeyError:
            raise SpecError(Problem(field="req_id", value=req_id, limit="is not an active request",
                                    fix="pass a request id that appeared in a Batch and was not finished")) from None

    def finish(self, req_id: Hashable) -> None:
        """Release ``req_id``'s table row (its entries return to the null page). The pages it
        held are the caller's to reuse; nothing on the device is cleared."""
        row = self.row_of(req_id)
        self.tables.remove(row)
        del self._rows[req_id]
        self._free_rows.append(row)

    # ---- one step -----------------------------------------------------------------------------

    def prepare(self, batch: Batch, *, padded_tokens: Callable[[int, int, bool], int] | None = None) -> PreparedStep:
        """Fill every persistent buffer for ``batch`` and return its sizes.

        ``padded_tokens(num_tokens, num_reqs, uniform)`` says how many tokens the forward will run
        (a captured forward's :meth:`~graphkv.runtime.capture.CapturedForward.padded_tokens`);
        by default ``num_tokens`` (an eager forward). ``PreparedStep.key`` is the plan's graph key
        for the step either way.
        Raises :class:`SpecError` / :class:`CapacityError` (nothing changed) for an inconsistent
        batch. Not capture-safe (host work); call it before the forward.
        """
        n_req, num_tokens, qlens, slens, known_rows = self._check(batch)
        q = self.decode_query_len  # with every query_len >= 1, a sum of n_req means all are 1
        uniform = num_tokens == n_req * q and (q == 1 or bool((qlens == q).all()))
        key = dispatch(self.plan.cudagraph, self.plan.limits, num_tokens=num_tokens, num_reqs=n_req,
                       uniform=uniform).key
        padded = padded_tokens(num_tokens, n_req, uniform) if padded_tokens is not None else num_tokens
        if not num_tokens <= padded <= self.max_num_tokens:
            raise SpecError(Problem(field="padded_tokens", value=padded,
                                    limit=f"must be in [num_tokens={num_tokens}, max_num_batched_tokens="
                                          f"{self.max_num_tokens}]",
                                    fix="return the graph key's token count, or num_tokens for an eager step"))
        rows = self._assign_rows(batch, known_rows, slens)
        self._stage(n_req, num_tokens, padded, qlens, slens, rows)
        self._launch(n_req, dummy=False)
        return PreparedStep(num_tokens=num_tokens, num_reqs=n_req, num_tokens_padded=padded, uniform=uniform,
                            key=key)

    @property
    def context(self) -> StepContext:
        """The forward context: the persistent buffers, which :meth:`prepare` fills for each step
        (one object for the Step's life)."""
        return self._context

    def run(self, forward: Callable[..., Any], batch: Batch, *, input_ids: torch.Tensor | Sequence[int]) -> Any:
        """Prepare ``batch``, then call ``forward`` inside the step's forward context.

        ``forward`` is a :class:`~graphkv.runtime.capture.CapturedForward` (called with the step's
        sizes; it replays a graph or runs eagerly) or a plain callable taking ``input_ids``.
        ``input_ids``: ``[num_tokens]`` token ids, packed in batch order. Returns the forward's
        output for the step's ``num_tokens`` tokens. Raises :class:`SpecError` for ``input_ids``
        of another length, and as :meth:`prepare` does, before changing anything.
        """
        padded_tokens = getattr(forward, "padded_tokens", None)
        if not isinstance(input_ids, torch.Tensor):
            input_ids = torch.as_tensor(input_ids, dtype=torch.int64)
        if input_ids.shape != (batch.num_tokens,):  # checked before prepare changes any row or table
            raise SpecError(Problem(field="input_ids", value=tuple(input_ids.shape),
                                    limit=f"must be [{batch.num_tokens}] (the batch's query lengths summed)",
                                    fix="pack each request's new tokens in batch order"))
        prepared = self.prepare(batch, padded_tokens=padded_tokens)
        ids = self.input_ids[:prepared.num_tokens]
        if self._ids_host is not None and input_ids.device.type == "cpu":
            # Through pinned memory, so the copy does not wait for the previous step's forward;
            # the staging event (synchronized in the next _stage) covers it.
            host = self._ids_host[:prepared.num_tokens]
            host.copy_(input_ids)
            ids.copy_(host, non_blocking=True)
            assert self._copied is not None
            self._copied.record()
        else:
            ids.copy_(input_ids)
        with forward_context(self.context):
            if padded_tokens is not None:
                return forward(num_tokens=prepared.num_tokens, num_reqs=prepared.num_reqs, uniform=prepared.uniform,
                               input_ids=ids)
            return forward(input_ids=ids)

    @contextlib.contextmanager
    def capture_context(self, key: GraphKey) -> Iterator[StepContext]:
        """A dummy step of ``key``'s size for warm-up and capture (pass as ``capture(prepare=...)``).

        Its requests hold no pages (every table row is the null page), so capture writes only into
        the null page and leaves live requests' rows and pages untouched."""
        num_reqs = key.num_reqs if key.num_reqs is not None else min(self.max_num_seqs, key.num_tokens)
        qlens = np.full(num_reqs, key.num_tokens // num_reqs, dtype=_I64)
        qlens[: key.num_tokens - int(qlens.sum())] += 1
        self._stage(num_reqs, key.num_tokens, key.num_tokens, qlens, qlens.copy(), rows=None)
        self._launch(num_reqs, dummy=True)
        with forward_context(self.context) as ctx:
            yield ctx

    # ---- internals ------------------------------------------------------------------------------

    def _check(self, batch: Batch) -> tuple[int, int, np.ndarray, np.ndarray, list[int | None]]:
        n_req = batch.num_reqs
        problems = []
        if not 1 <= n_req <= self.max_num_seqs:
            problems.append(Problem(field="batch.req_ids", value=n_req, limit=f"1..max_num_seqs={self.max_num_seqs} "
                                    "requests per step", fix="schedule fewer requests in this step"))
        if len(batch.query_lens) != n_req or len(batch.seq_lens) != n_req or \
                (batch.new_pages and len(batch.new_pages) != n_req):
            problems.append(Problem(field="batch", value=(n_req, len(batch.query_lens), len(batch.seq_lens),
                                                          len(batch.new_pages)),
                                    limit="req_ids, query_lens, seq_lens (and new_pages if given) need one entry "
                                          "per request", fix="build the Batch from one list of scheduled requests"))
        if problems:
            raise SpecError(*problems)
        qlens = np.asarray(batch.query_lens, dtype=_I64)
        slens = np.asarray(batch.seq_lens, dtype=_I64)
        max_len = self.plan.max_model_len
        if qlens.min() < 1 or (slens < qlens).any() or slens.max() > max_len:
            bad = int(np.flatnonzero((qlens < 1) | (slens < qlens) | (slens > max_len))[0])
            problems.append(Problem(field=f"batch[{bad}] ({batch.req_ids[bad]!r})",
                                    value=f"query_len={int(qlens[bad])}, seq_len={int(slens[bad])}",
                                    limit=f"need 1 <= query_len <= seq_len <= max_model_len={max_len}",
                                    fix="seq_len counts every token of the request after this step"))
        num_tokens = int(qlens.sum())
        if num_tokens > self.max_num_tokens:
            problems.append(Problem(field="batch.query_lens", value=num_tokens,
                                    limit=f"at most max_num_batched_tokens={self.max_num_tokens} tokens per step",
                                    fix="split the prefill into chunks across steps"))
        if len(set(batch.req_ids)) != n_req:  # (hashing 256 ids costs ~5 us)
            problems.append(Problem(field="batch.req_ids", value=batch.req_ids, limit="must be unique",
                                    fix="give each request one row of the batch"))
        rows = list(map(self._rows.get, batch.req_ids))  # None for a request that joins now
        new_ids = rows.count(None)
        if new_ids > len(self._free_rows):
            problems.append(Problem(field="batch.req_ids", value=f"{new_ids} new requests",
                                    limit=f"{len(self._rows)} of max_num_seqs={self.max_num_seqs} rows are taken",
                                    fix="finish requests (Step.finish) before admitting new ones"))
        if problems:
            raise SpecError(*problems)
        return n_req, num_tokens, qlens, slens, rows

    def _check_pages(self, batch: Batch, slens: np.ndarray, rows: np.ndarray) -> None:
        """Raise :class:`CapacityError` when a request holds too few pages for this step (after
        its appends): a state group needs its state page, an attention group ``cdiv(seq_len,
        block_size)`` pages (fewer pages would write K/V into the null page)."""
        held = self.tables.num_pages_np[:, rows]  # [G, n_req]
        # held pages x tokens per page >= seq_len; a state page "holds" any length (hot path: 2 ops)
        if not (held * self._tokens_per_page < slens).any():
            return
        need = np.where(self._state_group, 1, -(-slens[None, :] // self._page_tokens))
        g, i = (int(x) for x in np.argwhere(held < need)[0])
        what = "its state page" if self._state_group[g, 0] else f"block_size {int(self._page_tokens[g, 0])}"
        raise CapacityError(Problem(
            field=f"batch.new_pages[{i}][{g}] ({batch.req_ids[i]!r})", value=f"{int(held[g, i])} page(s) held",
            limit=f"group {g} needs {int(need[g, i])} page(s) for seq_len={int(slens[i])} ({what})",
            fix="give the request its new pages in this step's Batch.new_pages"))

    def _assign_rows(self, batch: Batch, known: list[int | None], slens: np.ndarray) -> np.ndarray:
        """Rows of the batch's requests (``known``: rows, ``None`` for requests that join now and
        get a free row), then the new pages appended, checked and committed. On any error the
        whole batch is undone (pages appended to earlier requests, rows of joining requests)."""
        new = [i for i, row in enumerate(known) if row is None] if None in known else []
        for i in new:
            known[i] = self._free_rows.pop()
            self._rows[batch.req_ids[i]] = known[i]
        rows = np.array(known, dtype=_I64)
        held = self.tables.num_pages_np[:, rows] if batch.new_pages else None  # [G, n_req] before (a copy)
        try:
            for i, pages in enumerate(batch.new_pages):
                if pages is None:
                    continue
                if len(pages) != self.tables.num_groups:
                    raise SpecError(Problem(field=f"batch.new_pages[{i}] ({batch.req_ids[i]!r})", value=len(pages),
                                            limit=f"needs one page-ID list per KV-cache group "
                                                  f"({self.tables.num_groups})",
                                            fix="pass () for groups that gain no pages, or None for the request"))
                self.tables.append(int(rows[i]), pages)
            self._check_pages(batch, slens, rows)
        except (SpecError, CapacityError):
            if held is not None:
                for i, row in enumerate(rows):
                    self.tables.truncate(int(row), held[:, i])
            for i in new:
                self.tables.remove(int(rows[i]))
                self._free_rows.append(self._rows.pop(batch.req_ids[i]))
            raise
        self.tables.commit()
        return rows

    def _stage(self, n_req: int, num_tokens: int, padded: int, qlens: np.ndarray, slens: np.ndarray,
               rows: np.ndarray | None) -> None:
        """Host side: write the step's metadata into the staging arrays (numpy only). Rows past
        ``n_req`` are zero (state page 0: the null page) and tokens past ``num_tokens`` up to
        ``padded`` are padding (row -1, position 0); only entries the last step set are cleared."""
        a32, a64, o32, o64 = self._np32, self._np64, self._o32, self._o64
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copies have read the staging arrays
        clear = max(self._last_reqs, n_req)  # rows [n_req, clear) held the last step's values
        self._last_reqs = n_req
        qsl = a32[o32["qsl"]:o32["qsl"] + self.max_num_seqs + 1]
        qsl[0] = 0
        np.cumsum(qlens, out=qsl[1:n_req + 1])
        qsl[n_req + 1:] = num_tokens
        a32[o32["nreq"]] = n_req
        ctx = a64[o64["ctx"]:o64["ctx"] + n_req]
        np.subtract(slens, qlens, out=ctx)
        for array, off, values in ((a32, o32["seq"], slens), (a32, o32["valid"], 1),
                                   (a32, o32["idx"], rows if rows is not None else 0), (a64, o64["qlen"], qlens)):
            array[off:off + n_req] = values
        if clear > n_req:
            for array, off in ((a32, o32["seq"]), (a32, o32["valid"]), (a32, o32["idx"]), (a64, o64["qlen"]),
                               (a64, o64["ctx"]), *((a64, o64[f"state{g}"]) for g in self._ssm_groups)):
                array[off + n_req:off + clear] = 0
        for g in self._ssm_groups:
            off = o64[f"state{g}"]
            a64[off:off + n_req] = self.tables.state_pages(g, rows) if rows is not None else 0
        # Per token: batch row, offset inside the query, position. Padding tokens: row -1.
        row = a64[o64["row"]:o64["row"] + padded]
        offset = a64[o64["off"]:o64["off"] + padded]
        pos = a64[o64["pos"]:o64["pos"] + padded]
        if num_tokens == n_req:  # one token per request (decode): row i, offset 0, position ctx
            row[:n_req] = self._arange[:n_req]
            offset[:n_req] = 0
            pos[:n_req] = ctx
        else:
            row[:num_tokens] = np.repeat(self._arange[:n_req], qlens)
            np.subtract(self._arange[:num_tokens], qsl[row[:num_tokens]], out=offset[:num_tokens])
            np.add(offset[:num_tokens], ctx[row[:num_tokens]], out=pos[:num_tokens])
        if padded > num_tokens:
            row[num_tokens:] = -1
            offset[num_tokens:] = 0
            pos[num_tokens:] = 0

    def _launch(self, n_req: int, *, dummy: bool) -> None:
        """Device side: two staging copies (none on CPU), the table gather and the slot mappings."""
        if self._dev32 is not self._host32:
            self._dev32.copy_(self._host32, non_blocking=True)
            self._dev64.copy_(self._host64, non_blocking=True)
            if self._copied is not None:
                self._copied.record()
        if dummy:  # every row is the null page
            self.tables.gather(self.idx_mapping[:0], n_req)
        else:
            self.tables.gather(self.idx_mapping[:n_req], n_req)
        self.tables.compute_slot_mappings(self.query_start_loc, self.positions, n_req)
