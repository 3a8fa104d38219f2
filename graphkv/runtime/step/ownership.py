"""Page ownership: which live requests hold which pages, and what a step may write.

The caller's scheduler decides which pages a request gets; graphkv owns the bytes and refuses
what would corrupt them. Per page it keeps a *holder count* (live requests whose table lists the
page) and the group it is held in; per request row the tokens it has had written. The rules:

- page 0 (the null page) is never handed out, and a page is held in one group at a time (all
  groups share the pool's page indices);
- a page several live requests hold is read-only: that is prefix caching. A request joining the
  step may receive a page another request holds only inside its cached context (page columns below
  ``cdiv(seq_len - query_len, block_size)``); a running request may not receive one (it would
  write into it), and a state (Mamba) page has one holder;
- no token of a step is written into a page another live request holds;
- a running request's context (``seq_len - query_len``) may shrink (speculative decoding rolls
  back rejected drafts) but never exceed the tokens it has had written, nor fall below the cached
  tokens it joined with (those pages are another request's writing: rewriting them would change
  what the prefix cache says they hold); in a plan with state
  (Mamba / gated-delta) groups it may not shrink either: the request's one state has absorbed
  every written token, and reading them again would apply them twice;
- a request joining with cached context needs a plan that can hold a prefix (no Mamba group in
  mamba_cache_mode ``none``), and each claimed page must hold the claimed tokens at the claimed
  page index: written by a live request that got that far, or by one that finished; its state page
  must hold the state a finished request left after exactly that many tokens; and a claim may end
  inside a page a finished request wrote only where that request's tokens end too (the joining
  request writes on from there: tokens past the claim would be overwritten while the page still
  said it held them).

Everything is vectorized numpy over the step's pages and requests; checks never change state, so
a refused step leaves every count as it was. The cost of the common step (no page shared with
another request) is a handful of numpy calls: the prefix-sharing checks run only while a shared
page exists.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import numpy as np
import torch

from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.plan.plan import Plan
from graphkv.runtime.buffers import LedgerBuffers
from graphkv.runtime.tables.page_ids import PageEntries
from graphkv.spec.limits import MambaCacheMode

__all__ = ["STATE_FILLED_AT", "HoldUndo", "PageOwnership"]

STATE_FILLED_AT = -2  # filled_at of a state page its writer left: filled is then the tokens its state absorbed


class HoldUndo:
    """What :meth:`PageOwnership.hold` changed, so that it can be taken back."""

    __slots__ = ("group_of", "ids", "num_shared", "writer_col", "writer_row")

    def __init__(self, ids: "np.ndarray | list[int]", group_of: "np.ndarray | list[int]",
                 writer_row: "np.ndarray | list[int]", writer_col: "np.ndarray | list[int]", num_shared: int) -> None:
        self.ids, self.group_of, self.writer_row, self.writer_col = ids, group_of, writer_row, writer_col
        self.num_shared = num_shared


class PageOwnership:
    """Holder counts and written tokens of a plan's pool (host-side numpy).

    Per page (``[num_blocks]``, int32 unless said): ``holders`` (live requests listing it),
    ``group_of`` (int16, the group they hold it in, -1 when free), the row and page index of the
    request that writes it (``writer_row`` -1 when none is live), and for pages whose writer
    finished, the tokens it holds (``filled``) at which page index (``filled_at``). Per request
    row: ``written`` tokens and the cached tokens it joined with, ``claimed`` (int64). A state page is always its
    holder's to write (its state is updated in place); when its writer leaves, ``filled`` records the tokens the state
    absorbed, at ``filled_at`` :data:`STATE_FILLED_AT`.
    """

    def __init__(self, plan: Plan) -> None:
        # Host arrays, the plan's ownership.* ledger entries (int32 wherever a count, row, page index or
        # token count fits); the same on every device.
        buffers = LedgerBuffers.of_plan(plan, torch.device("cpu"), ("ownership.",), layout="cpu")
        self.num_blocks = plan.num_blocks
        self.holders = buffers.array("ownership.holders")
        self.group_of = buffers.array("ownership.group_of")
        self.group_of.fill(-1)
        self.writer_row = buffers.array("ownership.writer_row")
        self.writer_row.fill(-1)
        self.writer_col = buffers.array("ownership.writer_col")
        self.filled = buffers.array("ownership.filled")
        self.filled_at = buffers.array("ownership.filled_at")
        self.filled_at.fill(-1)
        self.written = buffers.array("ownership.written")
        self.claimed = buffers.array("ownership.claimed")  # set at each join: the cached tokens it claimed
        self.num_shared = 0  # pages with more than one holder
        self._stamp = buffers.array("ownership.stamp")  # scratch: finds repeated pages in one step
        self.state_group = buffers.array("ownership.state_group")
        self.state_group[:] = [g.is_ssm for g in plan.groups]
        self.block_sizes = buffers.array("ownership.block_sizes")
        self.block_sizes[:] = [g.block_size for g in plan.groups]
        assert not buffers.untaken(), buffers.untaken()
        none = plan.limits.mamba_cache_mode is MambaCacheMode.NONE
        self.prefix_refusal = (f"mamba_cache_mode={plan.limits.mamba_cache_mode.value} keeps one state per request, "
                               "so no request can start from cached context"
                               if none and self.state_group.any() else None)
        self.has_state = bool(self.state_group.any())  # a running request's context cannot shrink
        self.block_size_list = [g.block_size for g in plan.groups]
        self.state_list = [g.is_ssm for g in plan.groups]
        self._unsure_rows: set[int] = set()  # rows whose state a taken-back forward may have advanced
        # item access from Python (a few pages at a time)
        self._items = tuple(memoryview(a) for a in (self.writer_row, self.holders, self.group_of, self.filled,
                                                     self.filled_at))
        self._writer_col_mv = memoryview(self.writer_col)

    # ---- checks (no state changes) ----------------------------------------------------------

    def check_context(self, req_ids: Sequence[Hashable], rows: np.ndarray, new: np.ndarray, ctx: np.ndarray) -> None:
        """Refuse a running request whose context exceeds its written tokens, falls below the cached
        tokens it joined with (``claimed``) or, in a plan with state groups, below its written tokens;
        and cached context for a joining request where the plan cannot hold a prefix."""
        written, claimed, running = self.written[rows], self.claimed[rows], ~new
        if self.has_state:
            _refuse_context(req_ids, ctx, (ctx < written) & running, lambda i: (
                f"the request has had {int(written[i])} tokens written, and the model's state (Mamba / gated-delta) "
                "layers keep one state per request that has absorbed them all: its context cannot shrink "
                "(rolled-back drafts would be applied twice)",
                "set seq_len to the tokens written so far plus this step's query_len (speculative decoding with "
                "state layers must not write rejected drafts, or must restart the request)"))
        _refuse_context(req_ids, ctx, (ctx < claimed) & running, lambda i: (
            f"the request joined with {int(claimed[i])} cached tokens, which it did not write (read-only prefix "
            "pages): its context may shrink to them, not below",
            f"set seq_len - query_len to at least {int(claimed[i])} (or finish the request and start it again with "
            "fewer cached tokens)"))
        _refuse_context(req_ids, ctx, (ctx > written) & running, lambda i: (
            f"the request has had {int(written[i])} tokens written; its context may shrink (rolled-back drafts) but "
            "not skip ahead, or attention would read slots nobody wrote",
            "set seq_len to the tokens written so far plus this step's query_len"))
        if self.prefix_refusal is not None:
            claims = new & (ctx > 0)
            if claims.any():
                i = int(np.flatnonzero(claims)[0])
                raise SpecError(Problem(field=f"batch[{i}] ({req_ids[i]!r})",
                                        value=f"seq_len - query_len = {int(ctx[i])} cached tokens",
                                        limit=f"a new request starts with no cached context: {self.prefix_refusal}",
                                        fix="give a new request seq_len == query_len (prefill it whole), or plan "
                                            "with mamba_cache_mode='align' or 'all' for prefix caching"))

    def check_new_pages(self, entries: PageEntries, req_ids: Sequence[Hashable], rows: np.ndarray, new: np.ndarray,
                        ctx: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, bool]:
        """Check the pages a step appends (``held``: ``[num_groups, num_reqs]`` pages each request
        holds before the step). Returns each page's column in its request's table, and whether a
        page is shared (held already, or given twice)."""
        lo, hi = entries.id_range
        ids = entries.ids
        seg = entries.segment_of_page()
        req, group = entries.request_of_segment()[seg], entries.group[seg]
        column = held[group, req] + np.arange(ids.shape[0]) - np.repeat(np.cumsum(entries.count) - entries.count,
                                                                        entries.count)
        if lo < 1 or hi >= self.num_blocks:
            bad = int(np.flatnonzero((ids < 1) | (ids >= self.num_blocks))[0])
            page = int(ids[bad])
            what = "page 0 is the null page (padding rows point at it); it is never handed out" if page == 0 \
                else f"page ids must be in 1..num_blocks - 1 = {self.num_blocks - 1}"
            raise SpecError(self._problem(req_ids, req, group, bad, page, what, "hand out pages from 1..num_blocks-1"))
        self._stamp[ids] = np.arange(ids.shape[0])
        repeated = self._stamp[ids] != np.arange(ids.shape[0])  # every occurrence but one of a repeated id
        shared = self.holders[ids] > 0
        if repeated.any():
            winner = self._stamp[ids]
            other_group = group[winner] != group
            if other_group.any():
                bad = int(np.flatnonzero(other_group)[0])
                raise SpecError(self._problem(req_ids, req, group, bad, int(ids[bad]),
                                              f"the step also gives it in group {int(group[winner[bad]])}; groups "
                                              "share the pool's page indices, so a page serves one group at a time",
                                              "give each group its own pages"))
            shared |= repeated
            shared[winner[repeated]] = True
        if not shared.any():
            return column, False
        held_elsewhere = shared & (self.holders[ids] > 0) & (self.group_of[ids] != group)
        if held_elsewhere.any():
            bad = int(np.flatnonzero(held_elsewhere)[0])
            raise SpecError(self._problem(req_ids, req, group, bad, int(ids[bad]),
                                          f"live requests hold it in group {int(self.group_of[ids[bad]])}; a page "
                                          "serves one group at a time", "give the request a free page"))
        in_context = new[req] & (column < -(-ctx[req] // self.block_sizes[group])) & ~self.state_group[group]
        bad_share = shared & ~in_context
        if bad_share.any():
            bad = int(np.flatnonzero(bad_share)[0])
            holders = int(self.holders[ids[bad]])
            why = ("a state page has one holder" if self.state_group[group[bad]] else
                   "a new request may share only pages of its cached context (page columns below cdiv(seq_len - "
                   "query_len, block_size)), and a running request may not receive a page another request holds: "
                   "it would write into it")
            page = int(ids[bad])
            first = np.cumsum(entries.count) - entries.count  # each segment's first page
            where = [f"batch.new_pages[{int(req[k])}][{int(group[k])}][{k - int(first[seg[k]])}]"
                     for k in np.flatnonzero(ids == page).tolist()]
            if len(where) > 1:
                held = f"; {holders} live request(s) hold it" if holders else ""
                raise SpecError(self._problem(req_ids, req, group, bad, page,
                                              f"the step gives it {len(where)} times ({', '.join(where)}){held}; {why}",
                                              "give each page once, to one request (only joining requests may share "
                                              "the pages of a cached prefix)"))
            raise SpecError(self._problem(req_ids, req, group, bad, page, f"{holders} live request(s) hold it; {why}",
                                          "give the request a page no live request holds"))
        return column, True

    def check_claims(self, entries: PageEntries, column: np.ndarray, req_ids: Sequence[Hashable], new: np.ndarray,
                     ctx: np.ndarray, held_after: np.ndarray) -> None:
        """Refuse a joining request's cached context that its pages do not hold: each page of the
        context must hold the claimed tokens at the claimed page index (``held_after``: ``[groups,
        num_reqs]`` pages each request holds after the step's appends)."""
        claims = new & (ctx > 0)
        if not claims.any():
            return
        attn = ~self.state_group
        need = -(-ctx[None, :] // self.block_sizes[:, None])  # [G, n]
        short = attn[:, None] & claims[None, :] & (held_after < need)
        if short.any():
            g, i = (int(x) for x in np.argwhere(short)[0])
            raise CapacityError(Problem(field=f"batch.new_pages[{i}][{g}] ({req_ids[i]!r})",
                                        value=f"{int(held_after[g, i])} page(s)",
                                        limit=f"{int(ctx[i])} cached tokens need {int(need[g, i])} page(s) of "
                                              f"block_size {int(self.block_sizes[g])} in group {g}",
                                        fix="give a joining request the pages of its whole cached context"))
        ids = entries.ids
        seg = entries.segment_of_page()
        req, group = entries.request_of_segment()[seg], entries.group[seg]
        state = self.state_group[group]
        self._check_state_claims(ids, req, group, column, claims & (ctx > 0), ctx, req_ids, state)
        bs = self.block_sizes[group]
        claimed = claims[req] & ~state & (column * bs < ctx[req])
        if not claimed.any():
            return
        tokens = np.minimum(bs, ctx[req] - column * bs)
        live = self.writer_row[ids] >= 0
        have = np.where(live, np.clip(self.written[np.maximum(self.writer_row[ids], 0)] - self.writer_col[ids] * bs,
                                      0, bs), self.filled[ids])
        at = np.where(live, self.writer_col[ids], self.filled_at[ids])
        bad_claim = claimed & ((have < tokens) | (at != column))
        if bad_claim.any():
            bad = int(np.flatnonzero(bad_claim)[0])
            raise SpecError(self._problem(
                req_ids, req, group, bad, int(ids[bad]),
                f"the request claims {int(tokens[bad])} cached token(s) in it at page index {int(column[bad])}, but "
                f"it holds {int(have[bad])} written token(s) at page index {int(at[bad])}",
                "claim only cached tokens whose pages were written (seq_len - query_len = the shared tokens)"))
        # The page a claim ends inside is written from the claim's end on: a finished request's tokens past it would
        # be overwritten while the page still says it holds them (a later claim of them would read this request's).
        overwrite = claimed & ~live & (have > tokens)
        if overwrite.any():
            bad = int(np.flatnonzero(overwrite)[0])
            i, b = int(req[bad]), int(bs[bad])
            raise SpecError(self._problem(
                req_ids, req, group, bad, int(ids[bad]),
                f"the request claims {int(tokens[bad])} of the {int(have[bad])} cached token(s) a finished request "
                f"wrote in it, and would write its own tokens from position {int(ctx[i])} over the rest (which a later "
                "request may still claim)",
                f"claim whole pages (seq_len - query_len a multiple of block_size {b}) and recompute the rest, or "
                f"claim all {int(have[bad])} tokens the page holds"))

    def _check_state_claims(self, ids: np.ndarray, req: np.ndarray, group: np.ndarray, column: np.ndarray,
                            claims: np.ndarray, ctx: np.ndarray, req_ids: Sequence[Hashable],
                            state: np.ndarray) -> None:
        """Refuse a joining request claiming ``ctx`` cached tokens whose state page (the first page of a state group)
        does not hold the state after exactly ``ctx`` tokens: a finished request's state, recorded at its release."""
        first = state & (column == 0) & claims[req]
        if not first.any():
            return
        absorbed = np.where(self.filled_at[ids] == STATE_FILLED_AT, self.filled[ids], -1)
        bad_state = first & (absorbed != ctx[req])
        if bad_state.any():
            bad = int(np.flatnonzero(bad_state)[0])
            held = (f"the state after {int(absorbed[bad])} tokens" if absorbed[bad] >= 0
                    else "no finished request's state")
            raise SpecError(self._problem(
                req_ids, req, group, bad, int(ids[bad]),
                f"the request claims {int(ctx[req[bad]])} cached tokens, so its state page must hold the state after "
                f"exactly that many, and it holds {held}",
                "give a joining request the state page a request left when it finished with seq_len - query_len "
                "tokens, or join with no cached context"))

    def check_writes(self, req_ids: Sequence[Hashable], pages: np.ndarray, token_req: np.ndarray, group: int) -> None:
        """Refuse a step that writes a token of group ``group`` into a page another live request holds
        (``pages``, ``token_req``: page and batch row of each written token)."""
        if self.num_shared == 0:
            return
        crowded = self.holders[pages] > 1
        if crowded.any():
            t = int(np.flatnonzero(crowded)[0])
            i = int(token_req[t])
            raise SpecError(Problem(field=f"batch[{i}] ({req_ids[i]!r})", value=f"page {int(pages[t])}",
                                    limit=f"a token of this step would be written into page {int(pages[t])} of group "
                                          f"{group}, which {int(self.holders[pages[t]])} live requests hold "
                                          "(shared pages are read-only)",
                                    fix="give the request a page of its own for the tokens it writes (copy-on-write "
                                        "is the scheduler's job)"))

    # ---- changes ------------------------------------------------------------------------------

    def hold(self, entries: PageEntries, column: np.ndarray, rows: np.ndarray, new: np.ndarray, ctx: np.ndarray,
             shared: bool) -> HoldUndo:
        """Count the step's appended pages as held (``shared``: as :meth:`check_new_pages` said); a
        page no one held, outside a joining request's cached context, becomes its request's to
        write. Returns what :meth:`undo_hold` needs."""
        ids = entries.ids
        seg = entries.segment_of_page()
        req, group = entries.request_of_segment()[seg], entries.group[seg]
        undo = HoldUndo(ids, self.group_of[ids], self.writer_row[ids], self.writer_col[ids], self.num_shared)
        self.group_of[ids] = group
        if shared:
            fresh = self.holders[ids] == 0
            distinct = np.unique(ids)  # the step's pages only: never a scan of the pool
            was_shared = self.holders[distinct] > 1
            np.add.at(self.holders, ids, 1)
            self.num_shared += int(((self.holders[distinct] > 1) & ~was_shared).sum())
            # not claimed context (a state page is always its holder's: its state is updated in place)
            owned = fresh & ~(new[req] & (column * self.block_sizes[group] < ctx[req]) & ~self.state_group[group])
            self.writer_row[ids[owned]] = rows[req[owned]]
            self.writer_col[ids[owned]] = column[owned]
        else:  # every page was free and appears once
            self.holders[ids] = 1
            claimed = new[req] & (column * self.block_sizes[group] < ctx[req]) & ~self.state_group[group]
            owned = ids[~claimed] if claimed.any() else ids
            self.writer_row[owned] = rows[req] if owned is ids else rows[req[~claimed]]
            self.writer_col[owned] = column if owned is ids else column[~claimed]
        return undo

    def is_free(self, page: int) -> bool:
        """Whether no live request holds ``page`` (an int in ``[0, num_blocks)``; item access, for a few pages)."""
        return self._items[1][page] == 0

    def hold_free(self, pages: list[tuple[int, int, int, list[int]]]) -> HoldUndo:
        """Count a few free pages as held, item by item: ``(group, row, first column, page ids)`` each, every page
        free (:meth:`is_free`) and given once (the caller checked), so each becomes its request's to write. Returns
        what :meth:`undo_hold` needs."""
        writer_row, holders, group_of = self._items[:3]
        writer_col = self._writer_col_mv
        ids, groups, rows, cols = [], [], [], []
        for g, row, column, given in pages:
            for page in given:
                ids.append(page)
                groups.append(group_of[page])
                rows.append(writer_row[page])
                cols.append(writer_col[page])
                holders[page] = 1
                group_of[page] = g
                writer_row[page] = row
                writer_col[page] = column
                column += 1
        return HoldUndo(ids, groups, rows, cols, self.num_shared)  # (lists: undo_hold indexes with them as well)

    def forget_states(self, pages: list[int], rows: list[int]) -> None:
        """A forward that ran on these state ``pages`` was taken back, but may have advanced their states in place:
        the pages vouch for no finished request's state any more, and live ``rows`` leave theirs unvouched."""
        filled, filled_at = self._items[3:]
        for page in pages:
            filled[page], filled_at[page] = 0, -1
        self._unsure_rows.update(rows)

    @property
    def unsure_rows(self) -> frozenset[int]:
        """Live rows whose state a taken-back forward may have advanced (:meth:`forget_states`), until they leave
        (empty, and :attr:`has_unsure` false, but after such a forward)."""
        return frozenset(self._unsure_rows)

    @property
    def has_unsure(self) -> bool:
        """Whether any row is in :attr:`unsure_rows` (no copy: checked every step)."""
        return bool(self._unsure_rows)

    def undo_hold(self, undo: HoldUndo) -> None:
        """Take back one :meth:`hold`."""
        np.add.at(self.holders, undo.ids, -1)
        self.group_of[undo.ids] = undo.group_of
        self.writer_row[undo.ids] = undo.writer_row
        self.writer_col[undo.ids] = undo.writer_col
        self.num_shared = undo.num_shared

    def release(self, row: int, pages_per_group: Sequence["list[int] | np.ndarray"]) -> None:
        """A request left: its pages (per group, in page order) lose a holder; pages it wrote keep what it
        wrote (for prefix reuse).

        A row lists a page once (a page a request holds is never appended to it again). A group's pages given
        as a list (a few, :meth:`BlockTables.held_pages`) are released item by item (a numpy call costs more
        than a page's whole update); an array in a few numpy calls, fewer still when no page is shared and the
        request joined with no cached tokens (then it holds its pages alone and wrote them all)."""
        written = int(self.written[row])
        alone = not self.num_shared and not self.claimed[row]
        unsure = row in self._unsure_rows
        for bs, is_state, pages in zip(self.block_size_list, self.state_list, pages_per_group):
            if is_state:  # (a state a taken-back forward may have advanced vouches for no token count)
                self._release_few(row, pages if isinstance(pages, list) else pages.tolist(), bs,
                                  -1 if unsure else written, state=True)
                continue
            if isinstance(pages, list):
                self._release_few(row, pages, bs, written)
                continue
            n = pages.shape[0]
            if alone:  # every page held once (by this request), in page order, the first `written` tokens written
                full, rest = divmod(written, bs)
                self.filled[pages[:full]] = bs
                if full < n:
                    self.filled[pages[full]] = rest
                    self.filled[pages[full + 1:]] = 0
                self.filled_at[pages] = np.arange(n)
                self.writer_row[pages] = -1
                self.holders[pages] = 0
                self.group_of[pages] = -1
                continue
            mine = self.writer_row[pages] == row
            wrote, at = pages[mine], np.flatnonzero(mine)
            self.filled[wrote] = np.minimum(np.maximum(written - at * bs, 0), bs)
            self.filled_at[wrote] = at
            self.writer_row[wrote] = -1
            left = self.holders[pages] - 1
            if self.num_shared:
                self.num_shared -= int(np.count_nonzero(left == 1))
            self.holders[pages] = left
            self.group_of[pages[left == 0]] = -1
        self.written[row] = 0
        self._unsure_rows.discard(row)

    def _release_few(self, row: int, pages: list[int], block_size: int, written: int, *, state: bool = False) -> None:
        """:meth:`release` of one group's few ``pages`` (page index = list index), item by item. A state group's
        (``state``) first page, which the request's state was updated in, holds the state after its ``written``
        tokens (``filled``, at :data:`STATE_FILLED_AT`), for a request that joins claiming exactly that many
        (``written`` -1: a state that vouches for nothing, see :meth:`forget_states`)."""
        writer_row, holders, group_of, filled, filled_at = self._items
        for column, page in enumerate(pages):
            if writer_row[page] == row:
                if state:  # (written -1: a state that vouches for nothing)
                    filled[page], filled_at[page] = (written, STATE_FILLED_AT) if column == 0 and written >= 0 \
                        else (0, -1)
                else:
                    filled[page] = min(max(written - column * block_size, 0), block_size)
                    filled_at[page] = column
                writer_row[page] = -1
            left = holders[page] - 1
            holders[page] = left
            if left == 0:
                group_of[page] = -1
            elif left == 1:
                self.num_shared -= 1

    # ---- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _problem(req_ids: Sequence[Hashable], req: np.ndarray, group: np.ndarray, k: int, page: int, why: str,
                 fix: str) -> Problem:
        i, g = int(req[k]), int(group[k])
        return Problem(field=f"batch.new_pages[{i}][{g}] ({req_ids[i]!r})", value=page,
                       limit=f"request {req_ids[i]!r}, group {g}, page {page}: {why}", fix=fix)


def _refuse_context(req_ids: Sequence[Hashable], ctx: np.ndarray, bad: np.ndarray,
                    why: "Callable[[int], tuple[str, str]]") -> None:
    """Raise :class:`SpecError` for the first request where ``bad`` holds: its context ``ctx`` and
    ``why(i)``'s (limit, fix)."""
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        limit, fix = why(i)
        raise SpecError(Problem(field=f"batch[{i}] ({req_ids[i]!r})", value=f"seq_len - query_len = {int(ctx[i])}",
                                limit=limit, fix=fix))
