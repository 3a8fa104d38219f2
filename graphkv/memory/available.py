"""How much memory a device has free for a pool, and where that number comes from."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["available_bytes"]


def available_bytes(device: Any) -> tuple[int, str]:
    """``(bytes, source)``: free memory of a CUDA device (``torch.cuda.mem_get_info``), else the
    machine's ``MemAvailable`` (``/proc/meminfo``), else its physical memory. ``device`` is a
    ``torch.device`` or a device string (``"cuda"``, ``"cuda:1"``, ``"cpu"``)."""
    if str(device).startswith("cuda"):
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
