"""Which backends vLLM 0.33 picks on each GPU architecture graphkv plans for, when none is named.

vLLM chooses a layer's attention backend at start-up from the GPU's compute capability (``CudaPlatform``'s priority
lists, each candidate's ``supports_compute_capability`` and kv-cache dtypes; source read at commit 4ba787ec9), and the
backend decides the kernel block sizes a page must split into and how much of a step a CUDA graph may hold. A plan
made for the wrong architecture has the wrong pages. graphkv knows three (:data:`~graphkv.spec.budget.KNOWN_GPUS`):

- ``sm_90`` (H100, H200), the architecture assumed when no GPU is named (:data:`ASSUMED_ARCH`);
- ``sm_80`` (A100) and ``sm_89`` (L40S, RTX 4090), where FlashAttention runs version 2 (CUDA graphs of uniform
  batches only, no fp8 cache, heads up to 256), neither FlashAttention's nor FlashMLA's MLA kernels run (they need
  Hopper), and Qwen's gated-delta prefill runs Triton, not FlashInfer.

:func:`resolve_gpu_arch` reads the ``gpu`` argument, :func:`attention_backend` gives a non-MLA attention layer's
backend as it runs there, :func:`mla_backend` the MLA layers' (:func:`default_mla_backend` when none is named), :func:`exports_gdn_checkpoints`
says whether gated-delta layers export prefill checkpoints. A backend keeps vLLM's name on every architecture (vLLM's
``FLASH_ATTN`` is FlashAttention 2 on an A100 and 3 on an H100); its descriptor is the one for the planned GPU.
"""

from __future__ import annotations

from typing import Any

import attrs

from graphkv.spec.backends import Backend, CudaGraphSupport, get_backend
from graphkv.spec.budget import GPU, KNOWN_GPUS, arch_of
from graphkv.spec.dtypes import DType
from graphkv.spec.hf._reader import ConfigReader

__all__ = ["ASSUMED_ARCH", "HOPPER", "PLANNED_ARCHS", "attention_backend", "default_mla_backend",
           "exports_gdn_checkpoints", "mla_backend", "resolve_gpu_arch"]

HOPPER = "sm_90"
ASSUMED_ARCH = HOPPER
"""The architecture a model read without a ``gpu`` is planned for: graphkv's target, an H100."""
PLANNED_ARCHS = ("sm_80", "sm_89", HOPPER)
"""The architectures whose backend choices graphkv follows (those of its known GPUs)."""
_FP8 = (DType.FLOAT8_E4M3, DType.FLOAT8_E5M2)
_HALF = (DType.BFLOAT16, DType.FLOAT16)  # the model dtypes FlashAttention and FlashInfer run
_FLASHINFER_HEADS = (64, 128, 256, 512)  # FlashInfer's head sizes (vLLM 0.33 FlashInferBackend)
_FA4_FP8_BLOCK = 64  # FlashAttention 4's sm_90 kernel for an fp8 cache of 512-wide heads reads 64-token pages


def resolve_gpu_arch(cfg: ConfigReader, gpu: Any) -> str:
    """The compute capability (``"sm_80"``) of ``gpu``: a :class:`~graphkv.spec.budget.GPU`, a known GPU's name (any
    case) or one of :data:`PLANNED_ARCHS` itself; :data:`ASSUMED_ARCH` for ``None``. Anything else records a problem
    on ``gpu`` and plans for :data:`ASSUMED_ARCH`."""
    if gpu is None:
        return ASSUMED_ARCH
    if isinstance(gpu, str) and gpu.strip().lower() in PLANNED_ARCHS:
        return gpu.strip().lower()
    arch = arch_of(gpu) if isinstance(gpu, (GPU, str)) else None
    if arch in PLANNED_ARCHS:
        return arch
    known = ", ".join(g.name for g in KNOWN_GPUS.values())
    shown = gpu.name if isinstance(gpu, GPU) else gpu
    why = "names no architecture graphkv plans for" if isinstance(gpu, GPU) else "is not a known GPU"
    cfg.argument_problem("gpu", shown, f"{why}; known: {known}",
                         f"name one of those or an architecture ({', '.join(PLANNED_ARCHS)}; --arch on the command "
                         f"line): the plan takes the backends vLLM picks there; unset, an H100's ({ASSUMED_ARCH})")
    return ASSUMED_ARCH


_HOPPER_ONLY = {"flash_attn_mla": "FlashAttention 3's MLA kernels", "flashmla": "FlashMLA"}
"""Backends whose kernels need an sm_90 GPU (vLLM 0.33 ``supports_compute_capability``), with what they run."""


def mla_backend(cfg: ConfigReader, arch: str, named: str, dtype: DType, *, indexed: bool) -> str:
    """The MLA layers' backend on ``arch``: ``named`` (``"auto"``: :func:`default_mla_backend`). A Hopper-only
    backend named for another architecture, and indexed MLA below Hopper, record a problem naming the fix."""
    if named == "auto":
        return default_mla_backend(cfg, arch, dtype, indexed=indexed)
    if arch != HOPPER and named in _HOPPER_ONLY:
        cfg.argument_problem("attention_backend", named, f"runs {_HOPPER_ONLY[named]}, which need an sm_90 GPU, "
                             f"but the plan is for {arch}", "use triton_mla there (vLLM 0.33's MLA backend below "
                             "Hopper), or plan for an H100 / H200")
    elif arch != HOPPER and indexed:
        _no_sparse_mla(cfg, arch)
    return named


def _no_sparse_mla(cfg: ConfigReader, arch: str) -> None:
    cfg.argument_problem("gpu", arch, "indexed (sparse) MLA runs on vLLM 0.33's FlashMLA / FlashAttention sparse "
                         "kernels, which need an sm_90 GPU; this model has no backend below Hopper",
                         "plan for an H100 or H200 (--gpu H100 or --arch sm_90)")


def default_mla_backend(cfg: ConfigReader, arch: str, dtype: DType, *, indexed: bool) -> str:
    """The MLA layers' backend vLLM 0.33 picks on ``arch`` for a ``dtype`` cache (``indexed``: sparse MLA with an
    indexer, DeepSeek-V3.2 / GLM-5).

    - ``sm_90``: ``flashmla`` (64-token kernel blocks) for indexed MLA, whose Hopper backends take 64-token blocks,
      and for an fp8 cache, which FlashAttention's MLA kernels do not read (an e5m2 cache, which no Hopper MLA
      backend reads, plans the same pages); ``triton_mla`` for float32, which neither reads; else (bf16 / fp16)
      ``flash_attn_mla`` (16-token blocks), the first of vLLM's priorities.
    - ``sm_80`` / ``sm_89``: ``triton_mla`` (16-token blocks), the one MLA backend vLLM runs below Hopper. Its fp8
      cache needs sm_89 (vLLM refuses it on an A100), and no sparse MLA backend runs below Hopper: both record a
      problem naming the fix.
    """
    fp8 = dtype in _FP8
    if arch == HOPPER:
        if indexed or fp8:
            return "flashmla"
        return "triton_mla" if dtype is DType.FLOAT32 else "flash_attn_mla"
    if indexed:
        _no_sparse_mla(cfg, arch)
    elif fp8 and arch == "sm_80":
        cfg.argument_problem("kv_cache_dtype", dtype.value, "vLLM 0.33's only MLA backend on sm_80 (Triton MLA) "
                             "reads an fp8 cache from sm_89 on",
                             "use kv_cache_dtype='bfloat16' on an A100, or plan for an L40S / H100")
    return "triton_mla"


def exports_gdn_checkpoints(arch: str) -> bool:
    """Whether Qwen's gated-delta layers export prefill checkpoints in ``mamba_cache_mode="align"`` on ``arch``: vLLM
    0.33 runs their prefill with FlashInfer's GDN kernel on sm_90 always (``_resolve_gdn_prefill_backend``), and with
    Triton, which exports none, on sm_80 / sm_89."""
    return arch == HOPPER


def _fa_reads(arch: str, head_size: int, cache_dtype: DType, sinks: bool) -> bool:
    """Whether vLLM 0.33's FLASH_ATTN serves the layer on ``arch``: heads a multiple of 8 up to 256 (FlashAttention 2
    and 3), up to 512 on sm_90 (version 4); an fp8 cache only on sm_90 (e4m3; 512-wide heads only at exactly 512),
    attention sinks only on sm_90."""
    if head_size % 8:
        return False
    if arch != HOPPER:
        return head_size <= 256 and cache_dtype not in _FP8 and not sinks
    if cache_dtype is DType.FLOAT8_E5M2:
        return False
    limit = 256 if cache_dtype is DType.FLOAT8_E4M3 else 512
    return head_size <= limit or (cache_dtype is DType.FLOAT8_E4M3 and head_size == 512)


def attention_backend(cfg: ConfigReader, arch: str, named: str | None, *, model_dtype: DType, cache_dtype: DType,
                      head_size: int, sinks: bool = False, triton_for_all: bool = False) -> "Backend | str":
    """A non-MLA attention layer's backend on ``arch``, as vLLM 0.33 runs it: ``named`` (a built-in backend's name)
    with its descriptor for ``arch``, else vLLM's first candidate that serves the layer (``CudaPlatform``'s order
    FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION):

    - ``flash_attn`` (:func:`_fa_reads`): on sm_90 versions 3 / 4, CUDA graphs of any step (ALWAYS), 16-token kernel
      blocks, exactly 64 for an fp8 cache of 512-wide heads; on sm_80 / sm_89 version 2, uniform batches only;
    - else ``flashinfer`` for its head sizes (64, 128, 256, 512) without sinks: 16 / 32 / 64-token kernel blocks,
      uniform batches on sm_80 / sm_89 (its FlashAttention-2 decode); on sm_90 single-token decodes only, the level it
      reports without its downloadable TRT-LLM kernels (with them, uniform batches);
    - else ``triton_paged`` (vLLM's TRITON_ATTN: 16-token multiples, ALWAYS), which also serves a float32 model (which
      FlashAttention and FlashInfer do not run), heads below 32 ``flex``. Triton reads an fp8 cache from sm_89 on:
      on an A100 such a layer records a problem, as vLLM refuses to start.

    ``triton_for_all``: the model is Gemma-4 with heads of two widths, which vLLM serves with Triton on GPUs without
    FlashAttention 4 (sm_80 / sm_89; ``Gemma4Config``)."""
    if named is not None:
        return _as_run_on(get_backend(named), arch)
    if model_dtype in _HALF and not (triton_for_all and arch != HOPPER):
        if _fa_reads(arch, head_size, cache_dtype, sinks):
            fa = _as_run_on(get_backend("flash_attn"), arch)
            if arch == HOPPER and cache_dtype in _FP8 and head_size > 256:
                return attrs.evolve(fa, supported_kernel_block_sizes=(_FA4_FP8_BLOCK,))
            return fa
        if head_size in _FLASHINFER_HEADS and not sinks:
            return _as_run_on(get_backend("flashinfer"), arch)
    if head_size < 32:
        return "flex"
    if cache_dtype in _FP8 and arch == "sm_80":
        cfg.argument_problem("kv_cache_dtype", cache_dtype.value, f"vLLM 0.33 serves these {head_size}-wide attention "
                             "heads with Triton on sm_80, which reads an fp8 cache from sm_89 on",
                             "use kv_cache_dtype='bfloat16' on an A100, or plan for an L40S / H100")
    return "triton_paged"


def _as_run_on(backend: Backend, arch: str) -> Backend:
    """``backend``'s descriptor on ``arch``: FlashAttention 2 and FlashInfer's FlashAttention-2 decode (sm_80 /
    sm_89) capture uniform batches only; every other backend is the same everywhere."""
    if arch != HOPPER and backend.name in ("flash_attn", "flashinfer"):
        return attrs.evolve(backend, cudagraph_support=CudaGraphSupport.UNIFORM_BATCH)
    return backend
