"""``--compile NAME``: the graphkv.hf compile mode each flag name selects (torch-free: the CLI parses with it).

The modes are :class:`~graphkv.hf.PagedModel`'s ``compile``: ``True`` (each attention group's flex
attention compiled), ``False`` (nothing), ``"model"`` (the whole forward by Inductor),
``"piecewise"`` (split at the attention and state-mixer ops, pieces as traced) and ``"fused"``
(split the same way, each piece compiled by Inductor); ``None`` picks :func:`gpu_default_compile` on a GPU
(:data:`GPU_DEFAULT_COMPILE`, or the mode named by ``$GRAPHKV_GPU_COMPILE``) and ``False`` on a CPU.
:func:`graph_mode_for` is the CUDA-graph mode a plan for a mode asks for.
"""

from __future__ import annotations

import os
from types import MappingProxyType
from typing import Mapping

from graphkv.errors import Problem, SpecError
from graphkv.spec.limits import CudaGraphMode

__all__ = ["COMPILE_BY_NAME", "COMPILE_MODES", "GPU_COMPILE_ENV", "GPU_DEFAULT_COMPILE", "PIECEWISE_MODES",
           "check_compile", "check_hf_only_flags", "default_compile", "gpu_default_compile", "graph_mode_for"]

COMPILE_BY_NAME: Mapping[str, bool | str | None] = MappingProxyType(
    {"auto": None, "attention": True, "model": "model", "piecewise": "piecewise", "fused": "fused", "none": False})
"""The ``--compile NAME`` flags of ``graphkv demo --hf`` and the benchmarks: the ``compile`` each selects."""

COMPILE_MODES = (True, False, "model", "piecewise", "fused")
"""``compile`` values besides ``None`` (which picks :func:`default_compile` of the device)."""

GPU_DEFAULT_COMPILE: bool | str = True
"""The compile mode ``compile=None`` picks on a GPU: each attention group's flex attention compiled (the mode
measured on an H100). ``"fused"`` replaces it once it has run there (issue 20)."""

GPU_COMPILE_ENV = "GRAPHKV_GPU_COMPILE"
"""The environment variable that replaces :data:`GPU_DEFAULT_COMPILE` for a process: a ``--compile`` name
(``attention``, ``model``, ``piecewise``, ``fused`` or ``none``), e.g. to run the GPU suite under ``fused``."""

PIECEWISE_MODES = frozenset({"piecewise", "fused"})
"""Modes whose forward is split at the attention and state-mixer ops, so mixed steps are captured piece by piece."""


def gpu_default_compile(environ: Mapping[str, str] | None = None) -> bool | str:
    """The compile mode ``compile=None`` means on a GPU: the ``--compile`` name in ``$GRAPHKV_GPU_COMPILE``
    (:data:`GPU_COMPILE_ENV`; ``environ`` defaults to ``os.environ``) when set, else :data:`GPU_DEFAULT_COMPILE`.
    Raises :class:`SpecError` naming the variable for a name that is no mode.

    >>> gpu_default_compile({"GRAPHKV_GPU_COMPILE": "fused"}), gpu_default_compile({})
    ('fused', True)
    """
    name = (os.environ if environ is None else environ).get(GPU_COMPILE_ENV, "")
    if not name:
        return GPU_DEFAULT_COMPILE
    names = [n for n in COMPILE_BY_NAME if n != "auto"]
    if name not in names:
        raise SpecError(Problem(field=f"${GPU_COMPILE_ENV}", value=name, limit=f"must be one of {', '.join(names)}",
                                fix=f"set {GPU_COMPILE_ENV}=fused (say), or unset it for the default"))
    mode = COMPILE_BY_NAME[name]
    assert mode is not None  # "auto" is excluded above
    return mode


def default_compile(device_type: str) -> bool | str:
    """The compile mode ``compile=None`` means on a device of ``device_type`` (``"cuda"``: :func:`gpu_default_compile`;
    anything else: ``False``)."""
    return gpu_default_compile() if device_type == "cuda" else False


def check_compile(compile: object) -> bool | str | None:  # noqa: A002 - the torch verb
    """``compile`` if it is ``None`` or one of :data:`COMPILE_MODES`; else :class:`SpecError` naming it and
    what each mode does."""
    if compile is None or (isinstance(compile, (bool, str)) and compile in COMPILE_MODES):
        return compile
    raise SpecError(Problem(field="compile", value=compile,
                            limit="must be True, False, None, 'model', 'piecewise' or 'fused'",
                            fix="True compiles each layer's attention, 'model' the whole forward, 'piecewise' splits "
                                "it at attention and state mixers so mixed steps are captured piece by piece, "
                                "'fused' also compiles each piece with Inductor, None picks the device's default"))


def graph_mode_for(compile: bool | str | None, device_type: str | None = None) -> CudaGraphMode:  # noqa: A002
    """The CUDA-graph mode a plan served under ``compile`` asks for: ``FULL_AND_PIECEWISE`` for a split forward
    (``"piecewise"``, ``"fused"``: mixed steps captured piece by piece), ``FULL_DECODE_ONLY`` otherwise (mixed
    steps run eagerly). ``None`` is read as :func:`default_compile` of ``device_type`` (the device the model
    runs on, so that the plan and the model agree), or as the GPU default (:func:`gpu_default_compile`) when no
    device is given; a CPU captures nothing either way.

    >>> graph_mode_for("fused").value, graph_mode_for(True).value, graph_mode_for(None, "cpu").value
    ('FULL_AND_PIECEWISE', 'FULL_DECODE_ONLY', 'FULL_DECODE_ONLY')
    """
    if check_compile(compile) is None:
        compile = gpu_default_compile() if device_type is None else default_compile(device_type)
    return CudaGraphMode.FULL_AND_PIECEWISE if compile in PIECEWISE_MODES else CudaGraphMode.FULL_DECODE_ONLY


def check_hf_only_flags(*, hf: str | None, compile_name: str, trace_layers: bool) -> None:  # noqa: A002
    """``graphkv demo``'s flags that apply to graphkv.hf models only (``--compile``, ``--trace-layers``): refused
    without ``--hf``, naming the flag and the fix. Host only (argument checks)."""
    if hf is not None:
        return
    for flag, value in (("--compile", compile_name if compile_name != "auto" else None),
                        ("--trace-layers", True if trace_layers else None)):
        if value is not None:
            raise SpecError(Problem(field=flag, value=value, limit="applies to graphkv.hf models (--hf) only",
                                    fix=f"add --hf MODEL_TYPE, or drop {flag} (the tiny hybrid demo compiles its own "
                                        "attention)"))
