"""A linear layer whose few-token calls run graphkv's small-matmul kernel, as a torch custom op.

``graphkv::small_linear(x, weight, bias, kernels)`` computes ``torch.nn.functional.linear(x, weight, bias)``. When
``x`` has at most :data:`SMALL_LINEAR_ROWS` rows (its leading dimensions flattened) and ``kernels`` resolves to
``"triton"`` (:func:`~graphkv.runtime.ops.choice.resolve_kernels`: CUDA, or a CPU in Triton's interpreter), it runs
:func:`graphkv.kernels.small_matmul.small_matmul`; otherwise torch's own matmul. It is opaque to ``torch.compile``
(Inductor calls it like cuBLAS's matmul, between its fused kernels), so a captured decode step keeps whichever
implementation its size chose at capture. :func:`~graphkv.runtime.capture.small_matmuls.route_small_matmuls` puts it
in place of a traced forward's linear calls.

Example::

    y = torch.ops.graphkv.small_linear(hidden, layer.q_proj.weight, None, "auto")  # == layer.q_proj(hidden)
"""

from __future__ import annotations

import math

import torch

from graphkv.kernels.small_matmul import SMALL_MATMUL_DTYPES, small_matmul
from graphkv.runtime.ops.choice import resolve_kernels

__all__ = ["SMALL_LINEAR_ROWS", "small_linear"]

SMALL_LINEAR_ROWS = 8
"""The most rows (tokens) a call sends to the small-matmul kernel; larger ones run torch's matmul."""


def small_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 kernels: str = "auto") -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight, bias)``, through the small-matmul kernel when ``x`` ``[..., K]`` has at
    most :data:`SMALL_LINEAR_ROWS` rows, ``x``, ``weight`` and ``bias`` share one of the kernel's dtypes
    (:data:`~graphkv.kernels.small_matmul.SMALL_MATMUL_DTYPES`) and ``kernels`` resolves to ``"triton"`` on ``x``'s
    device; otherwise torch's (which also raises what it raises, e.g. for mismatched dtypes). The kernel checks its
    arguments (:class:`~graphkv.errors.SpecError` naming each bad one)."""
    if resolve_kernels(kernels, x.device) != "triton" or x.dim() < 1 or weight.dim() != 2 \
            or math.prod(x.shape[:-1]) > SMALL_LINEAR_ROWS or x.dtype not in SMALL_MATMUL_DTYPES \
            or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return torch.nn.functional.linear(x, weight, bias)
    rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])
    # On a CPU the interpreter runs the programs one after another: the fewest (as for a GPU of one SM).
    num_sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1
    return small_matmul(rows, weight, bias, num_sms=num_sms).reshape(*x.shape[:-1], weight.shape[0])


@torch.library.custom_op("graphkv::small_linear", mutates_args=())
def _small_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     kernels: str) -> torch.Tensor:
    return small_linear(x, weight, bias, kernels=kernels)


@_small_linear_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kernels: str) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])
