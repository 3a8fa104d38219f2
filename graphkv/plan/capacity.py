"""Step 4: how many pages the pool holds, and the longest request it can serve.

Page 0 is the null page (padding rows of block tables point at it), so ``num_blocks - 1`` pages
are usable. A ``num_blocks_override`` replaces the memory budget for every check here — the
upstream bug this prevents admitted requests the overridden pool could never hold, and the
scheduler waited for pages forever.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from graphkv.errors import CapacityError, Problem
from graphkv.plan.groups import GroupDraft
from graphkv.spec.budget import MAX_BYTES, Budget, format_bytes
from graphkv.spec.layers import MambaCacheMode, PageDemand
from graphkv.spec.limits import Limits

__all__ = ["PageCounter", "check_one_token_fits", "fit_max_model_len", "longest_len", "more_pages_fix",
           "plan_num_blocks"]


@attrs.frozen(kw_only=True)
class PageCounter:
    """Counts the worst-case pages one request needs across all groups at a given length."""

    groups: tuple[GroupDraft, ...]
    max_num_batched_tokens: int
    mamba_cache_mode: MambaCacheMode
    num_speculative_blocks: int
    max_concurrent_batches: int = 1
    extra_retained_tokens: int = 0

    @classmethod
    def for_limits(cls, groups: Sequence[GroupDraft], limits: Limits) -> "PageCounter":
        """A counter using the limits' step budget, steps in flight, Mamba mode and speculative tokens."""
        return cls(groups=tuple(groups), max_num_batched_tokens=limits.max_num_batched_tokens,
                   mamba_cache_mode=limits.mamba_cache_mode, num_speculative_blocks=limits.num_speculative_tokens,
                   max_concurrent_batches=limits.concurrent_batches(),
                   extra_retained_tokens=limits.extra_retained_tokens)

    def demand(self, block_size: int, max_model_len: int) -> PageDemand:
        """What decides a group's worst-case pages at ``block_size`` for ``max_model_len`` tokens."""
        return PageDemand(
            block_size=block_size, max_model_len=max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens, mamba_cache_mode=self.mamba_cache_mode,
            num_speculative_blocks=self.num_speculative_blocks, max_concurrent_batches=self.max_concurrent_batches,
            extra_retained_tokens=self.extra_retained_tokens)

    def group_pages(self, group: GroupDraft, max_model_len: int) -> int:
        """Worst-case pages of one group for a request of ``max_model_len`` tokens."""
        return group.spec.max_pages(self.demand(group.block_size, max_model_len))

    def pages(self, max_model_len: int) -> int:
        """Worst-case pages over all groups (what one request of that length must be able to get)."""
        return sum(self.group_pages(g, max_model_len) for g in self.groups)

    @property
    def grows_without_bound(self) -> bool:
        """Whether some group's need grows with the length (full attention, MLA, Mamba 'all')."""
        return any(g.spec.uniform_type_key == ("full",)
                   or (g.spec.is_ssm and self.mamba_cache_mode is MambaCacheMode.ALL) for g in self.groups)


INT32_IDS = 1 << 31  # ids 0 .. 2**31 - 1: page ids and kernel-block ids live in int32 tables and slot mappings


def max_pages(kernel_blocks_per_page: int = 1) -> int:
    """The most pages a pool may have: its largest kernel-block id, ``num_blocks x kernel_blocks_per_page - 1``,
    must fit int32 (the device block tables hold kernel-block ids).

    >>> max_pages(), max_pages(4)
    (2147483648, 536870912)
    """
    return INT32_IDS // max(kernel_blocks_per_page, 1)


def plan_num_blocks(budget: Budget | None, limits: Limits, pool_bytes_per_block: int, *,
                    kernel_blocks_per_page: int = 1) -> tuple[int, str]:
    """``num_blocks`` and the reason: the override exactly, else ``budget // pool_bytes_per_block``;
    at most :func:`max_pages` of ``kernel_blocks_per_page`` (the largest over the groups)."""
    limit = max_pages(kernel_blocks_per_page)
    ids = "page ids are int32 in the block tables" if kernel_blocks_per_page <= 1 else (
        f"kernel-block ids, {kernel_blocks_per_page} per page, are int32 in the block tables")
    if limits.num_blocks_override is not None:
        n = limits.num_blocks_override
        if n * pool_bytes_per_block > MAX_BYTES:  # the cap on a typed budget (parse_bytes) holds for pages too
            raise CapacityError(Problem(
                field="num_blocks_override", value=n,
                limit=f"needs {n} x {pool_bytes_per_block} = {format_bytes(n * pool_bytes_per_block)}, more than "
                      f"{format_bytes(MAX_BYTES)}, more memory than any one machine has",
                fix=f"lower num_blocks_override to <= {MAX_BYTES // pool_bytes_per_block}"))
        if n > limit:
            raise CapacityError(Problem(field="num_blocks_override", value=n, limit=f"is more than {limit} pages ({ids})",
                                        fix=f"lower num_blocks_override to <= {limit}"))
        if budget is not None and n * pool_bytes_per_block > budget.kv_pool_bytes():
            raise CapacityError(Problem(
                field="num_blocks_override", value=n,
                limit=f"needs {n} x {pool_bytes_per_block} = {format_bytes(n * pool_bytes_per_block)} but the KV budget "
                      f"is {format_bytes(budget.kv_pool_bytes())}",
                fix=f"lower num_blocks_override to <= {budget.kv_pool_bytes() // pool_bytes_per_block} or raise the budget"))
        return n, f"num_blocks_override={n} (replaces the memory budget for every check)"
    if budget is None:
        raise CapacityError(Problem(field="budget", value=None, limit="a budget or num_blocks_override is required",
                                    fix="pass Budget.kv_bytes(...) / Budget.for_gpu(...) or set num_blocks_override"))
    kv = budget.kv_pool_bytes()
    n = kv // pool_bytes_per_block
    if n < 2:
        raise CapacityError(Problem(
            field="budget", value=format_bytes(kv),
            limit=f"holds {n} page(s) of {pool_bytes_per_block} bytes across all slots; at least 2 are needed "
                  f"(page 0 is the null page)",
            fix=f"raise the KV budget to >= {format_bytes(2 * pool_bytes_per_block, rounding='up')}"))
    if n > limit:
        raise CapacityError(Problem(
            field="budget", value=format_bytes(kv),
            limit=f"gives {n} pages of {pool_bytes_per_block} bytes, more than {limit} ({ids}, as in vLLM)",
            fix=f"lower the KV budget to <= {format_bytes(limit * pool_bytes_per_block, rounding='down')}"))
    return n, f"{format_bytes(kv)} budget // {pool_bytes_per_block} bytes per page index"


def more_pages_fix(from_override: bool, pages: int, pool_bytes_per_block: int) -> str:
    """The fix that gives the pool ``pages`` usable pages: the override, or the budget (rounded up, so it is
    enough); when that budget is above :data:`~graphkv.spec.budget.MAX_BYTES` (the largest a budget may be), it
    says that no budget can."""
    needed = (pages + 1) * pool_bytes_per_block
    if needed > MAX_BYTES:
        what = "num_blocks_override" if from_override else "the KV budget"
        return (f"raise {what} (which cannot help: {pages} pages take {format_bytes(needed, rounding='up')}, more "
                f"than the {format_bytes(MAX_BYTES)} a pool may be)")
    if from_override:
        return f"raise num_blocks_override to >= {pages + 1}"
    return f"raise the KV budget to >= {format_bytes(needed, rounding='up')}"


def _largest_speculative(counter: PageCounter, usable_pages: int) -> int:
    """The most speculative tokens (below the counter's) at which a 1-token request fits ``usable_pages``."""
    lo, hi = 0, counter.num_speculative_blocks  # invariant: lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if attrs.evolve(counter, num_speculative_blocks=mid).pages(1) <= usable_pages:
            lo = mid
        else:
            hi = mid
    return lo


def check_one_token_fits(counter: PageCounter, usable_pages: int, max_model_len: int | str, *,
                         pool_bytes_per_block: int, num_blocks_reason: str, from_override: bool) -> None:
    """Raise :class:`CapacityError` when even a 1-token request cannot get its pages, naming what moved the
    need: the speculative tokens (a state page each, in every state group) when the request fits without them,
    else ``max_model_len`` (the pool is too small for any length). Length does not matter here: at one
    token, every group holds its fewest pages whatever ``max_num_batched_tokens`` is."""
    one = counter.pages(1)
    if one <= usable_pages:
        return
    pool = f"the pool has {usable_pages} usable pages ({num_blocks_reason}; page 0 is the null page)"
    more = more_pages_fix(from_override, one, pool_bytes_per_block)
    spec = counter.num_speculative_blocks
    without = attrs.evolve(counter, num_speculative_blocks=0).pages(1) if spec else one
    if without <= usable_pages:
        raise CapacityError(Problem(
            field="num_speculative_tokens", value=spec,
            limit=(f"each speculative token keeps one more page per request in every state group, so even a 1-token "
                   f"request needs {one} pages ({without} without speculative tokens) but {pool}"),
            fix=f"lower num_speculative_tokens to <= {_largest_speculative(counter, usable_pages)}, or {more}"))
    raise CapacityError(Problem(
        field="max_model_len", value=max_model_len,
        limit=f"even a 1-token request needs {one} pages but {pool}", fix=more))


def fit_max_model_len(counter: PageCounter, usable_pages: int, cap: int | None, *, pool_bytes_per_block: int,
                      num_blocks_reason: str, from_override: bool = False) -> int:
    """The largest length whose worst-case need fits ``usable_pages`` (exact, by bisection), capped by ``cap``."""
    check_one_token_fits(counter, usable_pages, "auto", pool_bytes_per_block=pool_bytes_per_block,
                         num_blocks_reason=num_blocks_reason, from_override=from_override)
    if cap is not None:
        hi = cap
    elif counter.grows_without_bound:
        hi = usable_pages * max(g.block_size for g in counter.groups) + 1
    else:
        raise CapacityError(Problem(
            field="max_model_len", value="auto",
            limit="no layer's need grows with length (only sliding / chunked / Mamba layers) and the model declares no "
                  "max_position_embeddings, so 'auto' is unbounded",
            fix="set max_model_len explicitly or declare max_position_embeddings on the model"))
    return longest_len(counter, usable_pages, hi)


def longest_len(counter: PageCounter, pages: int, hi: int) -> int:
    """The largest length in ``[1, hi]`` whose worst-case need is at most ``pages``; 0 when none is."""
    if hi < 1 or counter.pages(1) > pages:
        return 0
    if counter.pages(hi) <= pages:
        return hi
    lo = 1  # invariant: pages(lo) fits, pages(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if counter.pages(mid) <= pages:
            lo = mid
        else:
            hi = mid
    return lo


def check_admission(counter: PageCounter, max_model_len: int, usable_pages: int, *, num_blocks: int,
                    pool_bytes_per_block: int, num_blocks_reason: str, from_override: bool) -> None:
    """Raise :class:`CapacityError` unless one request of ``max_model_len`` fits the empty pool."""
    need = counter.pages(max_model_len)
    if need <= usable_pages:
        return
    check_one_token_fits(counter, usable_pages, max_model_len, pool_bytes_per_block=pool_bytes_per_block,
                         num_blocks_reason=num_blocks_reason, from_override=from_override)
    lower = f"lower max_model_len to <= {longest_len(counter, usable_pages, max_model_len)}"  # >= 1: one token fits
    knob = more_pages_fix(from_override, need, pool_bytes_per_block)
    raise CapacityError(Problem(
        field="max_model_len", value=max_model_len,
        limit=(f"max seq len {max_model_len} needs {need} pages ({format_bytes(need * pool_bytes_per_block)}) per request "
               f"but the pool has {usable_pages} usable pages ({format_bytes(usable_pages * pool_bytes_per_block)}; "
               f"num_blocks={num_blocks} from {num_blocks_reason}, page 0 is the null page)"),
        fix=f"{lower}, or {knob}"))


def check_mamba_seqs(counter: PageCounter, limits: Limits, usable_pages: int) -> None:
    """Every running sequence holds its live state pages in every Mamba group (1 per group in mode
    ``none``/``all``, 2 in ``align``, plus one per speculative token): ``max_num_seqs`` must fit."""
    mamba_groups = [g for g in counter.groups if g.spec.is_ssm]
    if not mamba_groups:
        return
    per_seq = sum(counter.group_pages(g, 1) for g in mamba_groups)
    if limits.max_num_seqs * per_seq > usable_pages:
        fixes = [f"lower max_num_seqs to <= {usable_pages // per_seq}"]  # >= 1: a 1-token request fits
        spec = limits.num_speculative_tokens
        if spec:  # each speculative token is one more page per sequence in every Mamba group
            fewer = (usable_pages // limits.max_num_seqs - (per_seq - spec * len(mamba_groups))) // len(mamba_groups)
            if fewer >= 0:
                fixes.append(f"lower num_speculative_tokens to <= {fewer}")
        fix = ", or ".join([*fixes, "give the pool more pages"])
        raise CapacityError(Problem(
            field="max_num_seqs", value=limits.max_num_seqs,
            limit=(f"each running sequence holds {per_seq} Mamba state pages ({len(mamba_groups)} Mamba groups, "
                   f"mamba_cache_mode={limits.mamba_cache_mode.value}, {limits.num_speculative_tokens} speculative "
                   f"tokens), so {limits.max_num_seqs} sequences need {limits.max_num_seqs * per_seq} pages but the pool "
                   f"has {usable_pages} usable pages"),
            fix=fix))
