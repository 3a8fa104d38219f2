"""The K/V write as a mutating torch custom op, so a compiled graph writes only the step's slots.

Traced inside ``torch.compile``, an ``index_put_`` into a view of the pool is functionalized: the
graph computes a new copy of the whole layer cache and copies it back, every call (on a CPU a
compiled decode step of a tiny model cost 7 ms over a 4 MiB pool and 892 ms over a 512 MiB one).
``graphkv::reshape_and_cache`` declares that it mutates ``kv_cache`` and is opaque to the
compiler, so the compiled graph calls it in place: one write of the step's tokens, whatever the
pool's size.

:func:`write_kv_op` is what layers call: outside a compiled region it runs the implementation
directly (no custom-op dispatch cost), inside one it emits the op.

Example::

    write_kv_op(k, v, pool.kv_cache(name), ctx.slot_mappings[g], layout=pool.layout(name), kernels="triton")
"""

from __future__ import annotations

import torch

from graphkv.runtime.ops.choice import write_kv
from graphkv.spec.backends import CacheOrder, KVLayout, StrideOrder

__all__ = ["write_kv_op"]


@torch.library.custom_op("graphkv::reshape_and_cache", mutates_args=("kv_cache",))
def _reshape_and_cache_op(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None,
                          slot_mapping: torch.Tensor, order: str, stride: str, kernels: str) -> None:
    write_kv(key, value, kv_cache, slot_mapping, layout=KVLayout(order=CacheOrder(order), stride=StrideOrder(stride)),
             kernels=kernels)


@_reshape_and_cache_op.register_fake
def _(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None, slot_mapping: torch.Tensor, order: str,
      stride: str, kernels: str) -> None:
    return None


def write_kv_op(key: torch.Tensor, value: torch.Tensor | None, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                *, layout: KVLayout, kernels: str = "auto") -> None:
    """:func:`~graphkv.runtime.ops.choice.write_kv` (same arguments, checks and semantics: ``key`` /
    ``value`` ``[num_tokens, H, D]`` written at ``slot_mapping[:num_tokens]``, negative slots
    skipped), as the mutating custom op ``graphkv::reshape_and_cache`` when traced by
    ``torch.compile`` and directly otherwise. Capture-safe on the Triton path."""
    if torch.compiler.is_compiling():
        torch.ops.graphkv.reshape_and_cache(kv_cache, key, value, slot_mapping, layout.order.value,
                                            layout.stride.value, kernels)
    else:
        write_kv(key, value, kv_cache, slot_mapping, layout=layout, kernels=kernels)
