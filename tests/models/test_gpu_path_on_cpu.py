"""The README's serving example on the GPU path: Triton kernels, staged tables, padded graph keys.

On a CPU the path runs with ``Step(plan, "cpu", kernels="triton")`` and a rehearsed capture (every
key warmed up, every step dispatched and padded as a replay would be, run eagerly); on a GPU with
real CUDA graphs. Either way the logits equal the dense reference, whose steps include a mixed
prefill of three requests, a 2-request decode and a 3-request decode padded to 4 rows.
"""

from __future__ import annotations

import pytest
import torch

import graphkv
from graphkv.models.paged_tiny_hybrid import PagedTinyHybrid
from graphkv.models.tiny_hybrid import TinyHybridConfig, dense_forward, init_weights, model_kv
from graphkv.runtime import Batch, Step, allocate
from graphkv.runtime.capture.keys import GraphKey

MODES = (graphkv.CudaGraphMode.FULL_DECODE_ONLY, graphkv.CudaGraphMode.FULL_AND_PIECEWISE)  # the latter: the default


def _serve(device: str, mode: graphkv.CudaGraphMode):
    """The README example's model on ``device``'s GPU path; returns (step, forward, weights)."""
    config = TinyHybridConfig()
    limits = graphkv.Limits(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64, cudagraph_mode=mode)
    plan = graphkv.compile(model_kv(config), limits, graphkv.Budget.kv_bytes("1MiB"))
    weights = init_weights(config, seed=0)
    pool = allocate(plan, device)
    step = Step(plan, device, kernels="triton")
    model = PagedTinyHybrid(weights.to(device), pool, kernels="triton")
    forward = graphkv.capture(plan, static_inputs={"input_ids": step.input_ids})(model.forward)
    report = forward.capture(progress=False, prepare=step.capture_context, rehearse=device == "cpu")
    assert report.keys and report.rehearsed == (device == "cpu")
    return step, forward, weights


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_readme_serving_example_on_the_gpu_path_equals_the_dense_reference(device: str, mode) -> None:
    """Mixed prefill of three, a 2-request decode and a 3-request decode padded to 4 rows: logits equal dense to 1e-4."""
    step, forward, weights = _serve(device, mode)
    seqs = {"a": [5, 17, 42, 8, 3, 11, 60], "b": list(range(20, 40)), "c": [7, 7, 1, 90, 4]}
    # Groups are (state, attention): a state page each, and the attention pages each prompt needs.
    new = (((1,), (2,)), ((3,), (4, 5)), ((6,), (7,)))
    shapes = []

    def run(req_ids, query_lens, new_pages=()):
        ids = [t for r, q in zip(req_ids, query_lens) for t in seqs[r][-q:]]
        batch = Batch(req_ids=req_ids, query_lens=query_lens, seq_lens=tuple(len(seqs[r]) for r in req_ids),
                      new_pages=new_pages)
        logits = step.run(forward, batch, input_ids=ids)
        shapes.append(step.shape)  # the StepShape every consumer read
        ends = torch.cumsum(torch.tensor(query_lens), 0) - 1
        for r, row in zip(req_ids, logits[ends].cpu()):
            torch.testing.assert_close(row, dense_forward(weights, seqs[r])[-1], atol=1e-4, rtol=1e-4)
            seqs[r].append(int(row.argmax()))

    run(("a", "b", "c"), (7, 20, 5), new)        # a mixed prefill of three requests
    run(("a", "b"), (1, 1))                      # a 2-request decode: key 2
    run(("a", "b", "c"), (1, 1, 1))              # a 3-request decode padded to 4 rows
    assert shapes[1].key == GraphKey(num_tokens=2, num_reqs=2, uniform=True)
    last = shapes[2]
    assert last.key == GraphKey(num_tokens=4, num_reqs=4, uniform=True)
    assert (last.num_tokens, last.num_reqs, last.num_tokens_padded, last.num_reqs_padded) == (3, 3, 4, 4)
    attention = next(g.index for g in step.plan.groups if not g.is_ssm)
    assert int(step.tables.input_tables[attention][3].abs().sum()) == 0  # the padded row reads the null page
    assert step.token_row[3] == -1
    # The prefill: FULL_DECODE_ONLY runs mixed steps eagerly; the default mode's mixed keys are PIECEWISE, and
    # the tiny hybrid's forward has no piecewise runners, so they run eagerly too (as on a GPU).
    assert shapes[0].key is None and shapes[0].num_tokens_padded == 32
