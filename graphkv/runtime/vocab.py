"""Token ids checked against a model's vocabulary in one reduction, wherever graphkv feeds a model.

An embedding reads a negative id as another token (a silent wrong answer) and raises a bare
``IndexError`` (on a GPU: a device assert) for one past its table. :func:`check_token_ids` refuses
both, naming where the id sits — a step's packed ``input_ids`` (:meth:`Step.run
<graphkv.runtime.step.step.Step.run>`), a prompt of :func:`graphkv.hf.generate` or a demo engine's
request — with one reduction over all the ids, not a loop over tokens.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from graphkv.errors import Problem, SpecError

__all__ = ["check_token_ids"]

_NO_VOCAB = 1 << 63  # without a vocabulary size only negative ids (>= 2**63 as uint64) are refused


def check_token_ids(ids: Any, vocab_size: int | None, field_of: Callable[[int], str]) -> None:
    """Raise :class:`SpecError` naming ``field_of(i)``, the id and ``vocab_size`` for the first id of ``ids``
    (``[n]`` int64 numpy array or integer tensor) outside ``[0, vocab_size)`` (``None``: only a negative id
    is refused). One reduction: a numpy array's ids viewed as uint64 (a negative id becomes huge); a
    tensor's ``aminmax`` (one host sync for a device tensor). Not capture-safe (host work, before the
    forward)."""
    limit = _NO_VOCAB if vocab_size is None else vocab_size
    if isinstance(ids, np.ndarray):
        wide = ids.astype(np.int64, copy=False).view(np.uint64)
        if not wide.size or int(wide.max()) < limit:
            return
        i = int(np.flatnonzero(wide >= limit)[0])
    else:
        import torch

        if not ids.numel():
            return
        lo, hi = torch.stack(torch.aminmax(ids)).tolist()  # one copy to the host
        if lo >= 0 and hi < limit:
            return
        wide = ids.long()  # a narrow dtype (int8, int16) would wrap ``vocab_size`` in the comparison
        outside = wide < 0 if vocab_size is None else (wide < 0) | (wide >= vocab_size)  # no 2**63 in int64 either
        i = int(outside.nonzero()[0, 0])
    value = int(ids[i])
    read = "would read another token's embedding" if value < 0 else "is past the embedding table"
    span = "must not be negative" if vocab_size is None else f"must be in [0, vocab_size={vocab_size})"
    raise SpecError(Problem(field=field_of(i), value=value, limit=f"token ids {span}; {value} {read}",
                            fix="pass token ids of this model's vocabulary (tokenize with its tokenizer)"))
