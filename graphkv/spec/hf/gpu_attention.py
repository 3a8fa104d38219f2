"""A non-MLA attention layer's backend as vLLM 0.33 runs it on the planned GPU architecture.

vLLM tries ``FLASH_ATTN``, ``FLASHINFER``, ``TRITON_ATTN`` and ``FLEX_ATTENTION`` in that order on sm_80 / sm_89 /
sm_90 (``CudaPlatform._get_backend_priorities``, commit 4ba787ec9) and takes the first whose checks pass for the
layer: the model's dtype, the cache's dtype, the head size, attention sinks. The one it takes decides the kernel
blocks a page splits into and what a CUDA graph may hold, and can differ by GPU with the same name (``FLASH_ATTN``
is FlashAttention 2 on an A100, 3 or 4 on an H100): :func:`attention_backend` returns the descriptor for the GPU.
"""

from __future__ import annotations

import attrs

from graphkv.spec.backends import Backend, CudaGraphSupport, get_backend
from graphkv.spec.dtypes import DType
from graphkv.spec.hf._reader import ConfigReader
from graphkv.spec.hf.gpu_backends import FP8, HOPPER

__all__ = ["attention_backend"]

_HALF = (DType.BFLOAT16, DType.FLOAT16)  # the model dtypes FlashAttention and FlashInfer run
_FLASHINFER_HEADS = (64, 128, 256, 512)  # FlashInfer's head sizes (vLLM 0.33 FlashInferBackend)
_FA4_FP8_BLOCK = 64  # FlashAttention 4's sm_90 kernel for an fp8 cache of 512-wide heads reads 64-token pages
_TRITON_MIN_HEAD = 32  # vLLM's Triton attention takes heads of 32 and wider


def _fa_refusal(arch: str, model_dtype: DType, cache_dtype: DType, head_size: int, sinks: bool) -> str | None:
    """Why vLLM 0.33's FLASH_ATTN cannot serve the layer on ``arch`` (``None``: it can). FlashAttention 2 (sm_80 /
    sm_89) takes heads that are multiples of 8 up to 256, no fp8 cache and no sinks; 3 and 4 (sm_90) heads up to 512,
    an e4m3 cache up to 256-wide heads and at exactly 512 (version 4), sinks; none runs float32 or reads e5m2."""
    version = "FlashAttention 2 (sm_80 / sm_89)" if arch != HOPPER else "FlashAttention 3 / 4 (sm_90)"
    if model_dtype not in _HALF:
        return f"FlashAttention runs bf16 / fp16 models, not {model_dtype.value}"
    if head_size % 8:
        return f"FlashAttention takes heads that are multiples of 8, not {head_size}"
    if cache_dtype is DType.FLOAT8_E5M2:
        return "FlashAttention reads no fp8_e5m2 cache"
    if arch != HOPPER:
        if head_size > 256:
            return f"{version} takes heads up to 256, not {head_size}"
        if cache_dtype in FP8:
            return f"{version} reads no fp8 cache"
        return f"{version} has no attention sinks" if sinks else None
    if head_size > 512:
        return f"{version} takes heads up to 512, not {head_size}"
    if cache_dtype in FP8 and 256 < head_size < 512:
        return f"{version} reads an fp8 cache of heads up to 256 or of exactly 512, not {head_size}"
    return None


def _flashinfer_refusal(arch: str, model_dtype: DType, head_size: int, sinks: bool) -> str | None:
    """Why vLLM 0.33's FLASHINFER cannot serve the layer (``None``: it can): bf16 / fp16 models, heads of 64, 128,
    256 or 512; sinks only through its TRT-LLM kernels, which run on sm_90 (and need a download: taken as absent
    when vLLM picks, allowed when named)."""
    if model_dtype not in _HALF:
        return f"FlashInfer runs bf16 / fp16 models, not {model_dtype.value}"
    if head_size not in _FLASHINFER_HEADS:
        return f"FlashInfer takes heads of {', '.join(map(str, _FLASHINFER_HEADS))}, not {head_size}"
    return "FlashInfer serves attention sinks on sm_90 only" if sinks and arch != HOPPER else None


def _descriptor(backend: Backend, arch: str, cache_dtype: DType, head_size: int) -> Backend:
    """``backend`` as it runs on ``arch``: FlashAttention 2 and FlashInfer's FlashAttention-2 decode (sm_80 / sm_89)
    capture uniform batches only; FlashAttention 4 reads an fp8 cache of 512-wide heads in exactly 64-token pages
    (sm_90); every other backend is the same everywhere."""
    if arch != HOPPER and backend.name in ("flash_attn", "flashinfer"):
        return attrs.evolve(backend, cudagraph_support=CudaGraphSupport.UNIFORM_BATCH)
    if backend.name == "flash_attn" and arch == HOPPER and cache_dtype in FP8 and head_size == 512:
        return attrs.evolve(backend, supported_kernel_block_sizes=(_FA4_FP8_BLOCK,))
    return backend


_NO_FP8 = "use kv_cache_dtype='bfloat16', or plan for another GPU (--gpu / --arch)"


def _vllm_pick(arch: str, model_dtype: DType, cache_dtype: DType, head_size: int, sinks: bool,
               triton_rule: str) -> tuple["Backend | str", tuple[str, str] | None]:
    """vLLM 0.33's default for the layer and, where it has none that runs it, ``(why, fix)`` (``None``: it has)."""
    if triton_rule and arch != HOPPER:  # the model's own rule (Gemma4Config, MiMo-V2's diff-KV backends)
        if triton_rule == "always" and cache_dtype is DType.FLOAT8_E5M2:
            return "triton_paged", ("MiMo-V2's Triton diff-KV kernels (its backend below Hopper) read fp8 (e4m3) only",
                                    "use kv_cache_dtype='fp8' or 'bfloat16'")
        if cache_dtype in FP8 and arch == "sm_80":
            return "triton_paged", ("vLLM serves this model with Triton below Hopper, which reads an fp8 cache from "
                                    "sm_89 on", _NO_FP8)
        return "triton_paged", None
    if _fa_refusal(arch, model_dtype, cache_dtype, head_size, sinks) is None:
        return _descriptor(get_backend("flash_attn"), arch, cache_dtype, head_size), None
    if not sinks and _flashinfer_refusal(arch, model_dtype, head_size, False) is None:
        return _descriptor(get_backend("flashinfer"), arch, cache_dtype, head_size), None
    if head_size < _TRITON_MIN_HEAD:
        if cache_dtype in FP8 or sinks:
            return "flex", (f"no vLLM 0.33 backend serves {head_size}-wide heads with "
                            + ("an fp8 cache" if cache_dtype in FP8 else "attention sinks")
                            + f": Triton takes heads of {_TRITON_MIN_HEAD} and wider, and FlexAttention reads no fp8 "
                            "cache and has no sinks", "use kv_cache_dtype='bfloat16'" if cache_dtype in FP8 else
                            "declare the layers with ModelKV.from_specs and a backend that serves them")
        return "flex", None
    if cache_dtype in FP8 and arch == "sm_80":
        cause = ("the attention sinks leave only Triton (only Hopper's FlashAttention serves sinks)" if sinks else
                 f"neither FlashAttention nor FlashInfer serves {head_size}-wide heads with an fp8 cache on sm_80")
        return "triton_paged", (f"{cause}, and Triton reads an fp8 cache from sm_89 on", _NO_FP8)
    return "triton_paged", None


def attention_backend(cfg: ConfigReader, arch: str, named: str | None, *, model_dtype: DType, cache_dtype: DType,
                      head_size: int, sinks: bool = False, triton_rule: str = "", gpu: str = HOPPER
                      ) -> "Backend | str":
    """A non-MLA attention layer's backend on ``arch`` as vLLM 0.33 runs it: ``named`` (a built-in backend's name),
    else vLLM's first candidate that serves the layer:

    - ``flash_attn`` (:func:`_fa_refusal`): on sm_90 versions 3 / 4, CUDA graphs of any step (ALWAYS), 16-token
      kernel blocks, exactly 64 for an fp8 cache of 512-wide heads; on sm_80 / sm_89 version 2, uniform batches only;
    - else ``flashinfer`` for its head sizes without sinks: 16 / 32 / 64-token kernel blocks, uniform batches on
      sm_80 / sm_89 (its FlashAttention-2 decode); on sm_90 single-token decodes only, the level it reports without
      its downloadable TRT-LLM kernels (with them, uniform batches);
    - else ``triton_paged`` (vLLM's TRITON_ATTN: 16-token multiples, ALWAYS), which also serves a float32 model;
      heads below 32 ``flex``.

    ``triton_rule`` is the family's rule below Hopper (:attr:`~graphkv.spec.hf.families.Family.triton_below_hopper`,
    already resolved to ``"always"`` / ``"mixed_heads"`` for this model, or ``""``). Where vLLM has no backend that
    runs the layer (an fp8 cache only Triton would read on an A100, narrow heads with fp8 or sinks), or the named one
    does not run it (FlashAttention 2 with an fp8 cache, FlashInfer with a head size it lacks), a problem is recorded,
    as vLLM refuses to start. ``gpu`` names the GPU in messages."""
    pick, refusal = _vllm_pick(arch, model_dtype, cache_dtype, head_size, sinks, triton_rule)
    if named is None:
        if refusal is not None:
            why, fix = refusal
            if cache_dtype in FP8:
                cfg.argument_problem("kv_cache_dtype", cache_dtype.value, f"{why}; the plan is for {gpu}", fix)
            else:
                cfg.problem("head_dim", head_size, f"{why}; the plan is for {gpu}", fix)
        return pick
    backend = get_backend(named)
    why = {"flash_attn": _fa_refusal(arch, model_dtype, cache_dtype, head_size, sinks),
           "flashinfer": _flashinfer_refusal(arch, model_dtype, head_size, sinks)}.get(backend.name)
    if why is not None:
        default = pick if isinstance(pick, str) else pick.name
        cfg.argument_problem("attention_backend", named, f"{why}; the plan is for {gpu}",
                             f"leave attention_backend unset (vLLM 0.33 picks {default} for this layer there)")
    return _descriptor(backend, arch, cache_dtype, head_size)
