"""The persistent input buffers a captured forward reads: allocated once, filled per step.

Each input is a named tensor with a token dimension (dim 0 unless ``token_dims`` says otherwise,
e.g. ``slot_mapping`` of shape ``(num_groups, max_num_batched_tokens)`` has tokens on dim 1). A
step of ``num_tokens`` tokens on a graph of ``padded`` tokens writes rows ``[0, num_tokens)`` and
fills rows ``[num_tokens, padded)`` with the input's pad value: 0 by default, ``PAD_SLOT_ID = -1``
for names ending in ``slot_mapping`` (so padding tokens write no KV), or what the caller passes.
"""

from __future__ import annotations

from typing import Mapping

import torch

from graphkv.errors import CaptureError, Problem
from graphkv.runtime.padding import PAD_SLOT_ID

__all__ = ["PAD_SLOT_ID", "StaticInputs"]


class StaticInputs:
    """Named persistent buffers with a token dim each, their pad values, and per-step staging."""

    def __init__(self, buffers: Mapping[str, torch.Tensor] | None = None, *,
                 pad_values: Mapping[str, float] | None = None, token_dims: Mapping[str, int] | None = None) -> None:
        self.buffers: dict[str, torch.Tensor] = dict(buffers or {})
        self.pad_values = dict(pad_values or {})
        self.token_dims = dict(token_dims or {})
        unknown = sorted((set(self.pad_values) | set(self.token_dims)) - set(self.buffers))
        if unknown:
            raise CaptureError(Problem(field="pad_values/token_dims", value=unknown,
                                       limit="name inputs that have no static buffer",
                                       fix=f"add them to static_inputs (has {sorted(self.buffers)}) or drop them"))

    def pad_value(self, name: str) -> float:
        """The value of padding rows of input ``name``."""
        return self.pad_values.get(name, PAD_SLOT_ID if name.endswith("slot_mapping") else 0)

    def rows(self, name: str, start: int, length: int) -> torch.Tensor:
        """A view of rows ``[start, start + length)`` of ``name`` along its token dim."""
        return self.buffers[name].narrow(self.token_dims.get(name, 0), start, length)

    def views(self, num_tokens: int) -> dict[str, torch.Tensor]:
        """Views of the first ``num_tokens`` rows of every buffer, by name (no copy)."""
        return {name: self.rows(name, 0, num_tokens) for name in self.buffers}

    def check_names(self, names: object) -> None:
        """Raise :class:`CaptureError` for input names that have no buffer (a graph could not see them)."""
        unknown = sorted(set(names) - set(self.buffers)) if self.buffers else []  # type: ignore[call-overload]
        if unknown:
            raise CaptureError(Problem(field="inputs", value=unknown, limit="have no static buffer, so a graph could "
                                       "not see them", fix=f"add them to static_inputs (has {sorted(self.buffers)})"))

    def ensure(self, example_inputs: Mapping[str, torch.Tensor] | None, max_tokens: int,
               alloc_tokens: int | None = None) -> None:
        """Allocate buffers of ``alloc_tokens`` rows (default ``max_tokens``) shaped like
        ``example_inputs`` when none were given, then check that every buffer holds ``max_tokens``
        rows (the largest capture size; steps above it run eagerly on the buffers' first rows, so
        allocate ``max_num_batched_tokens`` rows)."""
        if not self.buffers and example_inputs:
            for name, t in example_inputs.items():
                shape = list(t.shape)
                shape[self.token_dims.get(name, 0)] = max(max_tokens, alloc_tokens or 0)
                self.buffers[name] = torch.zeros(shape, dtype=t.dtype, device=t.device)
        if not self.buffers:
            raise CaptureError(Problem(field="static_inputs", value=None,
                                       limit="capture needs persistent input buffers",
                                       fix="pass static_inputs= to capture(plan, ...) or example_inputs= to "
                                           ".capture()"))
        small = {n: b.shape[self.token_dims.get(n, 0)] for n, b in self.buffers.items()
                 if b.shape[self.token_dims.get(n, 0)] < max_tokens}
        if small:
            raise CaptureError(Problem(field="static_inputs", value=small,
                                       limit=f"token dim must hold the largest capture size {max_tokens}",
                                       fix=f"allocate those buffers with >= {max_tokens} tokens "
                                           "(plan.limits.max_num_batched_tokens)"))

    def pad_all(self, num_tokens: int) -> dict[str, torch.Tensor]:
        """Fill the first ``num_tokens`` rows with pad values (a dummy all-padding step); return the views."""
        for name in self.buffers:
            self.rows(name, 0, num_tokens).fill_(self.pad_value(name))
        return self.views(num_tokens)

    def stage(self, inputs: Mapping[str, torch.Tensor], num_tokens: int, num_tokens_padded: int) -> None:
        """Copy ``inputs`` into rows ``[0, num_tokens)`` and pad rows ``[num_tokens, num_tokens_padded)``.

        An input that already is those rows (same address, shape and strides), or is left out, is
        not copied: the caller filled the buffer in place. Allocates nothing; runs on the buffers'
        stream before a replay.
        """
        for name in self.buffers:
            rows = self.rows(name, 0, num_tokens)
            src = inputs.get(name)
            if src is not None and not (src.data_ptr() == rows.data_ptr() and src.shape == rows.shape
                                        and src.stride() == rows.stride()):
                if src.shape != rows.shape or src.dtype != rows.dtype:
                    raise CaptureError(Problem(
                        field=name, value=f"{tuple(src.shape)} {src.dtype}",
                        limit=f"must be {tuple(rows.shape)} {rows.dtype} for num_tokens={num_tokens}",
                        fix="pass a tensor of the static buffer's dtype with num_tokens rows on its token dim"))
                rows.copy_(src)
            if num_tokens_padded > num_tokens:
                self.rows(name, num_tokens, num_tokens_padded - num_tokens).fill_(self.pad_value(name))

    def eager_args(self, inputs: Mapping[str, torch.Tensor], num_tokens: int) -> dict[str, torch.Tensor]:
        """Arguments of an eager call: the caller's inputs, and the first ``num_tokens`` rows of the rest."""
        args = {name: self.rows(name, 0, num_tokens) for name in self.buffers if name not in inputs}
        args.update(inputs)
        return args
