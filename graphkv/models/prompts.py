"""Prompts as token ids: converted once, checked against a model's vocabulary in one reduction.

A prompt may be a list or tuple of ints (numpy ints too), a 1-D integer numpy array or a 1-D
integer tensor. :func:`prompt_ids` makes it one int64 array and refuses text, an empty prompt,
floats, bools (a bool dtype or a ``True`` in a list), ``None``, unordered containers (a dict or a
set: their order is no order of tokens) and arrays of another rank, naming the field.
:func:`check_vocab` refuses a token id outside ``[0, vocab_size)`` over all prompts at once
(:func:`graphkv.runtime.vocab.check_token_ids` on their concatenation), naming the prompt and the
token's position in it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from graphkv.errors import Problem, SpecError
from graphkv.runtime.tables.page_ids import int_array
from graphkv.runtime.vocab import check_token_ids
from graphkv.spec._checks import whole_int

__all__ = ["check_vocab", "prompt_ids", "stop_token_ids"]


def prompt_ids(value: Any, field: str) -> np.ndarray:
    """``value`` (one prompt) as a 1-D int64 array of its token ids; :class:`SpecError` naming
    ``field`` for anything else (see the module docstring)."""
    if isinstance(value, (str, bytes, bytearray)):
        raise SpecError(Problem(field=field, value=value[:40], limit="is text, not token ids",
                                fix="tokenize first, e.g. tokenizer(text).input_ids"))
    if type(value).__module__.startswith("torch") and hasattr(value, "dtype") and hasattr(value, "numpy"):
        dtype = value.dtype
        if dtype.is_floating_point or dtype.is_complex or str(dtype) == "torch.bool" or value.dim() != 1:
            raise SpecError(Problem(field=field, value=f"tensor of dtype {dtype}, shape {tuple(value.shape)}",
                                    limit="token ids must be a 1-D integer tensor or a sequence of ints",
                                    fix="pass e.g. torch.tensor([...], dtype=torch.int64) or a list of ints"))
        value = value.detach().cpu().numpy()
    ids = int_array(value, field, "token ids")
    if not ids.size:
        raise SpecError(Problem(field=field, value=[], limit="is empty; a prompt needs at least one token id",
                                fix="give every prompt at least one token (e.g. the tokenizer's BOS token)"))
    return ids


def check_vocab(prompts: Sequence[np.ndarray], vocab_size: int | None,
                field_of: Callable[[int], str] = lambda i: f"prompts[{i}]") -> None:
    """Raise :class:`SpecError` naming ``field_of(prompt)[position]``, the id and ``vocab_size`` for the
    first token id of ``prompts`` (int64 arrays) outside ``[0, vocab_size)`` (``None``: only negative ids
    are refused). One concatenation and one reduction over every prompt."""
    if not prompts:
        return
    ends = np.cumsum([p.shape[0] for p in prompts])

    def field(at: int) -> str:
        which = int(np.searchsorted(ends, at, side="right"))
        return f"{field_of(which)}[{at - (int(ends[which]) - prompts[which].shape[0])}]"

    check_token_ids(prompts[0] if len(prompts) == 1 else np.concatenate(prompts), vocab_size, field)


def stop_token_ids(value: Any, field: str) -> frozenset[int]:
    """``value`` — the token ids that end a request: ``None`` (none), one id, or a list, tuple, set or
    1-D integer array / tensor of ids (each an integer of any kind, as transformers'
    ``generation_config.eos_token_id`` may be) — as a frozenset of Python ints. :class:`SpecError`
    naming ``field`` for a bool, a float, text, a negative id or a nested sequence (an id that could
    never be generated would silently never stop the request).

    >>> sorted(stop_token_ids([2, 7], "stop")), stop_token_ids(None, "stop"), stop_token_ids(5, "stop")
    ([2, 7], frozenset(), frozenset({5}))
    """
    if value is None:
        return frozenset()
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a tensor, read on the host
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    many = isinstance(value, (list, tuple, set, frozenset))
    items = list(value) if many else [value]
    ids = [whole_int(item) for item in items]
    for i, (item, whole) in enumerate(zip(items, ids)):
        if whole is None or whole < 0:
            raise SpecError(Problem(field=f"{field}[{i}]" if many else field, value=item if whole is None else whole,
                                    limit="must be token ids >= 0: an int, or a list of ints",
                                    fix="pass the end-of-sequence ids of this model's tokenizer, e.g. [2]"))
    return frozenset(ids)  # type: ignore[arg-type]
