"""How much memory a device has free for a pool, and where that number comes from."""

from __future__ import annotations

import os
from typing import Any

from graphkv.errors import Problem, SpecError
from graphkv.plan.allocations.entries import check_device_kind
from graphkv.spec.budget import format_bytes

__all__ = ["available_bytes", "check_pool_fits", "cuda_arch"]


def cuda_arch(device: Any) -> str:
    """The compute capability of CUDA ``device`` as graphkv names it (``"sm_90"``)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def available_bytes(device: Any) -> tuple[int, str]:
    """``(bytes, source)``: free memory of a CUDA device (``torch.cuda.mem_get_info``), else the
    machine's ``MemAvailable`` (``/proc/meminfo``), else its physical memory. ``device`` is a
    ``torch.device`` or a device string (``"cuda"``, ``"cuda:1"``, ``"cpu"``)."""
    if check_device_kind(device) == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free), f"free memory of {torch.cuda.get_device_name(device)}"
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable of this machine (/proc/meminfo)"
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory of this machine"


def check_pool_fits(plan: Any, device: Any, *, field: str, value: str, fix: str = "") -> None:
    """Refuse, before anything is allocated, a plan whose pool and step buffers need more than the
    device has available: a :class:`SpecError` naming ``field`` (the flag that sized the pool, e.g.
    ``--kv-memory``) and ``value`` (as typed), what is needed and available, and ``fix`` after the
    advice to lower it (below what is available: the static buffers grow with the pool, so ``fix``
    may add an example, ", e.g. 2MiB"). ``device`` is a ``torch.device`` or a device string."""
    kind = check_device_kind(device)
    need = plan.ledger.runtime_bytes(kind).device_bytes
    have, where = available_bytes(device)
    if need > have:
        raise SpecError(Problem(
            field=field, value=value,
            limit=(f"the pool ({format_bytes(plan.pool_bytes)}) and static buffers need {format_bytes(need)} on {device} "
                   f"but only {format_bytes(have)} is available ({where})"),
            fix=f"lower {field} to below {format_bytes(have, rounding='down')}{fix}"))
