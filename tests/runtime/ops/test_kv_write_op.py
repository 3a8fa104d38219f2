"""The K/V write as a mutating custom op: traced by torch.compile it writes in place, only the step's slots."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from graphkv.runtime.ops.kv_write_op import write_kv_op
from graphkv.runtime.ops.reference import reshape_and_cache_ref
from graphkv.spec.backends import CacheOrder, KVLayout

from inductor_code import allocations

LAYOUT = KVLayout(order=CacheOrder.KV_FIRST)


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_a_compiled_write_equals_the_reference_and_copies_no_cache(kernels: str) -> None:
    """A compiled function calling write_kv_op writes what the reference writes (padding skipped), in place."""
    cache = torch.zeros(2, 512, 16, 2, 16)
    slots = torch.tensor([17, 18, 95, -1, 40, -1, 16 * 300 + 3], dtype=torch.int64)
    gen = torch.Generator().manual_seed(3)
    key, value = torch.randn(7, 2, 16, generator=gen), torch.randn(7, 2, 16, generator=gen)

    def write_then_read(cache, key, value, slots):
        write_kv_op(key, value, cache, slots, layout=LAYOUT, kernels=kernels)
        return cache[0, 1].sum()  # a read after the write: the compiler must order it after the op

    expected = cache.clone()
    reshape_and_cache_ref(key, value, expected, slots, layout=LAYOUT)
    out, code = run_and_get_code(torch.compile(write_then_read, fullgraph=True), cache, key, value, slots)
    assert torch.equal(cache, expected)  # the caller's cache itself was written
    torch.testing.assert_close(out, expected[0, 1].sum())
    assert code and max(allocations("\n".join(code), 7), default=0) * 16 < cache.numel()
