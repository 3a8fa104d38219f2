"""Timing shared by the runtime benchmarks: contenders interleaved, their medians compared."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable, Mapping

__all__ = ["interleaved_medians"]


def interleaved_medians(steps: Mapping[str, Callable[[], None]], repeats: int,
                        after_round: Callable[[int], None] | None = None) -> dict[str, float]:
    """Median seconds of each of ``steps`` over ``repeats`` rounds. In every round each contender runs
    once, in an order that rotates from round to round (drift and cache state hit all alike), with the
    garbage collector off while they run (as in ``timeit``: a collection started by one contender's
    garbage is noise). ``after_round(i)`` runs untimed after round ``i`` (a reset, a check); round 0
    only warms up."""
    names = list(steps)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats + 1):
        k = i % len(names)
        gc.disable()
        try:
            for name in names[k:] + names[:k]:
                start = time.perf_counter()
                steps[name]()
                if i:
                    samples[name].append(time.perf_counter() - start)
        finally:
            gc.enable()
        if after_round is not None:
            after_round(i)
    return {name: statistics.median(s) for name, s in samples.items()}
