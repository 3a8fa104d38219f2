"""Ledger entries of the step: metadata staging, token ids, batch-check constants and page ownership.

The step's metadata lives in one int32 and one int64 array (``staging.int32`` / ``staging.int64``,
named views as parts), written on the host and copied to the device in two transfers; on a CPU
the array is the buffer the forward reads (one copy), on CUDA a pinned host twin stages it. Page
ownership is host bookkeeping per page of the pool (numpy, int32 wherever a count, row, column or
token offset fits).
"""

from __future__ import annotations

import math
from typing import Sequence

from graphkv.plan.allocations.entries import Allocation, AllocationPart, Placement
from graphkv.plan.plan import GroupPlan
from graphkv.spec.dtypes import DType

__all__ = ["ownership_allocations", "staging_allocations", "step_allocations"]

_I16, _I32, _I64, _BOOL = DType.INT16, DType.INT32, DType.INT64, DType.BOOL
DEVICE, PINNED, HOST = Placement.DEVICE, Placement.PINNED, Placement.HOST


def _packed(parts: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[tuple[AllocationPart, ...], int]:
    out, offset = [], 0
    for name, shape in parts:
        out.append(AllocationPart(name=name, offset=offset, shape=shape))
        offset += math.prod(shape)
    return tuple(out), offset


def staging_allocations(kind: str, groups: Sequence[GroupPlan], *, max_num_seqs: int,
                        max_num_batched_tokens: int) -> list[Allocation]:
    """The step metadata arrays (and, on CUDA, their pinned host twins)."""
    seqs, tokens = max_num_seqs, max_num_batched_tokens
    ssm = [g.index for g in groups if g.is_ssm]
    parts32, n32 = _packed([("query_start_loc", (seqs + 1,)), ("seq_lens", (seqs,)), ("row_valid", (seqs,)),
                            ("num_reqs", (1,))])
    parts64, n64 = _packed([("query_lens", (seqs,)), ("context_lens", (seqs,)),
                            *((f"state_pages.{g}", (seqs,)) for g in ssm),
                            ("positions", (tokens,)), ("token_row", (tokens,)), ("token_offset", (tokens,)),
                            ("slot_mappings", (len(groups), tokens))])
    why32 = f"query_start_loc [{seqs + 1}] | seq_lens | row_valid [{seqs}] | num_reqs [1] (max_num_seqs={seqs})"
    why64 = (f"query_lens | context_lens{' | state page' * len(ssm)} [{seqs}] | positions | token_row | token_offset "
             f"[{tokens}] | slot_mappings [{len(groups)}, {tokens}] (max_num_batched_tokens={tokens})")
    where = "the buffers the forward reads (a CPU step: written in place, no copy)" if kind == "cpu" \
        else "the device buffers the forward reads, filled by one copy each"
    out = [Allocation(name="staging.int32", shape=(n32,), dtype=_I32, placement=DEVICE, parts=parts32,
                      reason=f"{where}: {why32}"),
           Allocation(name="staging.int64", shape=(n64,), dtype=_I64, placement=DEVICE, parts=parts64,
                      reason=f"{where}: {why64}")]
    if kind == "cuda":
        out += [Allocation(name="staging.int32_host", shape=(n32,), dtype=_I32, placement=PINNED, parts=parts32,
                           reason="pinned host twin of staging.int32, written with numpy each step"),
                Allocation(name="staging.int64_host", shape=(n64,), dtype=_I64, placement=PINNED, parts=parts64,
                           reason="pinned host twin of staging.int64, written with numpy each step")]
    return out


def step_allocations(kind: str, groups: Sequence[GroupPlan], *, max_num_batched_tokens: int) -> list[Allocation]:
    """The step's token-id buffer (and its pinned twin on CUDA) and the batch check's tokens per page."""
    tokens, num_groups = max_num_batched_tokens, len(groups)
    out = [Allocation(name="step.input_ids", shape=(tokens,), dtype=_I64, placement=DEVICE,
                      reason=f"one token id per token of a step (max_num_batched_tokens={tokens}); a captured "
                             "forward's static input")]
    if kind == "cuda":
        out.append(Allocation(name="step.input_ids_host", shape=(tokens,), dtype=_I64, placement=PINNED,
                              reason="pinned staging of token ids given on the host"))
    out.append(Allocation(name="step.tokens_per_page", shape=(num_groups, 1), dtype=_I64, placement=HOST,
                          reason=f"batch checks, per group ({num_groups}): tokens one page holds (a state page "
                                 "any length)"))
    return out


def ownership_allocations(groups: Sequence[GroupPlan], *, num_blocks: int, max_num_seqs: int) -> list[Allocation]:
    """Page ownership: per page of the pool and per request row (host bookkeeping, any device kind)."""
    n = num_blocks
    per_page = [
        ("holders", _I32, "live requests holding each page"),
        ("group_of", _I16, "the group a held page serves (-1: free)"),
        ("writer_row", _I32, "the request row that writes each page (-1: none live)"),
        ("writer_col", _I32, "the page index of each page in its writer's table"),
        ("filled", _I32, "tokens a finished writer left in each page (<= block_size)"),
        ("filled_at", _I32, "the page index at which a finished writer held each page"),
        ("stamp", _I32, "scratch: finds a page given twice in one step"),
    ]
    out = [Allocation(name=f"ownership.{name}", shape=(n,), dtype=dtype, placement=HOST,
                      reason=f"{why}, num_blocks={n}") for name, dtype, why in per_page]
    out += [Allocation(name="ownership.written", shape=(max_num_seqs,), dtype=_I64, placement=HOST,
                       reason=f"tokens written per request row (max_num_seqs={max_num_seqs})"),
            Allocation(name="ownership.claimed", shape=(max_num_seqs,), dtype=_I64, placement=HOST,
                       reason=f"cached tokens each request row joined with (max_num_seqs={max_num_seqs})"),
            Allocation(name="ownership.state_group", shape=(len(groups),), dtype=_BOOL, placement=HOST,
                       reason="which groups hold recurrent states"),
            Allocation(name="ownership.block_sizes", shape=(len(groups),), dtype=_I64, placement=HOST,
                       reason="tokens per page of each group")]
    return out
