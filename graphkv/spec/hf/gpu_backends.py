"""Which backends vLLM 0.33 picks on each GPU architecture graphkv plans for, when none is named.

vLLM chooses a layer's attention backend at start-up from the GPU's compute capability (``CudaPlatform``'s priority
lists, each candidate's ``supports_compute_capability`` and kv-cache dtypes; source read at commit 4ba787ec9), and the
backend decides the kernel block sizes a page must split into and how much of a step a CUDA graph may hold. A plan
made for the wrong architecture has the wrong pages. graphkv knows three (:data:`~graphkv.spec.budget.KNOWN_GPUS`):

- ``sm_90`` (H100, H200), the architecture assumed when no GPU is named (:data:`~graphkv.spec.budget.ASSUMED_ARCH`);
- ``sm_80`` (A100) and ``sm_89`` (L40S, RTX 4090), where FlashAttention runs version 2 (CUDA graphs of uniform
  batches only, no fp8 cache, heads up to 256), neither FlashAttention's nor FlashMLA's MLA kernels run (they need
  Hopper), and Qwen's gated-delta prefill runs Triton, not FlashInfer.

:func:`resolve_gpu_arch` reads the ``gpu`` argument, :func:`mla_backend` gives the MLA layers' backend,
:func:`exports_gdn_checkpoints` says whether gated-delta layers export prefill checkpoints; non-MLA attention is
:mod:`graphkv.spec.hf.gpu_attention`'s. A named backend vLLM would refuse there (its kernels need another GPU, or do
not read the cache's dtype) records a problem, as vLLM refuses to start.
"""

from __future__ import annotations

from typing import Any

from graphkv.spec.budget import ASSUMED_ARCH, GPU, KNOWN_GPUS, arch_of
from graphkv.spec.dtypes import DType
from graphkv.spec.hf._reader import ConfigReader

__all__ = ["FP8", "HOPPER", "PLANNED_ARCHS", "exports_gdn_checkpoints", "mla_backend", "resolve_gpu_arch"]

HOPPER = "sm_90"
PLANNED_ARCHS = ("sm_80", "sm_89", HOPPER)
"""The architectures whose backend choices graphkv follows (those of its known GPUs)."""
FP8 = (DType.FLOAT8_E4M3, DType.FLOAT8_E5M2)


def resolve_gpu_arch(cfg: ConfigReader, gpu: Any) -> str:
    """The compute capability (``"sm_80"``) of ``gpu``: a :class:`~graphkv.spec.budget.GPU`, a known GPU's name (any
    case) or one of :data:`PLANNED_ARCHS` itself; ``ASSUMED_ARCH`` (an H100's) for ``None``. Anything else records a
    problem on ``gpu`` and plans for ``ASSUMED_ARCH``."""
    if gpu is None:
        return ASSUMED_ARCH
    if isinstance(gpu, str) and gpu.strip().lower() in PLANNED_ARCHS:
        return gpu.strip().lower()
    arch = arch_of(gpu) if isinstance(gpu, (GPU, str)) else None
    arch = arch.strip().lower() if isinstance(arch, str) else None
    if arch in PLANNED_ARCHS:
        return arch
    known = ", ".join(g.name for g in KNOWN_GPUS.values())
    shown = gpu.name if isinstance(gpu, GPU) else gpu
    why = (f"has architecture {gpu.arch!r}, not one graphkv plans for ({', '.join(PLANNED_ARCHS)})"
           if isinstance(gpu, GPU) else "is not a known GPU")
    cfg.argument_problem("gpu", shown, f"{why}; known: {known}",
                         f"name one of those or an architecture ({', '.join(PLANNED_ARCHS)}; --arch on the command "
                         f"line): the plan takes the backends vLLM picks there; unset, an H100's ({ASSUMED_ARCH})")
    return ASSUMED_ARCH


_HOPPER_ONLY = {"flash_attn_mla": "FlashAttention 3's MLA kernels", "flashmla": "FlashMLA"}
"""MLA backends whose kernels need an sm_90 GPU (vLLM 0.33 ``supports_compute_capability``), with what they run."""
_MLA_READS = {
    "flash_attn_mla": (DType.BFLOAT16, DType.FLOAT16),
    "flashmla": (DType.BFLOAT16, DType.FLOAT16, DType.FLOAT8_E4M3, DType.FLOAT32),
    "triton_mla": (DType.BFLOAT16, DType.FLOAT16, DType.FLOAT8_E4M3, DType.FLOAT32),
}
"""The cache dtypes each MLA backend reads (vLLM 0.33 ``supported_kv_cache_dtypes``; no MLA backend there reads
e5m2). float32 is graphkv's: vLLM runs no MLA model in float32, graphkv.hf does, on these backends' pages."""


def mla_backend(cfg: ConfigReader, arch: str, named: str, dtype: DType, *, indexed: bool, gpu: str,
                gpu_value: Any = None) -> str:
    """The MLA layers' backend on ``arch`` for a ``dtype`` cache (``indexed``: sparse MLA with an indexer,
    DeepSeek-V3.2 / GLM-5): ``named``, else (``"auto"``) the one vLLM 0.33 picks there (``CudaPlatform``'s MLA
    priorities, commit 4ba787ec9):

    - ``sm_90``: ``flashmla`` (64-token kernel blocks) for indexed MLA, whose Hopper backends take 64-token blocks,
      and for an fp8 cache, which FlashAttention's MLA kernels do not read; ``triton_mla`` for float32; else (bf16 /
      fp16) ``flash_attn_mla`` (16-token blocks), the first of vLLM's priorities;
    - ``sm_80`` / ``sm_89``: ``triton_mla`` (16-token blocks), the one MLA backend vLLM runs below Hopper.

    Recorded as problems, as vLLM refuses to start: indexed MLA below Hopper (its sparse kernels need sm_90), an
    e5m2 cache (no MLA backend reads it), an fp8 cache on Triton MLA below sm_89, a named backend that needs Hopper
    or does not read the cache. ``gpu`` names the GPU in messages (``Options.gpu_label``), ``gpu_value`` is what the
    user gave (the value of a problem on ``gpu``)."""
    if indexed and arch != HOPPER:
        cfg.argument_problem("gpu", gpu_value if gpu_value is not None else arch, "indexed (sparse) MLA runs on vLLM "
                             "0.33's FlashMLA / FlashAttention sparse kernels, which need an sm_90 GPU, and the plan "
                             f"is for {gpu}: this model has no backend below Hopper",
                             "plan for an H100 or H200 (--gpu H100 or --arch sm_90)")
        return "flashmla"
    backend = named if named != "auto" else _default_mla(arch, dtype, indexed)
    if named != "auto" and arch != HOPPER and backend in _HOPPER_ONLY:
        cfg.argument_problem("attention_backend", named, f"runs {_HOPPER_ONLY[backend]}, which need an sm_90 GPU, but "
                             f"the plan is for {gpu}", "use triton_mla there (vLLM 0.33's MLA backend below Hopper), "
                             "or plan for an H100 / H200")
    elif backend in _MLA_READS and dtype not in _MLA_READS[backend]:
        reads = ", ".join(d.value for d in _MLA_READS[backend])
        cfg.argument_problem("kv_cache_dtype", dtype.value, f"the MLA layers run {backend}, which reads {reads}"
                             + (" (no vLLM 0.33 MLA backend reads fp8_e5m2)" if dtype is DType.FLOAT8_E5M2 else ""),
                             "use kv_cache_dtype='fp8' (e4m3) or 'bfloat16'")
    elif backend == "triton_mla" and dtype in FP8 and arch == "sm_80":
        cfg.argument_problem("kv_cache_dtype", dtype.value, "vLLM 0.33's Triton MLA reads an fp8 cache from sm_89 on, "
                             f"and the plan is for {gpu} (sm_80), where it is the only MLA backend",
                             "use kv_cache_dtype='bfloat16' on an A100, or plan for an L40S / H100")
    return backend


def _default_mla(arch: str, dtype: DType, indexed: bool) -> str:
    if arch != HOPPER:
        return "triton_mla"
    if indexed or dtype in FP8:
        return "flashmla"
    return "triton_mla" if dtype is DType.FLOAT32 else "flash_attn_mla"


def exports_gdn_checkpoints(arch: str) -> bool:
    """Whether Qwen's gated-delta layers export prefill checkpoints in ``mamba_cache_mode="align"`` on ``arch``: vLLM
    0.33 runs their prefill with FlashInfer's GDN kernel on sm_90 always (``_resolve_gdn_prefill_backend``), and with
    Triton, which exports none, on sm_80 / sm_89."""
    return arch == HOPPER
