"""A compiled step's graphs hold no copy of a layer cache, and serving recompiles nothing.

Traced by ``torch.compile``, an in-place write into a view of the pool is functionalized into a copy
of the whole layer cache every call (a decode step then grew with the pool: 7 ms over 4 MiB, 892 ms
over 512 MiB). The K/V write is a mutating custom op outside the flex regions, and a model compiled
whole calls its attention and mixers as opaque ops, so no generated graph allocates a buffer the
size of a layer cache. (The timing across pool sizes is ``benchmarks/pool_scaling.py``.)
"""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import graphkv
from graphkv.hf import ServingLoop, tiny_model
from graphkv.runtime import Batch

from inductor_code import allocations
from torch_support import compiled_cpu_flex

LIMITS = graphkv.Limits(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64,
                        cudagraph_mode=graphkv.CudaGraphMode.FULL_DECODE_ONLY)
@pytest.mark.slow
@pytest.mark.parametrize("model_type, compile", [pytest.param("qwen3", True, marks=compiled_cpu_flex),  # regions only
                                                 ("qwen3", "model"), ("qwen3_next", "model")])
def test_a_compiled_decode_step_allocates_nothing_the_size_of_a_layer_cache(model_type: str, compile) -> None:
    """Every buffer the compiled prefill and decode graphs allocate is far below one layer cache."""
    model = tiny_model(model_type)
    loop = ServingLoop(model, limits=LIMITS, budget=graphkv.Budget.kv_bytes("16MiB"), compile=compile,
                       capture_graphs=False)
    groups = len(loop.plan.groups)
    ids = (0, 1, 2, 3)

    def steps():
        new = tuple(tuple((1 + i * groups + g,) for g in range(groups)) for i in ids)
        loop.run(Batch(req_ids=ids, query_lens=(5,) * 4, seq_lens=(5,) * 4, new_pages=new), input_ids=list(range(20)))
        loop.run(Batch(req_ids=ids, query_lens=(1,) * 4, seq_lens=(6,) * 4), input_ids=[1, 2, 3, 4])

    _, code = run_and_get_code(steps)
    assert code  # something was compiled
    smallest_cache = min(loop.pool.kv_cache(d.name).numel() for d in loop.plan.layers if not d.spec.is_ssm)
    largest = max(n for c in code for n in allocations(c, LIMITS.max_num_batched_tokens))
    assert largest * 16 < smallest_cache, (largest, smallest_cache)


def test_allocations_reads_generated_shapes() -> None:
    """The parser counts each allocated buffer's elements, symbolic dims at the given bound."""
    code = "buf0 = empty_strided_cpu((1, 4, s27, 16), (1, 2, 3, 4), torch.float32)\n" \
           "buf1 = empty_strided_cuda((8192, 16), (16, 1), torch.bfloat16)"
    assert allocations(code, 64) == [4 * 64 * 16, 8192 * 16]
