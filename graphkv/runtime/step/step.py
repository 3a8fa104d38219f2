"""The serving-stack step API: describe a batch, fill the persistent buffers, run the forward.

A serving loop owns the scheduling (which requests run, which pages they get); graphkv owns the
buffers and the bytes, and refuses what would corrupt them. Per step the loop builds a
:class:`Batch` and calls :meth:`Step.run`, which

1. checks the batch whole before changing anything (:mod:`graphkv.runtime.step.checks`): sizes,
   integer lengths, hashable unique request ids, free rows, page ids, capacity, page ownership
   (:mod:`graphkv.runtime.step.ownership`); one graph-key dispatch gives the padded size;
2. gives joining requests a free table row and appends every new page in one vectorized call;
3. writes the step's metadata and slot mappings into the host staging arrays (a decode step that
   repeats the last step's requests rewrites only lengths, positions and slots) and refuses a
   token written into a page another live request holds;
4. writes the block tables' changed columns to the device (gathering only when the batch's rows
   changed) and copies the staging arrays (nothing on a CPU, where they are the buffers);
5. runs the forward inside ``with forward_context(step.context)``; the forward builds the flex
   masks itself (:meth:`StepContext.build_masks`), so a captured graph replays the build.

Every refusal leaves the step exactly as it was, and so does a forward that raises:
:meth:`Step.run` undoes the step (rows, host and device tables, free rows, holder counts, written
tokens). Every tensor the forward reads is allocated once, in the constructor (the same
``data_ptr()`` every step), so a CUDA graph captured over them stays valid.

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
from typing import Any, Callable, Hashable, Iterator, Sequence

import numpy as np
import torch

from graphkv.errors import Problem, SpecError
from graphkv.plan.plan import Plan
from graphkv.runtime.buffers import LedgerBuffers
from graphkv.runtime.capture.checks import plan_difference
from graphkv.runtime.capture.keys import Dispatcher, GraphKey, StepDispatch, graph_mode
from graphkv.runtime.capture.shape import ShapeMemo, StepShape, key_shape
from graphkv.runtime.device import resolve_device
from graphkv.runtime.flex.mask import FlexMaskBuilder
from graphkv.runtime.ops.choice import resolve_kernels
from graphkv.runtime.step.batch import Batch
from graphkv.runtime.step.checks import BatchChecker, CheckedBatch, check_input_ids
from graphkv.runtime.step.context import StepContext, forward_context
from graphkv.runtime.step.ownership import HoldUndo, PageOwnership
from graphkv.runtime.step.repeat import Parts, RepeatStep
from graphkv.runtime.step.rows import LastStep, RequestRows
from graphkv.runtime.step.staging import StepStaging
from graphkv.runtime.step.truncate import truncate_request
from graphkv.runtime.step.undo import StepUndo, refuse_unsure, take_back
from graphkv.runtime.tables.block_tables import BlockTables
from graphkv.spec._checks import count_arg

__all__ = ["Step"]

_I64 = np.int64


ShapeOf = Callable[[StepDispatch, int, int, bool], StepShape]  # (dispatch, num_tokens, num_reqs, uniform) -> shape
_PLAIN_FORWARD = "the forward is a plain callable (not a graphkv.capture wrapper): every step runs eagerly"


def _is_captured(forward: Any) -> bool:
    """Whether ``forward`` is a captured forward (it decides shapes and runs them)."""
    return hasattr(forward, "shape_of") and hasattr(forward, "run")


class Step:
    """Persistent per-step buffers of a plan, the page ownership that guards them, and the host
    logic that fills them.

    Owns a :class:`BlockTables` (``.tables``), a :class:`PageOwnership` (``.ownership``), the
    staging arrays of the token and request metadata, one :class:`FlexMaskBuilder` per flex group,
    and the map from request ids to table rows. The forward's own inputs live in
    :attr:`input_ids` (``[max_num_batched_tokens] int64``), which :meth:`run` fills and a captured
    forward can take as its static input buffer. ``device``: ``"cpu"`` or an existing CUDA device
    (anything else is a :class:`SpecError`). ``kernels``: ``"auto"`` (Triton on CUDA, numpy / torch
    on a CPU), ``"triton"`` or ``"torch"``; ``Step(plan, "cpu", kernels="triton")`` runs exactly the
    GPU path on a CPU — the staged table sync with its Triton kernels (in Triton's interpreter) and
    the metadata staged through host twins and copied — so a CPU run catches its bugs.
    """

    def __init__(self, plan: Plan, device: "str | torch.device" = "cpu", *, kernels: str = "auto") -> None:
        if not isinstance(plan, Plan):
            raise SpecError(Problem(field="plan", value=type(plan).__name__, limit="must be a graphkv Plan",
                                    fix="build it with graphkv.compile(model, limits, budget)"))
        self.plan = plan
        self.device = resolve_device(device)
        limits = plan.limits
        self.max_num_seqs, self.max_num_tokens = limits.max_num_seqs, limits.max_num_batched_tokens
        self.decode_query_len = 1 + limits.num_speculative_tokens
        # Every tensor and array below is one of the plan's ledger entries for this device
        # (plan.ledger.allocations(device)), allocated from it by its owner.
        self.kernels = resolve_kernels(kernels, self.device)
        # The GPU path (Triton kernels) stages everything as a GPU does, on a CPU too.
        layout = "cuda" if self.kernels == "triton" else self.device.type
        self.tables = BlockTables(plan, self.device, kernels=self.kernels)
        self.ownership = PageOwnership(plan)
        self._staging = st = StepStaging(plan, self.device, layout=layout)
        buffers = LedgerBuffers.of_plan(plan, self.device, ("step.",), layout=layout)
        self.input_ids = buffers.tensor("step.input_ids")
        self._input_ids_np = self.input_ids.numpy() if layout == "cpu" else None
        self._ids_host = buffers.tensor("step.input_ids_host") if layout == "cuda" else None
        self.mask_builders = {
            g.index: FlexMaskBuilder.from_plan(plan, g.index, block_table=self.tables.input_tables[g.index],
                                               query_start_loc=st.query_start_loc_dev, seq_lens=st.seq_lens_dev)
            for g in plan.groups if f"flex.{g.index}.kv_indices" in plan.buffers}
        self._context = StepContext(
            plan=plan, query_start_loc=st.query_start_loc_dev, seq_lens=st.seq_lens_dev,
            query_lens=st.query_lens_dev, context_lens=st.context_lens_dev, row_valid=st.row_valid_dev,
            num_reqs=st.num_reqs_dev, positions=st.positions_dev, token_row=st.token_row_dev,
            token_offset=st.token_offset_dev, slot_mappings=st.slot_mappings_dev,
            block_tables=self.tables.input_tables, state_indices=st.state_pages_dev, mask_builders=self.mask_builders,
            group_of_layer={d.name: plan.group_of(d.index).index for d in plan.layers})
        self._dispatch = Dispatcher(plan.cudagraph, limits)
        self._requests = RequestRows(self.max_num_seqs)
        self._checker = BatchChecker(plan, self.tables, self.ownership, self._requests, self._dispatch, buffers)
        assert not buffers.untaken(), buffers.untaken()
        self._parts = Parts(plan, self.tables, self.ownership, st, self._checker.tokens_per_page, self._remember_undo)
        self._arange = self.tables.mirror.arange  # 0 .. max(max_num_seqs, max_num_batched_tokens) - 1, shared
        self._undo: StepUndo | None = None
        self._repeat: RepeatStep | None = None
        self._forward_vocab: tuple[Any, int | None] = (None, None)  # the last forward run and its vocab_size
        self._eager_shapes = ShapeMemo(self.max_num_seqs)  # a plain callable's shapes (decode ones remembered)
        self._same_plan: Plan | None = None  # another forward's plan found equal to this step's (checked once)

    # ---- the persistent buffers ----------------------------------------------------------------

    @property
    def context(self) -> StepContext:
        """The forward context: the persistent buffers, which :meth:`prepare` fills for each step
        (one object for the Step's life)."""
        return self._context

    @property
    def shape(self) -> StepShape | None:
        """The :class:`StepShape` the persistent buffers were last filled for (``None`` before the
        first step and after :meth:`finish` / :meth:`undo`)."""
        last = self._requests.last
        return None if last is None else last.shape

    @property
    def query_start_loc(self) -> torch.Tensor:
        """``[max_num_seqs + 1] int32`` query start of each batch row (then the token count)."""
        return self._staging.query_start_loc_dev

    @property
    def seq_lens(self) -> torch.Tensor:
        """``[max_num_seqs] int32`` sequence length of each batch row after the step (0 past it)."""
        return self._staging.seq_lens_dev

    @property
    def context_lens(self) -> torch.Tensor:
        """``[max_num_seqs] int64`` tokens before each batch row's query."""
        return self._staging.context_lens_dev

    @property
    def row_valid(self) -> torch.Tensor:
        """``[max_num_seqs] int32`` 1 for the step's batch rows, 0 past them."""
        return self._staging.row_valid_dev

    @property
    def positions(self) -> torch.Tensor:
        """``[max_num_batched_tokens] int64`` position of each packed token (0 for padding)."""
        return self._staging.positions_dev

    @property
    def token_row(self) -> torch.Tensor:
        """``[max_num_batched_tokens] int64`` batch row of each packed token (-1 for padding)."""
        return self._staging.token_row_dev

    @property
    def token_offset(self) -> torch.Tensor:
        """``[max_num_batched_tokens] int64`` index of each token inside its request's query."""
        return self._staging.token_offset_dev

    @property
    def state_indices(self) -> dict[int, torch.Tensor]:
        """Per Mamba group, ``[max_num_seqs] int64`` state page of each batch row (0 past the step)."""
        return self._staging.state_pages_dev

    @property
    def slot_mappings(self) -> torch.Tensor:
        """``[num_groups, max_num_batched_tokens] int64`` slot of each token per group (PAD_SLOT_ID
        for padding tokens and state groups)."""
        return self._staging.slot_mappings_dev

    # ---- requests ---------------------------------------------------------------------------

    @property
    def active_requests(self) -> tuple[Hashable, ...]:
        """Request ids holding a table row (joined and not finished)."""
        return tuple(self._requests.rows)

    @property
    def unsure_requests(self) -> tuple[Hashable, ...]:
        """Live requests whose state (Mamba / gated-delta) pages a forward that was then taken back (:meth:`undo`)
        may have advanced in place: a next step of theirs would apply its tokens to that state twice, so it is
        refused. Finish each (:meth:`finish`) and prefill it again from its first token. Empty without state
        layers, and after every clean step."""
        if not self.ownership.has_unsure:
            return ()
        unsure = self.ownership.unsure_rows
        return tuple(req_id for req_id, row in self._requests.rows.items() if row in unsure)

    def row_of(self, req_id: Hashable) -> int:
        """The persistent table row of ``req_id``."""
        return self._requests.row_of(req_id)

    def finish(self, req_id: Hashable) -> None:
        """Release ``req_id``'s table row (its entries return to the null page) and its pages (one
        holder less each). The pages are the caller's to reuse; pages it wrote keep their contents
        for prefix reuse. Nothing on the device is cleared."""
        row = self.row_of(req_id)
        self.ownership.release(row, self.tables.held_pages(row))
        self.tables.remove(row)
        self._requests.release(req_id)
        self._forget_last()
        self._undo = None

    def truncate(self, req_id: Hashable, num_pages_per_group: Sequence[int], *, kept_tokens: int | None = None) -> None:
        """Keep the first ``num_pages_per_group[g]`` pages of live request ``req_id`` per group; the rest lose its
        hold (free where no other request holds them). ``kept_tokens`` rolls its written tokens back first (rejected
        drafts). Raises as :func:`~graphkv.runtime.step.truncate.truncate_request` (nothing changed then)."""
        truncate_request(self.tables, self.ownership, self.row_of(req_id), req_id, num_pages_per_group, kept_tokens)
        self._forget_last()
        self._undo = None

    # ---- one step -----------------------------------------------------------------------------

    def prepare(self, batch: Batch, *, forward: Any = None) -> StepShape:
        """Fill every persistent buffer for ``batch`` and return its :class:`StepShape`.

        ``forward``: the :class:`~graphkv.runtime.capture.graphs.CapturedForward` that will run the
        step; its graphs (captured, or rehearsed on a CPU) decide the padded sizes, which every
        buffer is filled for. Without one (an eager forward) nothing is padded. Raises
        :class:`SpecError` / :class:`CapacityError` for a batch that is inconsistent or would corrupt
        another request's pages, and :class:`SpecError` for a ``forward`` built under a plan that
        differs from this Step's (naming what differs); nothing has changed then. :meth:`undo` takes the step back (e.g.
        when your forward raised). Not capture-safe (host work); call it before the forward, inside
        ``with forward_context(step.context, shape):``.
        """
        return self._prepare(batch, self._shape_of(forward))[0]

    def run(self, forward: Callable[..., Any], batch: Batch, *, input_ids: torch.Tensor | Sequence[int],
            vocab_size: int | None = None) -> Any:
        """Prepare ``batch``, then call ``forward`` inside the step's forward context.

        ``forward`` is a :class:`~graphkv.runtime.capture.graphs.CapturedForward` (it replays a graph,
        a CPU rehearsal of one, or runs eagerly; the step's :class:`StepShape` is decided once for
        all of them) or a plain callable taking ``input_ids``. ``input_ids``: ``[num_tokens]`` integer
        token ids, packed in batch order, on the CPU or the step's device. Returns the forward's
        output for the step's ``num_tokens`` tokens. Raises as :meth:`prepare` does (a captured forward of
        another plan included), and
        :class:`SpecError` for ``input_ids`` of another length, dtype or device, and with
        ``vocab_size`` (the model's embedding rows, an int >= 1) for a token id outside
        ``[0, vocab_size)`` naming its request and position (one host reduction; a device tensor costs
        one sync), before changing anything. Without ``vocab_size`` the forward's own ``vocab_size``
        (when it has one) checks host ids; ids already on the device (tokens the model sampled) are
        then the caller's to keep in range. A dict or a set of ids is refused (its order is no order
        of tokens). When ``forward`` raises, the step is undone (:meth:`undo`) and the exception
        propagates: K/V the forward wrote lie past every request's written tokens and are
        overwritten by the retry, but a state (Mamba) layer that updated a request's state in place
        before the error has advanced it, so the step's running requests on a plan with state layers are
        :attr:`unsure_requests` then and their next step is refused: finish them and prefill them again.
        """
        captured = _is_captured(forward)
        if not captured and not callable(forward):  # before anything changes (a call would fail after the prepare)
            raise SpecError(Problem(field="forward", value=type(forward).__name__,
                                    limit="must be a graphkv CapturedForward or a callable taking input_ids",
                                    fix="pass the model (or graphkv.capture(...) of it) as the first argument"))
        vocab = self._vocab_size(vocab_size, forward, input_ids)
        shape, ids = self._prepare(batch, self._shape_of(forward if captured else None),
                                   lambda num_tokens: check_input_ids(input_ids, num_tokens, self.device,
                                                                      vocab_size=vocab, batch=batch))
        called = False
        try:
            n = shape.num_tokens
            dst = self.input_ids[:n]
            if self._ids_host is not None and (isinstance(ids, np.ndarray) or ids.device.type == "cpu"):
                # Through pinned memory, so the copy does not wait for the previous step's forward;
                # the staging event (synchronized before the next step's staging) covers it.
                host = self._ids_host[:n]
                if isinstance(ids, np.ndarray):
                    host.numpy()[:] = ids
                else:
                    host.copy_(ids)
                dst.copy_(host, non_blocking=True)
                self._staging.record_copy()
            elif isinstance(ids, np.ndarray):
                self._input_ids_np[:n] = ids  # a CPU step: the buffer is host memory
            else:
                dst.copy_(ids)
            with forward_context(self.context, shape):
                called = True
                if captured:
                    return forward.run(shape, inputs={"input_ids": dst})
                return forward(input_ids=dst)
        except BaseException:
            self.undo(forward_ran=called)
            raise

    def undo(self, *, forward_ran: bool = True) -> None:
        """Take back the last prepared step: joining requests leave (their rows are free again),
        appended pages are dropped from the tables (host and device) and from the holder counts,
        written tokens return to what they were. Call it when a forward you ran after :meth:`prepare` raised
        (:meth:`run` does). With ``forward_ran`` (the default) the forward may have advanced the step's state
        pages in place (:mod:`~graphkv.runtime.step.undo`): they vouch for no cached state any more, and the
        step's running requests are :attr:`unsure_requests`, their next step refused; ``forward_ran=False``
        (nothing ran on the step: a prepare you take back) leaves states as they were. Raises
        :class:`SpecError` when there is nothing to undo (no step prepared, or a request finished since)."""
        undo, self._undo = self._undo, None
        if undo is None:
            raise SpecError(Problem(field="undo", value=None, limit="no prepared step to take back (none was "
                                    "prepared, it was undone already, or a request finished since)",
                                    fix="call undo() right after the prepare() whose forward failed"))
        take_back(undo, self.tables, self.ownership, self._requests, forward_ran=bool(forward_ran))
        self._forget_last()

    @contextlib.contextmanager
    def capture_context(self, key: GraphKey) -> Iterator[StepContext]:
        """A dummy step of ``key``'s size for warm-up, capture and rehearsal (pass as
        ``capture(prepare=...)``); the forward context holds the key's own :class:`StepShape`.

        Its requests hold no pages (every table row is the null page, every slot ``PAD_SLOT_ID``),
        so capture writes nothing into live requests' pages and leaves their rows untouched. Raises
        :class:`SpecError` for a key this Step cannot stage: more request rows than ``max_num_seqs``
        or more tokens than ``max_num_batched_tokens`` (a key of a forward planned otherwise)."""
        if not isinstance(key, GraphKey):
            raise SpecError(Problem(field="key", value=type(key).__name__, limit="must be a GraphKey of the plan",
                                    fix="pass one of graphkv.plan.graph_keys.capture_keys(plan.cudagraph, "
                                        "plan.limits)"))
        reqs = key.num_reqs if key.num_reqs is not None else min(key.num_tokens, self.max_num_seqs)
        if not (type(key.num_tokens) is int and type(reqs) is int and 1 <= reqs <= min(key.num_tokens,
                                                                                        self.max_num_seqs)
                and key.num_tokens <= self.max_num_tokens):
            raise SpecError(Problem(
                field="key", value=str(key),
                limit=f"this Step cannot stage it: its plan has max_num_seqs={self.max_num_seqs} and "
                      f"max_num_batched_tokens={self.max_num_tokens} (a key needs 1 <= request rows <= min(num_tokens, "
                      "max_num_seqs) and num_tokens <= max_num_batched_tokens)",
                fix="pass a key of this Step's plan (capture_keys(step.plan.cudagraph, step.plan.limits)); a forward "
                    "planned otherwise: wrap the model with graphkv.capture(step.plan, ...)"))
        shape = key_shape(key, graph_mode(self.plan.cudagraph, key), max_num_seqs=self.max_num_seqs)
        num_reqs = shape.num_reqs
        qlens = np.full(num_reqs, key.num_tokens // num_reqs, dtype=_I64)
        qlens[: key.num_tokens - int(qlens.sum())] += 1
        self._staging.write_step(self.tables, shape, qlens, qlens.copy(), np.zeros(num_reqs, _I64), rows=None,
                                 same=False)
        self.tables.show_null_rows(shape.num_reqs_padded)
        self._staging.copy_to_device()
        self._forget_last()
        self._undo = None
        with forward_context(self.context, shape) as ctx:
            yield ctx

    # ---- internals ------------------------------------------------------------------------------

    def _shape_of(self, forward: Any) -> ShapeOf:
        """How a step's shape is decided: by ``forward``'s graphs (a captured forward), else eagerly."""
        if forward is None:
            return self._eager_shape
        if not _is_captured(forward):
            raise SpecError(Problem(field="forward", value=type(forward).__name__,
                                    limit="must be a graphkv CapturedForward (its graphs decide the padding) or None",
                                    fix="pass the graphkv.capture(...) wrapper, or nothing for an eager forward"))
        plan = getattr(forward, "plan", None)
        if plan is not self.plan and plan is not self._same_plan:  # O(1) per step once found equal
            self._check_plan_of(forward, plan)
        return forward.shape_of

    def _check_plan_of(self, forward: Any, plan: Any) -> None:
        """Refuse a captured forward planned otherwise than this step: its keys would not be the step's (a decode
        key of 8 requests on a step of 4, or steps of 3 requests eager for want of a key of 4)."""
        if not isinstance(plan, Plan):  # a forward that decides shapes without a plan: nothing to compare
            return
        diff = plan_difference(plan, self.plan)
        if diff is not None:
            raise SpecError(Problem(
                field="forward", value=f"{type(forward).__name__} of plan {plan.model_name!r}",
                limit=f"was built under another plan than this Step's (forward's vs Step's: {diff})",
                fix="wrap the model with graphkv.capture(step.plan, ...) (or build the Step from the forward's plan)"))
        self._same_plan = plan

    def _eager_shape(self, dispatch: StepDispatch, num_tokens: int, num_reqs: int, uniform: bool) -> StepShape:
        """The shape of a step a plain callable runs: its own sizes."""
        return self._eager_shapes.shape(dispatch, num_tokens, num_reqs, uniform, replayed=False,
                                        eager_reason=_PLAIN_FORWARD)

    def _prepare(self, batch: Batch, shape_of: ShapeOf,
                 check: Callable[[int], Any] | None = None) -> tuple[StepShape, Any]:
        """Fill the buffers for ``batch`` (the repeat path when it repeats the last step, else the
        checked full path), shaped by ``shape_of(dispatch, num_tokens, num_reqs, uniform)``.
        ``check(num_tokens)`` (before anything changes) vets what else the step takes; returns the
        step's shape and ``check``'s result."""
        checked_input = None
        repeat = self._repeat_of(batch)
        if repeat is not None:
            if check is not None:
                checked_input = check(repeat.shape.num_tokens)
            prev = repeat.shape
            shape = shape_of(repeat.dispatch, prev.num_tokens, prev.num_reqs, prev.uniform)
            if repeat.prepare(batch, shape):
                return shape, checked_input
        c = self._checker.check(batch)
        if self.ownership.has_unsure:  # only after a forward was taken back on a plan with state layers
            refuse_unsure(c.req_ids, c.rows, c.new, self.ownership.unsure_rows)
        if check is not None and repeat is None:  # a repeat checked it already (same query lengths)
            checked_input = check(c.num_tokens)
        shape = shape_of(c.dispatch, c.num_tokens, c.num_reqs, c.uniform)
        self._apply(c, shape)
        return shape, checked_input

    def _apply(self, c: CheckedBatch, shape: StepShape) -> None:
        """Change the state for a checked batch (rows, pages, holders, staging, device), all or nothing."""
        rows = c.rows
        new: list[tuple[Hashable, int]] = []
        if c.num_new:
            rows = rows.copy()
            new = self._requests.admit(c.req_ids, rows, c.new)
        own = self.ownership
        undo = StepUndo(rows, new, c.held if c.entries is not None else None, None, own.written[rows])
        self._undo = undo
        try:
            if c.entries is not None:
                self.tables.append_pages(rows, c.entries)
                undo.hold = own.hold(c.entries, c.columns, rows, c.new, c.ctx, c.shared)
            last = self._requests.last
            same_rows = last is not None and last.req_ids == c.req_ids
            same = same_rows and not c.num_new and last.query_lens == c.query_lens and last.shape == shape
            written_pages = self._staging.write_step(self.tables, shape, c.qlens, c.slens, c.ctx, rows, same=same)
            if own.num_shared:
                token_req = self._arange[:c.num_tokens] if c.num_tokens == c.num_reqs else \
                    self._staging.token_row[:c.num_tokens]
                for g, pages in written_pages:
                    own.check_writes(c.req_ids, pages, token_req, g)
            own.written[rows] = c.slens
            if c.num_new:  # (a refused join frees its rows: a row's claim is set again when it is next taken)
                own.claimed[rows[c.new]] = c.ctx[c.new]
            self.tables.sync(rows, shape.num_reqs_padded, same_rows=same_rows, rows_checked=True)
            self._staging.copy_to_device()
        except BaseException:
            self.undo(forward_ran=False)  # nothing ran on it
            raise
        requests = self._requests
        requests.last = LastStep(req_ids=c.req_ids, query_lens=c.query_lens, rows=rows, shape=shape,
                                 dispatch=c.dispatch)
        requests.last_rows = rows
        self._repeat = None

    def _repeat_of(self, batch: Batch) -> RepeatStep | None:
        """The cheap path for ``batch`` when it repeats the last full step (built on first use)."""
        if type(batch) is not Batch:
            return None
        if self._repeat is None:
            last = self._requests.last
            if last is None or batch.req_ids != last.req_ids or batch.query_lens != last.query_lens:
                return None
            self._repeat = RepeatStep(self._parts, last)
        return self._repeat if self._repeat.matches(batch) else None

    def _vocab_size(self, given: Any, forward: Any, input_ids: Any) -> int | None:
        """The vocabulary :meth:`run` checks ids against: ``given`` (an int >= 1), else the forward's
        ``vocab_size`` (read once per forward) for ids on the host (a device tensor's check would cost a sync
        the caller did not ask for)."""
        if given is not None:
            return count_arg("vocab_size", given, 1, "pass the model's vocabulary size (its embedding rows), e.g. "
                                                     "model.config.vocab_size, or leave it unset")
        if self._forward_vocab[0] is not forward:
            own = getattr(forward, "vocab_size", None)
            self._forward_vocab = (forward, None if own is None else count_arg(
                "forward.vocab_size", own, 1, "give the forward a vocab_size >= 1 (its embedding rows), or none"))
        vocab = self._forward_vocab[1]
        on_device = vocab is not None and isinstance(input_ids, torch.Tensor) and input_ids.device.type != "cpu"
        return None if on_device else vocab

    def _forget_last(self) -> None:
        """Rows, pages or staging changed outside a step: the next step takes the full path."""
        self._requests.forget_last()
        self._repeat = None

    def _remember_undo(self, rows: np.ndarray, written: "np.ndarray | list[int]",
                       appended: "tuple[list[tuple[int, int, int, list[int]]], HoldUndo] | None") -> None:
        """A repeated step changed the written tokens of ``rows`` (and, with ``appended``, appended pages: ``(group,
        row, pages held before, page ids)`` each, and the holds' undo): what :meth:`undo` restores."""
        items, hold = appended if appended is not None else (None, None)
        self._undo = StepUndo(rows, [], None, hold, written, items)
