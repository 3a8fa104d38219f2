"""Which implementation runs the runtime kernels: Triton on CUDA devices, torch elsewhere.

The Triton kernels (``graphkv.kernels``) are the fast, capture-safe path on a GPU. ``"triton"``
also runs them on CPU tensors, in Triton's interpreter (chosen per launch by the tensors' device,
no environment variable needed; :mod:`graphkv.kernels.launch`): the exact GPU code path, as a
correctness check, and slow (milliseconds per launch and more). So ``"auto"`` picks Triton on CUDA
devices and the vectorized torch implementations (:mod:`graphkv.runtime.ops.torch_ops`)
everywhere else. Both have the same semantics and are checked against the same reference.

Example::

    resolve_kernels("auto", "cpu")    # -> "torch"
    resolve_kernels("auto", "cuda")   # -> "triton"
    write_kv(k, v, pool.kv_cache(name), slots[g], layout=pool.layout(name))  # picks by the cache's device
"""

from __future__ import annotations

import torch

from graphkv.errors import Problem, SpecError
from graphkv.kernels.reshape_and_cache import reshape_and_cache as triton_reshape_and_cache
from graphkv.runtime.ops.torch_ops import reshape_and_cache as torch_reshape_and_cache
from graphkv.spec.backends import KVLayout

__all__ = ["KERNEL_CHOICES", "gpu_path", "rehearses", "resolve_kernels", "write_kv"]

KERNEL_CHOICES = ("auto", "triton", "torch")


def resolve_kernels(kernels: str, device: "str | torch.device") -> str:
    """The implementation ``kernels`` selects on ``device``: ``"triton"`` or ``"torch"``
    (``"auto"`` is ``"triton"`` on CUDA devices and ``"torch"`` on any other; ``"triton"`` on a CPU
    runs the kernels in Triton's interpreter, a slow correctness check). Raises
    :class:`SpecError` for any other value. Pure; no tensors are touched."""
    if not isinstance(kernels, str) or kernels not in KERNEL_CHOICES:
        raise SpecError(Problem(field="kernels", value=kernels, limit=f"must be one of {', '.join(KERNEL_CHOICES)}",
                                fix="pass kernels='auto' (Triton on CUDA devices, torch elsewhere), or force "
                                    "'triton' or 'torch'"))
    if kernels != "auto":
        return kernels
    return "triton" if torch.device(device).type == "cuda" else "torch"


def gpu_path(kernels: str, device: "str | torch.device") -> bool:
    """Whether a runtime on ``device`` with resolved ``kernels`` runs the GPU's code path (the Triton
    kernels, the staged tables, the GPU's flex query tile and MoE routing): on CUDA, or anywhere with
    ``kernels="triton"``."""
    return torch.device(device).type == "cuda" or kernels == "triton"


def rehearses(kernels: str, device: "str | torch.device") -> bool:
    """Whether such a runtime rehearses its capture instead of capturing CUDA graphs: the GPU path
    without CUDA (every step padded to its graph key and run eagerly)."""
    return torch.device(device).type != "cuda" and kernels == "triton"


def write_kv(key: torch.Tensor, value: torch.Tensor | None, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
             *, layout: KVLayout, kernels: str = "auto") -> None:
    """``reshape_and_cache`` with the implementation ``kernels`` picks for ``kv_cache``'s device:
    write ``key`` / ``value`` ``[num_tokens, H, D]`` (latent: ``key`` ``[num_tokens, D]``,
    ``value=None``) into the cache view at ``slot_mapping`` ``[>= num_tokens] int64``, skipping
    negative and out-of-range slots. Capture-safe on the Triton path (``"auto"`` on CUDA);
    ``"triton"`` on a CPU cache runs the same kernel in Triton's interpreter (slow; for checking).

    In an attention layer's forward (``k``, ``v`` its new keys and values, ``g`` its group)::

        write_kv(k, v, pool.kv_cache(name), ctx.slot_mappings[g], layout=pool.layout(name))
    """
    if resolve_kernels(kernels, kv_cache.device) == "triton":
        triton_reshape_and_cache(key, value, kv_cache, slot_mapping, layout=layout)
    else:
        torch_reshape_and_cache(key, value, kv_cache, slot_mapping, layout=layout)
