"""How a recurrent state's shapes split over tensor-parallel ranks.

A state dimension is a sum of terms ``count x size``: a head or channel count that tensor
parallelism divides times a fixed size, or a fixed size alone. vLLM 0.33's
``MambaStateShapeCalculator`` formulas, written that way (``/ tp`` applies to the counts):

- ``mamba1``: conv ``(k - 1, inner)``, ssm ``(inner, state)`` — ``inner`` channels split;
- ``mamba2``: conv ``(k - 1, inner + 2 * groups * state)``, ssm ``(heads, head_dim, state)`` —
  heads and inner channels split, groups split or (a single group) replicate;
- ``gated_delta``: conv ``(k - 1, 2 * k_heads * k_dim + v_heads * v_dim)``, recurrent
  ``(v_heads, v_dim, k_dim)``;
- ``kda``: conv ``(k - 1, 3 * heads * head_dim)``, recurrent ``(heads, head_dim, head_dim)``;
- ``lightning``: ``(heads, head_dim, head_dim)``;
- ``short_conv``: ``(k - 1, channels)``.

Each count carries the name it is reported under (a config reader passes ``config.<field>``), so a
tensor-parallel size that cannot split it is an error naming it.

Example::

    >>> split = StateSplit.gated_delta(key_heads=16, value_heads=32, key_dim=128, value_dim=128, conv_kernel=4)
    >>> split.shapes_per_rank(4)
    ((3, 2048), (8, 128, 128))
"""

from __future__ import annotations

from typing import Mapping

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec.split_rules import HeadSplit, SplitRule, split_count

__all__ = ["SplitCount", "StateSplit"]

Term = tuple[int | None, int]
"""``(index into StateSplit.counts, size)``: that count per rank times ``size``; ``(None, size)``: ``size``."""


@attrs.frozen(kw_only=True)
class SplitCount:
    """A head or channel count tensor parallelism divides: its reported ``name``, unsplit ``total`` and rule."""

    name: str
    total: int
    rule: SplitRule = SplitRule.DIVIDE


def _names(defaults: dict[str, str], names: Mapping[str, str] | None) -> dict[str, str]:
    return {**defaults, **(names or {})}


@attrs.frozen(kw_only=True)
class StateSplit:
    """The unsplit counts a state is built from and, per shape and dimension, the terms that sum to it.

    ``dims[s][d]`` is the tuple of terms of dimension ``d`` of shape ``s``. Use the named
    constructors (one per state variant); ``names`` maps a role (``heads``, ``groups``, …) to the
    name errors report for it.
    """

    counts: tuple[SplitCount, ...]
    dims: tuple[tuple[tuple[Term, ...], ...], ...]

    def split_counts(self, tp_size: int) -> tuple[list[HeadSplit | None], list[Problem]]:
        """Every count split over ``tp_size`` ranks (``None`` where it does not split) and the problems."""
        splits: list[HeadSplit | None] = []
        problems: list[Problem] = []
        for count in self.counts:
            bare = count.name.removeprefix("config.")
            result = split_count(count.total, tp_size, count.rule, name=bare)
            if isinstance(result, HeadSplit):
                splits.append(result)
            else:
                splits.append(None)
                problems.append(Problem(field=count.name, value=count.total, limit=result.limit, fix=result.fix))
        return splits, problems

    def shapes_per_rank(self, tp_size: int) -> tuple[tuple[int, ...], ...]:
        """The state shapes one of ``tp_size`` ranks holds. Raises :class:`SpecError` naming every
        count ``tp_size`` cannot split."""
        splits, problems = self.split_counts(tp_size)
        if problems:
            raise SpecError(*problems)
        return tuple(tuple(sum((1 if i is None else splits[i].per_rank) * size  # type: ignore[union-attr]
                               for i, size in terms) for terms in shape) for shape in self.dims)

    @classmethod
    def mamba1(cls, *, inner: int, state: int, conv_kernel: int, names: Mapping[str, str] | None = None) -> StateSplit:
        """Mamba1: ``inner`` channels split (vLLM ``mamba1_state_shape``)."""
        n = _names({"inner": "inner"}, names)
        return cls(counts=(SplitCount(name=n["inner"], total=inner),),
                   dims=((((None, conv_kernel - 1),), ((0, 1),)), (((0, 1),), ((None, state),))))

    @classmethod
    def mamba2(cls, *, heads: int, head_dim: int, state: int, groups: int, conv_kernel: int, inner: int | None = None,
               names: Mapping[str, str] | None = None) -> StateSplit:
        """Mamba2: heads, inner channels (default ``heads * head_dim``) and groups split; one group
        that ``tp`` does not divide is replicated (vLLM ``mamba2_state_shape``)."""
        n = _names({"heads": "heads", "inner": "inner", "groups": "groups"}, names)
        counts = (SplitCount(name=n["heads"], total=heads),
                  SplitCount(name=n["inner"], total=heads * head_dim if inner is None else inner),
                  SplitCount(name=n["groups"], total=groups, rule=SplitRule.GROUPS))
        conv = (((None, conv_kernel - 1),), ((1, 1), (2, 2 * state)))
        ssm = (((0, 1),), ((None, head_dim),), ((None, state),))
        return cls(counts=counts, dims=(conv, ssm))

    @classmethod
    def gated_delta(cls, *, key_heads: int, value_heads: int, key_dim: int, value_dim: int, conv_kernel: int,
                    names: Mapping[str, str] | None = None) -> StateSplit:
        """Gated-delta: key and value heads split (vLLM ``gated_delta_net_state_shape``)."""
        n = _names({"key_heads": "key_heads", "value_heads": "value_heads"}, names)
        counts = (SplitCount(name=n["key_heads"], total=key_heads), SplitCount(name=n["value_heads"], total=value_heads))
        conv = (((None, conv_kernel - 1),), ((0, 2 * key_dim), (1, value_dim)))
        recurrent = (((1, 1),), ((None, value_dim),), ((None, key_dim),))
        return cls(counts=counts, dims=(conv, recurrent))

    @classmethod
    def kda(cls, *, heads: int, head_dim: int, conv_kernel: int, names: Mapping[str, str] | None = None) -> StateSplit:
        """Kimi delta attention: heads split (vLLM ``kda_state_shape``)."""
        n = _names({"heads": "heads"}, names)
        conv = (((None, conv_kernel - 1),), ((0, 3 * head_dim),))
        recurrent = (((0, 1),), ((None, head_dim),), ((None, head_dim),))
        return cls(counts=(SplitCount(name=n["heads"], total=heads),), dims=(conv, recurrent))

    @classmethod
    def lightning(cls, *, heads: int, head_dim: int, names: Mapping[str, str] | None = None) -> StateSplit:
        """Lightning (linear) attention: heads split (vLLM ``linear_attention_state_shape``)."""
        n = _names({"heads": "heads"}, names)
        return cls(counts=(SplitCount(name=n["heads"], total=heads),),
                   dims=((((0, 1),), ((None, head_dim),), ((None, head_dim),)),))

    @classmethod
    def short_conv(cls, *, channels: int, conv_kernel: int, names: Mapping[str, str] | None = None) -> StateSplit:
        """Short convolution: channels split (vLLM ``short_conv_state_shape``)."""
        n = _names({"channels": "channels"}, names)
        return cls(counts=(SplitCount(name=n["channels"], total=channels),),
                   dims=((((None, conv_kernel - 1),), ((0, 1),)),))
