"""Graph outputs that do not own their memory, so that every key of a pool shares it.

A CUDA graph's outputs live in its memory pool. Held as ordinary tensors they stay allocated, so each
captured key keeps its own copy of everything it returns: a decode key of ``n`` tokens keeps ``n``
rows of logits, a PIECEWISE piece keeps its hidden states, and a model's 90 keys keep them 90 times.
After capture graphkv keeps only *weak views* of them: tensors over the same addresses whose storage
does not own the memory. The pool then counts those blocks as free and hands them to the keys
captured after (smaller ones: keys are captured largest first), and every key's outputs share one
region. A replay still writes its outputs at the captured addresses, which the weak views read.

What this asks of a caller, as before: a replayed step's outputs are valid until the next replay of
*any* key of the pool (copy what you keep, or capture with ``copy_outputs=True``), and only while a
graph of the pool lives (PyTorch releases a private pool's memory once no graph uses it; PIECEWISE
pieces are held by the compiled forward's runners, FULL graphs by the captured forward). A weak view
protects nothing: ``record_stream`` on it is ignored, so read outputs on the stream that replayed
them. Only CUDA memory a graph pool hands out is viewed weakly; everything else a graph reads
(weights, the KV pool, static inputs, eager tensors staged for PIECEWISE pieces) stays owned.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

from graphkv.errors import CaptureError, Problem

__all__ = ["tree_map", "weak_outputs", "weak_view"]


def tree_map(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    """``fn`` applied to every tensor of ``value`` (a tensor, or tuples, lists and dicts of them, of
    their own types: a namedtuple, a ``torch.return_types`` result, a dict subclass such as
    transformers' ``ModelOutput`` — copied, then each item set — come back as what they were);
    anything else is returned as it is. A container that cannot be rebuilt so is refused with
    :class:`CaptureError`."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    kind = type(value)
    if kind is tuple or kind is list:
        return kind(tree_map(fn, v) for v in value)
    if kind is dict:
        return {k: tree_map(fn, v) for k, v in value.items()}
    if not isinstance(value, (tuple, list, dict)):
        return value
    try:
        if isinstance(value, dict):  # a copy keeps its class and what it holds beside the items (ModelOutput's
            out = copy.copy(value)  # attributes, which its __setitem__ keeps in step)
            for k, v in value.items():
                out[k] = tree_map(fn, v)
            return out
        items = [tree_map(fn, v) for v in value]
        if isinstance(value, tuple) and hasattr(kind, "_fields") and not hasattr(kind, "n_fields"):
            return kind(*items)  # a namedtuple (a torch.return_types structseq takes one sequence)
        return kind(items)
    except Exception as e:  # a container class graphkv cannot rebuild
        raise CaptureError(Problem(field="forward output", value=kind.__qualname__,
                                   limit=f"a {kind.__qualname__} could not be rebuilt around its cut tensors ({e})",
                                   fix="return a tensor, a tuple, list or dict of tensors, a namedtuple or a "
                                       "ModelOutput")) from e


def weak_view(t: torch.Tensor) -> torch.Tensor:
    """A tensor with ``t``'s dtype, shape, strides and storage offset over ``t``'s storage, which does
    not keep that storage allocated: once every owning reference is gone, its memory is free for the
    allocator (for a graph pool: for the next capture into the pool) while the view still reads it.
    The caller guarantees the memory stays reserved (a graph pool does, while its graphs live)."""
    storage = t.untyped_storage()
    borrowed = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(borrowed, t.storage_offset(), t.size(), t.stride())


def weak_outputs(outputs: Any) -> Any:
    """:func:`weak_view` of every CUDA tensor of ``outputs`` (see :func:`tree_map`); other tensors as they are
    (no pool holds their memory: a weak view of one whose only owner is the output would dangle)."""
    return tree_map(lambda t: weak_view(t) if t.is_cuda else t, outputs)
