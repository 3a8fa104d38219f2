"""Step 2: the kernel block size of a group — the page size its attention kernels address."""

from __future__ import annotations

import math
from typing import Sequence

from graphkv.errors import PlanError, Problem
from graphkv.spec.backends import Backend, MultipleOf

__all__ = ["choose_kernel_block_size"]

_INT32_MAX = 2**31 - 1  # the largest block size: token positions and lengths live in int32 buffers


def choose_kernel_block_size(block_size: int, backends: Sequence[Backend], *, group: str = "group") -> int:
    """``block_size`` itself if every backend supports it, else the largest size that every
    backend supports and that divides ``block_size``.

    State backends address whole pages (``bpk == 1``). Raises :class:`PlanError` naming the
    backends and their sizes when nothing fits.

    >>> from graphkv.spec.backends import get_backend
    >>> choose_kernel_block_size(64, [get_backend("flashinfer")])
    64
    """
    backends = list(dict.fromkeys(backends))  # one entry per backend (descriptors, not names: one name can run
    # with other kernel blocks on another GPU or head size), in first-seen order
    if all(b.is_ssm for b in backends) or all(b.supports(block_size) for b in backends):
        return block_size
    candidates: set[int] = set()
    for backend in backends:
        for size in backend.supported_kernel_block_sizes:
            if isinstance(size, MultipleOf):  # the multiples of n dividing block_size: n x the divisors of block_size / n
                if block_size % size.n == 0:
                    candidates.update(size.n * k for k in _divisors(block_size // size.n))
            elif block_size % size == 0:
                candidates.add(size)
    fitting = [c for c in candidates if all(b.supports(c) for b in backends)]
    if fitting:
        return max(fitting)
    sizes = ", ".join(f"{b.name} {b.describe_sizes()}" for b in backends)  # a 32-layer group names each once
    larger = next((k * block_size for k in range(2, 257) if k * block_size <= _INT32_MAX  # positions are int32
                   and all(b.supports(k * block_size) for b in backends)), None)
    common = next((c for c in (16, 32, 64, 128, 256) if all(b.supports(c) for b in backends)), None)
    fix = (f"set block_size={larger} (every backend of the group takes it; vLLM needs --block-size {larger} too)"
           if larger is not None else "choose a block_size that is a multiple of a size every backend supports"
           + (f" (e.g. {common})" if common is not None else ""))
    raise PlanError(Problem(
        field="block_size", value=block_size,
        limit=f"{group}: no kernel block size is supported by all of {sizes} and divides {block_size}",
        fix=f"{fix}, or use one backend for the group"))


def _divisors(n: int) -> list[int]:
    """Every divisor of ``n >= 1``, by trial division up to its square root (46,341 tries at 2**31, where a scan of
    the multiples of 16 up to it took 134 million)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]
