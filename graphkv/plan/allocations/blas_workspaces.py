"""The cuBLAS workspaces PyTorch allocates lazily, one set per CUDA stream that runs a matmul.

The first matmul on a stream makes PyTorch allocate, from the caching allocator and for as long as
the process lives, a cuBLAS workspace for that (handle, stream) and a separate cuBLASLt workspace
(``aten/src/ATen/cuda/CublasHandlePool.cpp`` as of torch 2.11, the version measured):

- cuBLAS: ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT`` pairs, SIZE in KiB: the sum of SIZE x COUNT)
  or, unset, 32 MiB on compute capability 9.0 (H100, H200) and ``:4096:2:16:8`` (8 MiB + 128 KiB)
  on every other GPU;
- cuBLASLt: ``CUBLASLT_WORKSPACE_SIZE`` KiB (default 1024: 1 MiB), capped at the cuBLAS size; it
  shares the cuBLAS workspace instead only when ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=1``. Torch 2.13
  documents that sharing as its default (``torch.backends.cuda.blas_workspace_size``): there a stream
  allocates 1 MiB less than this rule charges, so the charge stays an upper bound.

Measured on an H200 (torch 2.11): a stream's first matmuls allocated 34,603,008 B, the 32 MiB +
1 MiB of this rule. A serving process holds one set per stream it runs matmuls on: the stream eager
steps run on, and the capture stream when CUDA graphs are captured (``graphkv.capture`` warms up and
captures every key on one stream, and allocates that stream's set inside the graph pool before the
first capture, ``graphkv.runtime.capture.piecewise.prime_blas_workspaces``; the calibrations shipped
before that measured it as part of the largest key's footprint, so with them it is charged twice, an
upper bound, until they are re-measured). The caching allocator gives the 32 MiB workspace a segment of its
own and puts the 1 MiB one in a 2 MiB small segment, which other small blocks may share: the charge
here is that upper bound (34 MiB per stream on Hopper), 1 MiB per stream above what is allocated.
The ledger charges PyTorch's default settings (planning reads no environment); ``graphkv bench
memory`` predicts its measurement from the process's own (:func:`workspace_settings_from`). Pure:
no torch.
"""

from __future__ import annotations

import re
from typing import Mapping

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.plan.allocations.rounding import charge_alone
from graphkv.printable import shortened
from graphkv.spec.budget import ASSUMED_ARCH

__all__ = ["BlasWorkspaces", "WorkspaceSettings", "blas_workspaces", "cublas_workspace_bytes",
           "cublaslt_workspace_bytes", "workspace_settings_from"]

_KIB = 1024
HOPPER_CUBLAS_BYTES = 4096 * 8 * _KIB  # 32 MiB: PyTorch's default on compute capability 9.0
OTHER_CUBLAS_BYTES = 4096 * _KIB * 2 + 16 * _KIB * 8  # ":4096:2:16:8": 8 MiB + 128 KiB elsewhere
DEFAULT_CUBLASLT_KIB = 1024
_PAIR = re.compile(r":([0-9]+):([0-9]+)")


@attrs.frozen(kw_only=True)
class WorkspaceSettings:
    """The environment variables PyTorch sizes its cuBLAS workspaces from (``None``: unset)."""

    cublas_workspace_config: str | None = None  # CUBLAS_WORKSPACE_CONFIG
    cublaslt_workspace_size: str | None = None  # CUBLASLT_WORKSPACE_SIZE, in KiB
    unified: bool = False  # TORCH_CUBLASLT_UNIFIED_WORKSPACE=1: cuBLASLt uses the cuBLAS workspace

    @property
    def is_default(self) -> bool:
        """Whether every setting is PyTorch's default."""
        return self == WorkspaceSettings()


_INT_MAX = 2**31 - 1  # std::stoi's range, how PyTorch reads each number (larger ones make it throw)
_NUMBER = re.compile(r"[0-9]+")


def workspace_settings_from(environ: Mapping[str, str]) -> WorkspaceSettings:
    """The settings in ``environ`` (e.g. ``os.environ``), read as PyTorch reads them. Raises
    :class:`SpecError` naming the variable when a number in ``CUBLAS_WORKSPACE_CONFIG`` or
    ``CUBLASLT_WORKSPACE_SIZE`` is beyond the 32-bit range PyTorch reads them in (also so that no
    number of thousands of digits reaches ``int``)."""
    unified = environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE") == "1"  # what PyTorch's check_env takes as true
    for name in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE"):
        text = environ.get(name)
        if text is not None and any(len(n) > 10 or int(n) > _INT_MAX for n in _NUMBER.findall(text)):
            raise SpecError(Problem(field=name, value=shortened(text, 40),
                                    limit=f"holds a number above {_INT_MAX}: PyTorch reads each with std::stoi, a "
                                          "32-bit integer that cannot hold it, so the workspace it allocates is not "
                                          "predictable",
                                    fix=f"unset {name} or give sizes in KiB (e.g. CUBLAS_WORKSPACE_CONFIG=:4096:8, "
                                        "CUBLASLT_WORKSPACE_SIZE=1024)"))
    return WorkspaceSettings(cublas_workspace_config=environ.get("CUBLAS_WORKSPACE_CONFIG"),
                             cublaslt_workspace_size=environ.get("CUBLASLT_WORKSPACE_SIZE"), unified=unified)


def cublas_workspace_bytes(arch: str, settings: WorkspaceSettings = WorkspaceSettings()) -> int:
    """The cuBLAS workspace PyTorch allocates per stream on a GPU of compute capability ``arch``
    (``"sm_90"``): ``CUBLAS_WORKSPACE_CONFIG``'s pairs summed, or the default when it is unset or has
    no ``:SIZE:COUNT`` pair (PyTorch warns and uses the default).

    >>> cublas_workspace_bytes("sm_90"), cublas_workspace_bytes("sm_80")
    (33554432, 8519680)
    >>> cublas_workspace_bytes("sm_80", WorkspaceSettings(cublas_workspace_config=":4096:8"))
    33554432
    >>> cublas_workspace_bytes("sm_90", WorkspaceSettings(cublas_workspace_config=":0:0"))  # deterministic runs
    0
    """
    default = HOPPER_CUBLAS_BYTES if arch == "sm_90" else OTHER_CUBLAS_BYTES
    text = settings.cublas_workspace_config
    if text is None:
        return default
    pairs = _PAIR.findall(text)
    if not pairs:
        return default
    return sum(int(size) * _KIB * int(count) for size, count in pairs)


def cublaslt_workspace_bytes(arch: str, settings: WorkspaceSettings = WorkspaceSettings()) -> int:
    """The separate cuBLASLt workspace PyTorch allocates per stream: ``CUBLASLT_WORKSPACE_SIZE`` KiB
    (1024 unset or unreadable), at most the cuBLAS workspace; 0 when it shares that workspace
    (``TORCH_CUBLASLT_UNIFIED_WORKSPACE=1``).

    >>> cublaslt_workspace_bytes("sm_90"), cublaslt_workspace_bytes("sm_90", WorkspaceSettings(unified=True))
    (1048576, 0)
    >>> cublaslt_workspace_bytes("sm_90", WorkspaceSettings(cublas_workspace_config=":16:8"))  # capped at 128 KiB
    131072
    """
    if settings.unified:
        return 0
    kib = DEFAULT_CUBLASLT_KIB
    if settings.cublaslt_workspace_size is not None:  # read as std::stoi reads it: leading digits ("2048KiB": 2048)
        digits = re.match(r"\s*([+-]?[0-9]+)", settings.cublaslt_workspace_size)
        kib = int(digits.group(1)) if digits is not None else DEFAULT_CUBLASLT_KIB
    return min(max(kib, 0) * _KIB, cublas_workspace_bytes(arch, settings))


@attrs.frozen(kw_only=True)
class BlasWorkspaces:
    """The lazy cuBLAS workspaces of a plan's process: per stream ``cublas_bytes`` and
    ``cublaslt_bytes`` (allocated), on ``num_streams`` streams, for ``arch`` (``arch_assumed``: the
    plan names no GPU of a known architecture, so graphkv's target, ``sm_90``, is charged; ``gpu_name``:
    the GPU the plan named, if any)."""

    arch: str
    arch_assumed: bool
    num_streams: int
    cublas_bytes: int
    cublaslt_bytes: int
    settings: WorkspaceSettings = WorkspaceSettings()
    gpu_name: str | None = None

    @property
    def allocated_bytes_per_stream(self) -> int:
        """What ``torch.cuda.memory_allocated`` grows by at a stream's first matmuls (both used): each
        workspace's block as the caching allocator hands it out."""
        return sum(charge_alone(n).allocated_bytes for n in (self.cublas_bytes, self.cublaslt_bytes))

    @property
    def reserved_bytes_per_stream(self) -> int:
        """At most what ``torch.cuda.memory_reserved`` grows by: each workspace in a segment of its own."""
        return sum(charge_alone(n).reserved_bytes for n in (self.cublas_bytes, self.cublaslt_bytes))

    @property
    def nbytes(self) -> int:
        """The ledger's charge: every stream's workspaces at their reserved upper bound."""
        return self.num_streams * self.reserved_bytes_per_stream

    @property
    def reason(self) -> str:
        """The ledger entry's reason."""
        mib = 1 << 20
        streams = ("2 streams (eager steps, CUDA-graph capture)" if self.num_streams == 2
                   else f"{self.num_streams} stream{'' if self.num_streams == 1 else 's'}")
        if not self.arch_assumed:
            where = self.arch
        elif self.gpu_name is None:
            where = f"{self.arch}, assumed: no GPU named"
        else:
            where = f"{self.arch}, assumed: {self.gpu_name}'s architecture is not known"
        how = "PyTorch's defaults" if self.settings.is_default else "CUBLAS_WORKSPACE_CONFIG / CUBLASLT_WORKSPACE_SIZE"
        return (f"cuBLAS {self.cublas_bytes / mib:g} MiB + cuBLASLt {self.cublaslt_bytes / mib:g} MiB allocated per "
                f"stream at its first matmul ({how} on {where}) x {streams}, "
                f"{self.reserved_bytes_per_stream / mib:g} MiB reserved each")


def blas_workspaces(arch: str | None, *, num_streams: int, settings: WorkspaceSettings = WorkspaceSettings(),
                    gpu_name: str | None = None) -> BlasWorkspaces:
    """The lazy cuBLAS workspaces of ``num_streams`` streams on a GPU of compute capability ``arch``
    (``None``: unknown, charged as ``sm_90``, the largest default; ``gpu_name``: the GPU named, for the
    reason).

    >>> w = blas_workspaces("sm_90", num_streams=2)
    >>> (w.allocated_bytes_per_stream, w.reserved_bytes_per_stream, w.nbytes)  # 33 MiB, 34 MiB, 2 x 34 MiB
    (34603008, 35651584, 71303168)
    """
    assert num_streams >= 0, num_streams
    chosen = arch if arch is not None else ASSUMED_ARCH
    return BlasWorkspaces(arch=chosen, arch_assumed=arch is None, num_streams=num_streams,
                          cublas_bytes=cublas_workspace_bytes(chosen, settings),
                          cublaslt_bytes=cublaslt_workspace_bytes(chosen, settings), settings=settings,
                          gpu_name=gpu_name)
