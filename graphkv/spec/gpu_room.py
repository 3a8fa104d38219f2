"""What to change when weights, activations and the graph reserve leave nothing of a GPU.

Shared by :meth:`Budget.for_gpu <graphkv.spec.budget.Budget.for_gpu>` (which names its fields) and
``graphkv plan --gpu`` (which names the flags typed): :class:`RoomWords` says which. Every fix is
computed from the real limit, so that applying it works: more tensor parallelism only at sizes that
split every head count of the model (never a size the model refuses, never beyond
:data:`~graphkv.spec.split_rules.MAX_TP_TRIED`; only where a model is known), a utilization that
leaves room (never above 1), a known GPU that holds it; each leaves room for the smallest KV pool.
The error names the input that moved the limit: the activations or the graph reserve when they
alone take the GPU (every rank holds them whole, so no tensor parallelism helps), the utilization
when it was lowered below what fits at the default, else the GPU (``RoomWords.too_small``).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import attrs

from graphkv.errors import Problem
from graphkv.spec.budget import GPU, KNOWN_GPUS, format_bytes

__all__ = ["API_WORDS", "FLAG_WORDS", "GpuRoom", "RoomWords", "does_not_fit"]


@attrs.frozen(kw_only=True)
class RoomWords:
    """How an error names a room's inputs: the flags typed (``graphkv plan``) or Budget's fields."""

    gpu: str
    utilization: str
    weights: str
    activations: str
    reserve: str
    tp: str  # the tensor-parallel size (advised only where a model says which sizes split it)
    too_small: str  # the input named when the weights leave nothing: "gpu" or "weights" (a key of ``typed``)


FLAG_WORDS = RoomWords(gpu="--gpu", utilization="--utilization", weights="--weights-memory",
                       activations="--activation-memory", reserve="--graph-reserve", tp="--tp", too_small="gpu")
API_WORDS = RoomWords(gpu="gpu", utilization="utilization", weights="weights_bytes", activations="activation_bytes",
                      reserve="graph_reserve_bytes", tp="tensor parallelism", too_small="weights")


@attrs.frozen(kw_only=True)
class GpuRoom:
    """One rank's memory on a GPU: what it holds beside the KV pool, and what was typed."""

    gpu: GPU
    utilization: float
    weights_bytes: int  # per rank
    activation_bytes: int
    graph_reserve_bytes: int
    min_pool_bytes: int  # the smallest KV pool that plans (the null page and one more; 0 where no model is known)
    default_utilization: float
    # as typed, by key gpu, utilization, activations, reserve, weights (None: not given)
    typed: Mapping[str, object]

    @property
    def whole_bytes(self) -> int:
        """What every rank holds whole, however many ranks share the weights."""
        return self.activation_bytes + self.graph_reserve_bytes

    @property
    def need_bytes(self) -> int:
        """Everything beside the KV pool, and the smallest pool: what a fix must leave room for."""
        return self.weights_bytes + self.whole_bytes + self.min_pool_bytes

    def usable_bytes(self, gpu: GPU | None = None, utilization: float | None = None) -> int:
        """``total x utilization`` of ``gpu`` (default: this room's), as the budget computes it."""
        gpu = self.gpu if gpu is None else gpu
        return int(gpu.total_memory_bytes * (self.utilization if utilization is None else utilization))


def _choices(values: Sequence[object]) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _utilization_for(room: GpuRoom, need_bytes: int) -> float | None:
    """The smallest utilization, in hundredths, at which the GPU leaves room beyond ``need_bytes`` (None: not
    even 1)."""
    for hundredths in range(max(1, need_bytes * 100 // room.gpu.total_memory_bytes), 101):
        if room.usable_bytes(utilization=hundredths / 100) > need_bytes:
            return hundredths / 100
    return None


def _larger_gpus(room: GpuRoom) -> list[str]:
    return [g.name for g in sorted(KNOWN_GPUS.values(), key=lambda g: g.total_memory_bytes)
            if g.total_memory_bytes > room.gpu.total_memory_bytes and room.usable_bytes(g) > room.need_bytes]


def _whole_fixes(room: GpuRoom, least_weights: int, words: RoomWords) -> list[str]:
    """Lower the activations or the reserve to what leaves room for the weights at the most ranks that split."""
    fixes = []
    for name, n in ((words.activations, room.activation_bytes), (words.reserve, room.graph_reserve_bytes)):
        most = room.usable_bytes() - least_weights - (room.whole_bytes - n) - room.min_pool_bytes - 1
        if n and most > 0:
            fixes.append(f"lower {name} to <= {format_bytes(most, rounding='down')}")
    return fixes


def does_not_fit(room: GpuRoom, *, weights_from: str, tp: int = 1, pp: int = 1,
                 per_rank: Callable[[int], int] | None = None,
                 tp_sizes: Callable[[], Sequence[int]] = tuple, words: RoomWords = FLAG_WORDS) -> Problem:
    """The problem of a ``room`` whose weights, activations and graph reserve leave nothing for the KV pool.

    ``per_rank(n)``: the checkpoint's weight bytes on one of ``n`` ranks (``None`` when the weights do not
    split: typed, or unknown); ``tp_sizes()``: the tensor-parallel sizes that split every head count (called
    only when more ranks could help); ``words``: how the inputs are named.
    """
    usable, gpu = room.usable_bytes(), room.gpu
    of = f"{format_bytes(usable)} ({gpu.name} x utilization {room.utilization})"
    sizes = tp_sizes() if per_rank is not None and room.weights_bytes else ()
    fixes: list[str] = []
    # no tensor / pipeline parallelism helps: the activations or the reserve take it all (when there are any: a
    # utilization that leaves 0 B is the utilization's doing)
    if room.whole_bytes and room.whole_bytes >= usable:
        least = min((per_rank(t * pp) for t in sizes), default=room.weights_bytes) if per_rank else room.weights_bytes
        fixes += _whole_fixes(room, least, words)
        key = "activations" if room.activation_bytes >= room.graph_reserve_bytes else "reserve"
        field, value = getattr(words, key), room.typed[key]
        taken = [f"activations {format_bytes(room.activation_bytes)}"] * bool(room.activation_bytes) + \
            [f"graph reserve {format_bytes(room.graph_reserve_bytes)}"] * bool(room.graph_reserve_bytes)
        limit = (f"{' + '.join(taken)} take all of {of} before the weights ({format_bytes(room.weights_bytes)} per "
                 f"rank, {weights_from}); every rank holds them whole, so no {words.tp} helps")
    else:
        more = [t for t in sizes if per_rank is not None and t > tp
                and per_rank(t * pp) + room.whole_bytes + room.min_pool_bytes < usable]
        if more:
            fixes.append(f"use {words.tp} {_choices(more)}")
        typed_util = room.typed["utilization"]
        lowered = typed_util is not None and room.usable_bytes(utilization=room.default_utilization) > room.need_bytes
        key = "utilization" if lowered else words.too_small
        field, value = getattr(words, key), room.typed[key]
        limit = (f"weights {format_bytes(room.weights_bytes)} per rank ({weights_from}) + activations "
                 f"{format_bytes(room.activation_bytes)} + graph reserve {format_bytes(room.graph_reserve_bytes)} "
                 f"leave nothing of {of}")
    gpus = _larger_gpus(room)
    if gpus:
        fixes.append(f"use {words.gpu} {_choices(gpus)}")
    utilization = _utilization_for(room, room.need_bytes)
    if utilization is not None:
        fixes.append(f"raise {words.utilization} to >= {utilization:.2f}")
    if not fixes and per_rank is not None:  # nothing alone: the fewest ranks at which some utilization fits
        for t in (t for t in sizes if t > tp):
            utilization = _utilization_for(room, per_rank(t * pp) + room.whole_bytes + room.min_pool_bytes)
            if utilization is not None:
                fixes.append(f"use {words.tp} {t} and raise {words.utilization} to >= {utilization:.2f}")
                break
    most_weights = usable - room.whole_bytes - room.min_pool_bytes - 1
    if room.typed["weights"] is not None and most_weights > 0:
        fixes.append(f"lower {words.weights} to <= {format_bytes(most_weights, rounding='down')} (quantized weights)")
    elif room.weights_bytes and room.whole_bytes < usable:
        fixes.append(f"use quantized weights ({words.weights} SIZE)")
    if not fixes:
        fixes.append("use a GPU with more memory")
    return Problem(field=field, value=value, limit=limit, fix=", or ".join(fixes))
