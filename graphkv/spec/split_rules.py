"""How tensor parallelism divides a head or channel count over ranks (vLLM 0.33's rules), as data.

Three rules, one per kind of count:

- :attr:`SplitRule.DIVIDE` — query heads, state heads, conv channels: ``total / tp``, which must
  be whole (vLLM's ``divide``);
- :attr:`SplitRule.KV_HEADS` — attention KV heads: ``total / tp`` when ``tp <= total`` (must
  divide), else every rank keeps one head, replicated on ``tp / total`` consecutive ranks, so
  ``tp`` must be a multiple of ``total`` (vLLM's ``get_num_kv_heads`` and ``QKVParallelLinear``);
- :attr:`SplitRule.GROUPS` — Mamba2 ``n_groups``: ``total / tp`` when it divides, else a single
  group is replicated on every rank (vLLM's ``extra_groups_for_head_shards``; the mixer refuses
  any other group count ``tp`` does not divide).

:func:`split_count` answers with a :class:`HeadSplit` or a :class:`Refusal` whose texts the
config reader and :meth:`ModelKV.shard <graphkv.spec.model.ModelKV.shard>` both put into their
errors, so the two can never disagree about what splits.

Example::

    >>> split_count(2, 4, SplitRule.KV_HEADS)
    HeadSplit(per_rank=1, replicas=2)
    >>> split_count(8, 3, SplitRule.DIVIDE).limit
    'must be divisible by tp=3 (each rank holds heads / tp)'
"""

from __future__ import annotations

import enum

import attrs

__all__ = ["MAX_TP_TRIED", "HeadSplit", "Refusal", "SplitRule", "divisors", "split_count"]

MAX_TP_TRIED = 64
"""The largest tensor-parallel size a fix suggests (the divisors listed, the sizes the CLI tries)."""


class SplitRule(enum.Enum):
    """How a count is divided over tensor-parallel ranks (see the module docstring)."""

    DIVIDE = "divide"
    KV_HEADS = "kv_heads"
    GROUPS = "groups"


@attrs.frozen
class HeadSplit:
    """``per_rank`` heads (or channels) on each rank; ``replicas`` consecutive ranks hold the same ones."""

    per_rank: int
    replicas: int = 1


@attrs.frozen
class Refusal:
    """Why a count does not split over ``tp`` ranks (``limit``) and what to do (``fix``)."""

    limit: str
    fix: str


def divisors(value: int, limit: int = MAX_TP_TRIED) -> list[int]:
    """The divisors of ``value`` up to ``limit`` (the tensor-parallel sizes that split it)."""
    return [d for d in range(1, min(value, limit) + 1) if value % d == 0]


def _divide(name: str, total: int, tp_size: int) -> HeadSplit | Refusal:
    if total % tp_size:
        return Refusal(limit=f"must be divisible by tp={tp_size} (each rank holds {name} / tp)",
                       fix=f"use a tensor-parallel size that divides {total}, e.g. one of {divisors(total)}")
    return HeadSplit(per_rank=total // tp_size)


def split_count(total: int, tp_size: int, rule: SplitRule, *, name: str = "heads") -> HeadSplit | Refusal:
    """Split ``total`` over ``tp_size`` ranks by ``rule``; ``name`` is how a refusal's limit names the count.

    Pure; ``total`` and ``tp_size`` are positive ints (callers validate them first).
    """
    assert total >= 1 and tp_size >= 1, (total, tp_size)
    if rule is SplitRule.KV_HEADS and total < tp_size:
        if tp_size % total:
            return Refusal(limit=f"is below tp={tp_size}, so every rank keeps one replicated KV head, which needs "
                                 f"tp to be a multiple of {total}",
                           fix=f"use tp={total} or a multiple of it, or a tp that divides {total}")
        return HeadSplit(per_rank=1, replicas=tp_size // total)
    if rule is SplitRule.GROUPS and total % tp_size:
        if total != 1:
            return Refusal(limit=f"must be divisible by tp={tp_size}, or be 1 (one group is replicated on every rank)",
                           fix=f"use a tensor-parallel size that divides {total}")
        return HeadSplit(per_rank=1, replicas=tp_size)
    return _divide(name, total, tp_size)
