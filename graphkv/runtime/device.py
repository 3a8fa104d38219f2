"""The device a runtime object lives on, checked once where it is built.

``torch.device("gpu")`` raises a bare ``RuntimeError``, and a CUDA device on a machine without
one fails only at the first allocation, deep inside torch. :func:`resolve_device` turns both
into a :class:`~graphkv.errors.SpecError` that names the argument, the value, why it cannot be
used and what to pass instead.
"""

from __future__ import annotations

import torch

from graphkv.errors import Problem, SpecError

__all__ = ["resolve_device"]

_SUPPORTED = ("cpu", "cuda")


def resolve_device(device: object, field: str = "device") -> torch.device:
    """``device`` (a string such as ``"cuda:0"``, a ``torch.device`` or a CUDA index) as a
    ``torch.device`` the runtime can use: a CPU, or a CUDA device that exists. Raises
    :class:`SpecError` naming ``field`` otherwise. Host-only; no tensor is allocated."""
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise SpecError(Problem(field=field, value=device, limit="must be a device string, torch.device or CUDA index",
                                fix="pass 'cpu' or 'cuda' (or 'cuda:N')"))
    if isinstance(device, int) and device < 0:
        raise SpecError(Problem(field=field, value=device, limit="a CUDA index must be >= 0",
                                fix="pass 'cpu' or 'cuda' (or 'cuda:N')"))
    try:  # an index names a CUDA device (torch.device(0) asks for an accelerator a CPU build has not got)
        resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise SpecError(Problem(field=field, value=device, limit="is not a device torch knows",
                                fix="pass 'cpu' or 'cuda' (or 'cuda:N')")) from None
    if resolved.type not in _SUPPORTED:
        raise SpecError(Problem(field=field, value=str(resolved),
                                limit=f"graphkv's runtime runs on {' or '.join(_SUPPORTED)} devices",
                                fix="pass 'cpu' or 'cuda'"))
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecError(Problem(field=field, value=str(resolved),
                                    limit="CUDA is not available here (torch.cuda.is_available() is False: a CPU "
                                          "build of torch, or no GPU visible)",
                                    fix="pass device='cpu' (everything runs eagerly there), or run on a machine "
                                        "with a GPU and a CUDA build of torch"))
        count = torch.cuda.device_count()
        if resolved.index is not None and not 0 <= resolved.index < count:
            raise SpecError(Problem(field=field, value=str(resolved), limit=f"this machine has {count} CUDA device(s)",
                                    fix=f"pass a device index in 0..{count - 1}"))
    return resolved
