"""Step 2: the kernel block size of a group — the page size its attention kernels address."""

from __future__ import annotations

from typing import Sequence

from graphkv.errors import PlanError, Problem
from graphkv.spec.backends import Backend, MultipleOf

__all__ = ["choose_kernel_block_size"]


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
            if isinstance(size, MultipleOf):
                candidates.update(d for d in range(size.n, block_size + 1, size.n) if block_size % d == 0)
            elif block_size % size == 0:
                candidates.add(size)
    fitting = [c for c in candidates if all(b.supports(c) for b in backends)]
    if fitting:
        return max(fitting)
    sizes = ", ".join(f"{b.name} {b.describe_sizes()}" for b in backends)  # a 32-layer group names each once
    larger = next((k * block_size for k in range(2, 257) if all(b.supports(k * block_size) for b in backends)), None)
    fix = (f"set block_size={larger} (every backend of the group takes it; vLLM needs --block-size {larger} too)"
           if larger is not None else "choose a block_size that is a multiple of a size every backend supports")
    raise PlanError(Problem(
        field="block_size", value=block_size,
        limit=f"{group}: no kernel block size is supported by all of {sizes} and divides {block_size}",
        fix=f"{fix}, or use one backend for the group"))
