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

from typing import Any, Callable

import torch

__all__ = ["tree_map", "weak_outputs", "weak_view"]


def tree_map(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    """``fn`` applied to every tensor of ``value`` (a tensor, or tuples, lists and dicts of them);
    anything else is returned as it is."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(tree_map(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: tree_map(fn, v) for k, v in value.items()}
    return value


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
