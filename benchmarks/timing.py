"""Timing shared by the runtime benchmarks: contenders interleaved, their medians compared; common options."""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch

__all__ = ["add_common_arguments", "interleaved_medians", "set_up"]


def interleaved_medians(steps: Mapping[str, Callable[[], None]], repeats: int,
                        after_round: Callable[[int], None] | None = None, *, seed: int = 0) -> dict[str, float]:
    """Median seconds of each of ``steps`` over ``repeats`` rounds. In every round each contender runs
    once, in a fresh random order (seeded by ``seed``, so a run is reproducible): drift hits all alike,
    and each contender follows each other one about equally often. (A fixed order that only rotates
    gives every contender the same predecessor in most rounds, so one contender always ran in the
    caches another had just filled with unrelated work.) The garbage collector is off while they run
    (as in ``timeit``: a collection started by one contender's garbage is noise). ``after_round(i)``
    runs untimed after round ``i`` (a reset, a check); round 0 only warms up."""
    names = list(steps)
    order = random.Random(seed)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats + 1):
        order.shuffle(names)
        gc.disable()
        try:
            for name in names:
                start = time.perf_counter()
                steps[name]()
                if i:
                    samples[name].append(time.perf_counter() - start)
        finally:
            gc.enable()
        if after_round is not None:
            after_round(i)
    return {name: statistics.median(s) for name, s in samples.items()}


def add_common_arguments(parser: argparse.ArgumentParser, *, repeats: int, out: Path, gpu: str) -> None:
    """The options every runtime benchmark takes: ``--repeats``, ``--threads`` (torch threads, 1 by
    default), ``--gpu`` (``gpu`` says what it adds) and ``--out`` (the JSON path)."""
    parser.add_argument("--repeats", type=int, default=repeats, help="interleaved samples per cell (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--gpu", action="store_true", help=gpu)
    parser.add_argument("--out", type=Path, default=out, help="JSON output path (default: %(default)s)")


def set_up(args: argparse.Namespace) -> str:
    """Pin torch's threads to ``args.threads``; return what the numbers were measured with."""
    torch.set_num_threads(args.threads)
    return (f"Python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
            f"{platform.machine()}, torch threads {torch.get_num_threads()}; median of {args.repeats} interleaved "
            "samples, gc off while timing")
