"""The ``--device`` flag of the commands that run the runtime (``demo``, ``bench memory``)."""

from __future__ import annotations

from graphkv.errors import Problem, SpecError

__all__ = ["DEVICE_CHOICES", "device_from_flag"]

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def device_from_flag(asked: str, cuda_available: bool, *, field: str = "--device") -> str:
    """``"cpu"`` or ``"cuda"`` for the flag's value (``auto``: CUDA when available). A value outside
    :data:`DEVICE_CHOICES`, or ``cuda`` without CUDA, is a one-line :class:`SpecError` naming ``field``.
    Takes ``torch.cuda.is_available()`` as an argument so parsing stays torch-free."""
    if asked not in DEVICE_CHOICES:
        raise SpecError(Problem(field=field, value=asked, limit="must be auto, cpu or cuda",
                                fix="pick one of auto / cpu / cuda"))
    if asked == "auto":
        return "cuda" if cuda_available else "cpu"
    if asked == "cuda" and not cuda_available:
        raise SpecError(Problem(field=field, value=asked,
                                limit="torch.cuda.is_available() is False (a CPU build of torch, or no GPU visible)",
                                fix=f"use {field} cpu (or auto), or run on a machine with a CUDA GPU"))
    return asked
