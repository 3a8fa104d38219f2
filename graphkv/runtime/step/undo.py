"""What one prepared step changed, and taking it back: :class:`StepUndo`, :func:`take_back` (:meth:`Step.undo`).

A step is taken back when the forward run after it raised. Its joining requests leave, its appended pages are
dropped from the tables and the holder counts, and written tokens return to what they were. What cannot be taken
back is a state (Mamba / gated-delta) layer's in-place update: the forward may have advanced the state pages of
the step's requests. So a joining request's state page no longer vouches for the state a finished request left in
it (a later claim of it is refused), a running request's state page vouches for nothing when it finishes, and the
running request's own next step is refused (:func:`refuse_unsure`): it would apply its tokens to that state twice.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np

from graphkv.errors import Problem, SpecError
from graphkv.runtime.step.ownership import HoldUndo, PageOwnership
from graphkv.runtime.step.rows import RequestRows
from graphkv.runtime.tables.block_tables import BlockTables

__all__ = ["StepUndo", "refuse_unsure", "take_back"]


class StepUndo:
    """What one prepared step changed: its table ``rows``, the requests that joined in it (``new``: ``(req_id,
    row)``), the pages each row held per group before its appends (``held``, ``[G, n]``; ``None``: none appended),
    the holds' undo, the rows' written tokens before the step, and a repeated step's few appends (``appended``:
    ``(group, row, pages held before, page ids)`` each, instead of ``held``)."""

    __slots__ = ("appended", "held", "hold", "new", "rows", "written")

    def __init__(self, rows: np.ndarray, new: list[tuple[Hashable, int]], held: np.ndarray | None,
                 hold: HoldUndo | None, written: "np.ndarray | list[int]",
                 appended: "list[tuple[int, int, int, list[int]]] | None" = None) -> None:
        self.rows, self.new, self.held, self.hold, self.written = rows, new, held, hold, written
        self.appended = appended


def take_back(undo: StepUndo, tables: BlockTables, ownership: PageOwnership, requests: RequestRows, *,
              forward_ran: bool = True) -> None:
    """Take back what ``undo`` records (see the module docstring; ``forward_ran=False``: no forward ran on the
    step, so its states are as they were); the device tables as they were before."""
    own = ownership
    if own.has_state and forward_ran:  # before the joining rows leave the tables: their state pages
        joined = {row for _, row in undo.new}
        running = [row for row in undo.rows.tolist() if row not in joined]
        state_pages = [int(p) for g, is_state in enumerate(own.state_list) if is_state
                       for p in tables.state_pages(g, undo.rows).tolist() if p]
        own.forget_states(state_pages, running)
    own.written[undo.rows] = undo.written
    if undo.hold is not None:
        own.undo_hold(undo.hold)
    if undo.held is not None:
        for i, row in enumerate(undo.rows.tolist()):
            if (tables.num_pages_np[:, row] != undo.held[:, i]).any():
                tables.truncate(row, undo.held[:, i])
    for g, row, held, _ in undo.appended or ():  # a repeated step's few appends
        keep = tables.num_pages_np[:, row].copy()
        keep[g] = held
        tables.truncate(row, keep)
    for req_id, row in reversed(undo.new):
        tables.remove(row)
        requests.release(req_id)
    tables.commit()  # the device tables as they were
    tables.forget_shown_rows()


def refuse_unsure(req_ids: Sequence[Hashable], rows: np.ndarray, new: np.ndarray, unsure: frozenset[int]) -> None:
    """:class:`SpecError` for the first request of a step (``req_ids``, their table ``rows``, ``new``: joining) that
    goes on from a row in ``unsure``: a state a taken-back forward may have advanced."""
    for i, (row, joins) in enumerate(zip(rows.tolist(), new.tolist())):
        if not joins and row in unsure:
            raise SpecError(Problem(
                field=f"batch.req_ids[{i}]", value=req_ids[i],
                limit="a forward that ran on its state (Mamba / gated-delta) pages raised and was taken back "
                      "(Step.undo), and may have advanced that state in place: going on would apply tokens to it "
                      "twice",
                fix="finish it (Step.finish) and prefill it again from its first token, prompt and generated tokens "
                    "together (DemoEngine does this itself)"))
