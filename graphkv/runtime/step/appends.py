"""A repeated step whose requests gain a few pages: the commonest decode step of a batch of more than a few requests.

A decode batch of ``n`` requests with ``block_size`` tokens per page has a request crossing into a new page
every ``block_size / n`` steps on average: from 16 requests on (block size 16) nearly every step gains a page
somewhere. Such a step repeats the last one in everything but those pages, so
:class:`~graphkv.runtime.step.repeat.RepeatStep` takes it too, when :func:`few_appends` finds its pages plain: up
to :data:`FEW_APPENDS` page ids, each a plain ``int`` in ``[1, num_blocks)``, free (no live request holds it),
given once, appended to an attention group (a state group's one page is given when its request joins), within the
row's pages per request. Then the pages are written into the tables and counted as held item by item
(:meth:`~graphkv.runtime.tables.block_tables.BlockTables.append_few`,
:meth:`~graphkv.runtime.step.ownership.PageOwnership.hold_free`): a numpy call costs more than a page's whole
update. Anything else (a shared page, a numpy id, a bool, a list per request of another length, more pages) goes
to the full path, which checks and raises as usual; nothing has changed then.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from graphkv.runtime.step.ownership import HoldUndo, PageOwnership
from graphkv.runtime.tables.block_tables import BlockTables

__all__ = ["FEW_APPENDS", "Appends", "apply_appends", "few_appends"]

FEW_APPENDS = 64  # up to this many page ids a repeated step appends item by item
_LISTS = (list, tuple)


class Appends(NamedTuple):
    """The pages one repeated step appends, checked."""

    items: list[tuple[int, int, int, list[int]]]  # (group, table row, pages it held before, page ids)
    capacity: dict[int, int]  # batch row -> tokens its pages hold after the appends


def few_appends(new_pages: Sequence[Any], rows: list[int], tables: BlockTables, ownership: PageOwnership,
                tokens_per_page: list[int], is_state: list[bool]) -> Appends | None:
    """The appends of ``new_pages`` (``Batch.new_pages`` of a step repeating the last one's requests, batch row
    ``i`` in table row ``rows[i]``), or ``None`` when they are not few and plain (see the module docstring).
    ``tokens_per_page[g]``: tokens a page of group ``g`` holds; ``is_state[g]``: group ``g`` holds state. Reads
    the tables and the ownership, changes nothing."""
    num_groups = len(is_state)
    try:  # more requests gaining pages than FEW_APPENDS: the full path, before any per-page work
        if len(new_pages) != len(rows) or len(new_pages) - new_pages.count(None) > FEW_APPENDS:
            return None
    except ValueError:  # an array among the entries compares with None elementwise
        return None
    m = tables.mirror
    held_mv, seqs, max_pages, num_blocks = m.all_num_pages_mv, m.max_num_seqs, m.max_pages, m.num_blocks
    items: list[tuple[int, int, int, list[int]]] = []
    capacity: dict[int, int] = {}
    seen: set[int] = set()
    for i, per_group in enumerate(new_pages):
        if per_group is None:
            continue
        if type(per_group) not in _LISTS or len(per_group) != num_groups:
            return None
        row, gained = rows[i], False
        for g, pages in enumerate(per_group):
            if type(pages) not in _LISTS:
                return None
            if not pages:
                continue
            held = held_mv[g * seqs + row]
            if is_state[g] or held + len(pages) > max_pages[g] or len(seen) + len(pages) > FEW_APPENDS:
                return None
            for page in pages:
                if type(page) is not int or not 0 < page < num_blocks or page in seen or not ownership.is_free(page):
                    return None
                seen.add(page)
            items.append((g, row, held, list(pages)))
            gained = True
        if gained:
            capacity[i] = min((held_mv[g * seqs + row] + len(per_group[g])) * tokens_per_page[g]
                              for g in range(num_groups))
    return Appends(items, capacity)


def apply_appends(appends: Appends, tables: BlockTables, ownership: PageOwnership) -> HoldUndo:
    """Write the checked ``appends`` into the tables (the step rows showing them too) and count their pages as held;
    returns what :meth:`~graphkv.runtime.step.ownership.PageOwnership.undo_hold` takes back."""
    for g, row, _, pages in appends.items:
        tables.append_few(g, row, pages)
    return ownership.hold_free(appends.items)
