"""LFM2's short-convolution mixer on the pool: ``Lfm2ShortConv`` with its conv state paged."""

from __future__ import annotations

import torch

from graphkv.hf.mixers.base import PagedMixer
from graphkv.runtime.state.conv import packed_causal_conv
from graphkv.runtime.state.rows import PackedRows

__all__ = ["PagedShortConv"]


class PagedShortConv(PagedMixer):
    """The model's ``in_proj`` (into gates ``B`` and ``C`` and the input ``x``), depthwise causal ``conv`` of ``B * x``
    and ``out_proj`` of ``C`` times the convolution, around :func:`packed_causal_conv`. One state: the convolution's
    last ``K - 1`` inputs ``(K - 1, hidden)`` (vLLM's ``short_conv_state_shape``)."""

    def mix(self, x: torch.Tensor, pages: torch.Tensor, rows: PackedRows) -> torch.Tensor:
        """``[T, hidden] -> [T, hidden]``. Capture-safe."""
        m = self.mixer
        gate_b, gate_c, inputs = m.in_proj(x).chunk(3, dim=-1)
        conv = packed_causal_conv(gate_b * inputs, self.conv_state, pages, rows, weight=m.conv.weight.squeeze(1),
                                  bias=m.conv.bias)
        return m.out_proj(gate_c * conv)
