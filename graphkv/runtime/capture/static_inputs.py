"""The persistent input buffers a captured forward reads: allocated once, filled per step.

Each input is a named tensor with a token dimension (dim 0 unless ``token_dims`` says otherwise,
e.g. ``slot_mapping`` of shape ``(num_groups, max_num_batched_tokens)`` has tokens on dim 1). A
step of ``num_tokens`` tokens on a graph of ``padded`` tokens writes rows ``[0, num_tokens)`` and
fills rows ``[num_tokens, padded)`` with the input's pad value: 0 by default, ``PAD_SLOT_ID = -1``
for names ending in ``slot_mapping`` (so padding tokens write no KV), or what the caller passes.

Refused at construction (one :class:`~graphkv.errors.CaptureError` listing every problem): buffers
that are not a mapping of ``str`` names to tensors, 0-dim or meta tensors, a tensor whose elements
overlap each other (an expanded view) or another buffer's (two names over one buffer), token dims
that are not an int dim of their tensor, and pad values the buffer's dtype cannot hold (an integer
dtype exactly: ``-1`` in a ``uint8`` slot mapping would become 255, a real slot, and 2.7 would
become 2; a floating one within its range). Per step, an input that is not
a tensor of the buffer's dtype with ``num_tokens`` rows on its token dim is refused, replayed or
eager alike.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

import torch

from graphkv.errors import CaptureError, Problem
from graphkv.printable import shortened
from graphkv.runtime.padding import PAD_SLOT_ID
from graphkv.spec._checks import whole_int

__all__ = ["PAD_SLOT_ID", "StaticInputs"]


def _mapping(field: str, value: Any, fix: str) -> tuple[dict[Any, Any], list[Problem]]:
    """``value`` (``None``: empty) as a dict, or a problem saying it is not a mapping."""
    if value is None:
        return {}, []
    if not isinstance(value, Mapping):
        return {}, [Problem(field=field, value=type(value).__name__, limit="must be a mapping of input name -> "
                            "value (or None)", fix=fix)]
    problems = [Problem(field=field, value=name, limit=f"names must be str (got {type(name).__name__})",
                        fix="name each input after the forward's keyword argument")
                for name in value if not isinstance(name, str)]
    return dict(value), problems


def _tensor_problem(field: str, name: str, t: Any) -> Problem | None:
    """Why ``t`` cannot be a static buffer (or an example of one), or ``None``."""
    where = f"{field}[{name!r}]"
    if not isinstance(t, torch.Tensor):
        return Problem(field=where, value=type(t).__name__, limit="must be a torch.Tensor (a persistent buffer: graphs "
                       "read it at a fixed address)", fix="allocate it once, e.g. torch.zeros(max_num_batched_tokens, "
                       "dtype=torch.int64, device=device)")
    if t.is_meta:
        return Problem(field=where, value=f"{tuple(t.shape)} on meta", limit="a meta tensor has no memory a forward "
                       "could read", fix="allocate it on the forward's device")
    if t.dim() == 0:
        return Problem(field=where, value="a 0-dim tensor", limit="must have a token dim (dim 0, or token_dims[name])",
                       fix="give it a token dim of >= max_num_batched_tokens rows, e.g. shape "
                           "(max_num_batched_tokens,)")
    return None


def _self_overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (an expanded or ``as_strided`` view). Any view of
    a tensor with its own memory per element (slices, steps, transposes) passes."""
    extent = 1  # elements spanned by the dims of smaller stride (strides are never negative in torch)
    for stride, size in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1):
        if stride < extent:
            return True
        extent += (size - 1) * stride
    return False


def _span(t: torch.Tensor) -> tuple[str, int, int] | None:
    """``t``'s device and the byte range its elements lie in (``None`` when empty)."""
    if t.numel() == 0:
        return None
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return str(t.device), t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _is_number(value: Any) -> bool:
    """Whether ``value`` is a real number a pad value may be (a bool, an int or a float of any kind; not a tensor)."""
    return isinstance(value, numbers.Real) and not isinstance(value, torch.Tensor)


def _holds(value: numbers.Real, dtype: torch.dtype) -> bool:
    """Whether a tensor of ``dtype`` holds the number ``value``: an integer dtype exactly (no wrap, no
    truncation), a floating one within its range (rounded to its precision, as any float is; an
    infinity or NaN only when given as one)."""
    if isinstance(value, bool):
        return True  # 0 or 1 in every dtype
    if dtype == torch.bool:
        return value in (0, 1)
    if not dtype.is_floating_point and not dtype.is_complex:
        if not isinstance(value, numbers.Integral):
            return math.isfinite(value) and float(value).is_integer() and _holds(int(value), dtype)
        info = torch.iinfo(dtype)
        return info.min <= int(value) <= info.max
    try:
        held = complex(torch.tensor(float(value), dtype=dtype).item())
    except (OverflowError, RuntimeError, TypeError):
        return False
    return not math.isfinite(value) or (math.isfinite(held.real) and math.isfinite(held.imag))


class StaticInputs:
    """Named persistent buffers with a token dim each, their pad values, and per-step staging.

    ``buffers``: a mapping of forward argument name to tensor (``None``: buffers come later from
    :meth:`ensure`'s ``example_inputs``); ``pad_values`` and ``token_dims`` by the same names.
    Raises :class:`CaptureError` for what the module docstring lists as refused.
    """

    def __init__(self, buffers: Mapping[str, torch.Tensor] | None = None, *,
                 pad_values: Mapping[str, float] | None = None, token_dims: Mapping[str, int] | None = None) -> None:
        given, problems = _mapping("static_inputs", buffers, "pass static_inputs={'input_ids': buffer}")
        pads, more = _mapping("pad_values", pad_values, "pass pad_values={'input_ids': 0}")
        dims, most = _mapping("token_dims", token_dims, "pass token_dims={'slot_mapping': 1}")
        if problems or more or most:
            raise CaptureError(*problems, *more, *most)
        self.buffers: dict[str, torch.Tensor] = {}
        self.pad_values: dict[str, float] = pads
        self.token_dims: dict[str, int] = {}  # every buffer's, normalized to 0 <= dim < ndim
        self.given = bool(given)  # buffers from static_inputs: example_inputs may not replace them
        self._sizes: dict[str, int] = {}  # rows on the token dim
        unknown = sorted((set(pads) | set(dims)) - set(given))
        if unknown:
            raise CaptureError(Problem(field="pad_values/token_dims", value=unknown,
                                       limit="name inputs that have no static buffer",
                                       fix=f"add them to static_inputs (has {sorted(given)}) or drop them"))
        self._add("static_inputs", given, dims)

    def _add(self, field: str, buffers: dict[str, Any], dims: dict[str, Any]) -> None:
        """Check ``buffers`` (every problem at once) and take them."""
        problems = [p for name, t in buffers.items() if (p := _tensor_problem(field, name, t)) is not None]
        if problems:
            raise CaptureError(*problems)
        for name, t in buffers.items():
            dim = whole_int(dims.get(name, 0))
            if dim is None or not -t.dim() <= dim < t.dim():
                problems.append(Problem(field=f"token_dims[{name!r}]", value=dims[name],
                                        limit=f"must be an int dim of the {t.dim()}-dim buffer {tuple(t.shape)}",
                                        fix=f"pass the dim that counts tokens, 0 <= dim < {t.dim()}"))
            if _self_overlaps(t):
                problems.append(Problem(field=f"{field}[{name!r}]",
                                        value=f"shape {tuple(t.shape)} strides {t.stride()}",
                                        limit="its elements overlap in memory (an expanded or as_strided view): "
                                              "staging one token's row would overwrite another's",
                                        fix="pass a buffer with its own memory per element, e.g. torch.zeros(...)"))
            pad = self.pad_value(name)
            default = "" if name in self.pad_values else (
                "the default pad value (PAD_SLOT_ID for names ending in slot_mapping): " if name.endswith(
                    "slot_mapping") else "the default pad value: ")
            if not _is_number(pad):
                problems.append(Problem(field=f"pad_values[{name!r}]", value=shortened(str(pad)),
                                        limit="must be a number (an int or a float)",
                                        fix=f"pass the value of {name}'s padding rows, e.g. 0"))
            elif not _holds(pad, t.dtype):
                slot = name.endswith("slot_mapping") and pad == PAD_SLOT_ID
                problems.append(Problem(
                    field=f"pad_values[{name!r}]", value=pad,
                    limit=f"{default}a {t.dtype} buffer cannot hold it: padding rows would hold another value"
                          + (" (a real slot: padding tokens would write KV there)" if slot else ""),
                    fix=f"pass a number {t.dtype} holds, or a buffer of a dtype that holds {pad!r}"
                        + (" (a signed integer dtype such as torch.int64)" if slot else "")))
        spans = {**{n: _span(b) for n, b in self.buffers.items()}, **{n: _span(t) for n, t in buffers.items()}}
        names = list(spans)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                sa, sb = spans[a], spans[b]
                if sa is not None and sb is not None and sa[0] == sb[0] and sa[1] < sb[2] and sb[1] < sa[2]:
                    problems.append(Problem(field=field, value=[a, b], limit="lie in overlapping memory (one buffer "
                                            "twice, or views of one tensor whose spans overlap): staging one would "
                                            "overwrite the other's rows",
                                            fix="give each input a buffer of its own"))
        if problems:
            raise CaptureError(*problems)
        for name, t in buffers.items():
            dim = whole_int(dims.get(name, 0)) % t.dim()
            self.buffers[name], self.token_dims[name], self._sizes[name] = t, dim, t.shape[dim]

    def pad_value(self, name: str) -> float:
        """The value of padding rows of input ``name``."""
        return self.pad_values.get(name, PAD_SLOT_ID if name.endswith("slot_mapping") else 0)

    def rows(self, name: str, start: int, length: int) -> torch.Tensor:
        """A view of rows ``[start, start + length)`` of ``name`` along its token dim."""
        return self.buffers[name].narrow(self.token_dims[name], start, length)

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
        allocate ``max_num_batched_tokens`` rows). Refuses ``example_inputs`` beside ``static_inputs``
        (they would be ignored), and ones unlike the buffers an earlier call allocated from them."""
        if example_inputs is not None:
            self._allocate(example_inputs, max(max_tokens, alloc_tokens or 0))
        small = {n: size for n, size in self._sizes.items() if size < max_tokens}
        if small:
            raise CaptureError(Problem(field="static_inputs", value=small,
                                       limit=f"token dim must hold the largest capture size {max_tokens}",
                                       fix=f"allocate those buffers with >= {max_tokens} tokens "
                                           "(plan.limits.max_num_batched_tokens)"))

    def require(self) -> None:
        """Raise :class:`CaptureError` when there is no buffer at all (nothing a graph could read)."""
        if not self.buffers:
            raise CaptureError(Problem(field="static_inputs", value=None,
                                       limit="capture needs persistent input buffers",
                                       fix="pass static_inputs= to capture(plan, ...) or example_inputs= to "
                                           ".capture()"))

    def _allocate(self, example_inputs: Any, num_tokens: int) -> None:
        if self.given:
            raise CaptureError(Problem(
                field="example_inputs", value=sorted(map(str, example_inputs)) if isinstance(example_inputs, Mapping)
                else type(example_inputs).__name__,
                limit=f"the forward has static_inputs {sorted(self.buffers)} already (example_inputs only shape the "
                      "buffers allocated when none were given)", fix="drop example_inputs="))
        examples, problems = _mapping("example_inputs", example_inputs,
                                      "pass example_inputs={'input_ids': torch.zeros(1, dtype=torch.int64)}")
        problems += [p for name, t in examples.items() if isinstance(name, str)
                     and (p := _tensor_problem("example_inputs", name, t)) is not None]
        if problems:
            raise CaptureError(*problems)
        def described(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:  # past the token dim
            return {name: f"{tuple(t.shape[1:])} {t.dtype} on {t.device}" for name, t in tensors.items()}

        if self.buffers:  # allocated by an earlier capture's example_inputs
            if described(examples) != described(self.buffers):
                raise CaptureError(Problem(
                    field="example_inputs", value=described(examples),
                    limit=f"differ from the buffers an earlier capture allocated from its example_inputs "
                          f"({described(self.buffers)}, shapes past the token dim)",
                    fix="pass the same example_inputs, or build a new forward"))
            return
        self._add("example_inputs", {name: torch.zeros((num_tokens, *t.shape[1:]), dtype=t.dtype, device=t.device)
                                     for name, t in examples.items()}, {})

    def pad_all(self, num_tokens: int) -> dict[str, torch.Tensor]:
        """Fill the first ``num_tokens`` rows with pad values (a dummy all-padding step); return the views."""
        for name in self.buffers:
            self.rows(name, 0, num_tokens).fill_(self.pad_value(name))
        return self.views(num_tokens)

    def stage(self, inputs: Mapping[str, torch.Tensor], num_tokens: int, num_tokens_padded: int) -> None:
        """Copy ``inputs`` into rows ``[0, num_tokens)`` and pad rows ``[num_tokens, num_tokens_padded)``.

        An input that already is those rows (same address, shape and strides), or is left out, is
        not copied: the caller filled the buffer in place. An input that is not a tensor of the
        buffer's dtype with those rows' shape is refused (:class:`CaptureError`). Allocates nothing;
        runs on the buffers' stream before a replay.
        """
        for name in self.buffers:
            rows = self.rows(name, 0, num_tokens)
            src = inputs.get(name)
            if src is not None:
                if not isinstance(src, torch.Tensor) or src.shape != rows.shape or src.dtype != rows.dtype \
                        or src.is_meta:
                    raise self._refused(name, src, num_tokens)
                if not (src.data_ptr() == rows.data_ptr() and src.stride() == rows.stride()):
                    try:
                        rows.copy_(src)
                    except RuntimeError as e:  # e.g. a view that partly overlaps the rows it is copied into
                        raise CaptureError(Problem(
                            field=name, value=f"{tuple(src.shape)} {src.dtype} on {src.device}",
                            limit=f"cannot be copied into its static rows: {e}",
                            fix="pass a tensor of its own, or the static rows themselves")) from e
            if num_tokens_padded > num_tokens:
                self.rows(name, num_tokens, num_tokens_padded - num_tokens).fill_(self.pad_value(name))

    def eager_args(self, inputs: Mapping[str, torch.Tensor], num_tokens: int) -> dict[str, torch.Tensor]:
        """Arguments of an eager call: the caller's inputs, and the first ``num_tokens`` rows of the rest.

        A given input with a static buffer is checked as :meth:`stage` checks it (a tensor of the
        buffer's dtype with ``num_tokens`` rows on its token dim); one left out must fit its buffer
        (``num_tokens`` <= its rows). Either is refused with :class:`CaptureError`."""
        args = dict(inputs)
        for name, buffer in self.buffers.items():
            src = inputs.get(name)
            if src is None:
                if num_tokens > self._sizes[name]:
                    raise CaptureError(Problem(
                        field="num_tokens", value=num_tokens,
                        limit=f"exceeds the static buffer {name!r} ({self._sizes[name]} rows on its token dim), which "
                              "an input left out is read from",
                        fix=f"pass {name}= with the step's {num_tokens} rows, or allocate the buffer with >= "
                            f"{num_tokens} rows"))
                args[name] = self.rows(name, 0, num_tokens)
            elif not isinstance(src, torch.Tensor) or src.dtype != buffer.dtype or src.is_meta \
                    or src.shape != self._shape(name, num_tokens):
                raise self._refused(name, src, num_tokens)
        return args

    def _shape(self, name: str, num_tokens: int) -> torch.Size:
        """The shape of ``num_tokens`` rows of ``name``."""
        shape = list(self.buffers[name].shape)
        shape[self.token_dims[name]] = num_tokens
        return torch.Size(shape)

    def _refused(self, name: str, src: Any, num_tokens: int) -> CaptureError:
        """The error for an input ``src`` that is not ``num_tokens`` rows of its buffer's dtype."""
        got = (f"{tuple(src.shape)} {src.dtype}" + (" on meta" if src.is_meta else "")
               if isinstance(src, torch.Tensor) else type(src).__name__)
        dtype = self.buffers[name].dtype
        return CaptureError(Problem(
            field=name, value=got, limit=f"must be {tuple(self._shape(name, num_tokens))} {dtype} for "
                                         f"num_tokens={num_tokens}",
            fix="pass a tensor of the static buffer's dtype with num_tokens rows on its token dim"))
