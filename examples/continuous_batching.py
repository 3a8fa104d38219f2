"""Serve the tiny hybrid model with continuous batching on graphkv's paged pool.

    python examples/continuous_batching.py            # CPU: eager; GPU: decode steps replay CUDA graphs

The loop a serving stack writes: compile a plan before any weight exists, allocate it, build a
Step, wrap the model's forward with graphkv.capture, capture, then per step hand graphkv a Batch
(request ids, new pages per group, query and sequence lengths). Requests arrive while others
decode; finished requests free their pages and later requests reuse them.
"""

from __future__ import annotations

import torch

import graphkv
from graphkv.models.demo_engine import DemoEngine, DemoRequest
from graphkv.models.paged_tiny_hybrid import PagedTinyHybrid
from graphkv.models.tiny_hybrid import TinyHybridConfig, dense_forward, init_weights, model_kv
from graphkv.runtime.pool.allocate import allocate
from graphkv.runtime.step.step import Step


def main() -> None:
    """Plan, allocate, capture, serve 8 requests, check one against the dense reference."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = TinyHybridConfig(pattern="MAMA")
    limits = graphkv.Limits(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=128,
                            cudagraph_mode=graphkv.CudaGraphMode.FULL_DECODE_ONLY)
    plan = graphkv.compile(model_kv(config), limits, graphkv.Budget.kv_bytes("1MiB"))
    print(f"plan: block_size={plan.block_size}, num_blocks={plan.num_blocks}, max_model_len={plan.max_model_len}, "
          f"groups={[g.kind.value for g in plan.groups]}, graphs={plan.cudagraph.mode.value}")

    weights = init_weights(config, seed=0)
    model = PagedTinyHybrid(weights.to(device), allocate(plan, device))
    step = Step(plan, device)
    forward = graphkv.capture(plan, static_inputs={"input_ids": step.input_ids})(model.forward)
    print(forward.capture(progress=True, prepare=step.capture_context))

    gen = torch.Generator().manual_seed(0)
    requests = [DemoRequest(req_id=f"req{i}", prompt=torch.randint(0, config.vocab_size, (n,), generator=gen).tolist(),
                            max_new_tokens=8) for i, n in enumerate([12, 70, 3, 41, 150, 9, 27, 64])]
    engine = DemoEngine(plan, step, forward)
    stats = engine.run(requests[:4], arrivals={3: requests[4:6], 6: requests[6:]})
    print(f"{stats.finished} requests in {stats.steps} steps, {stats.tokens} tokens, "
          f"{stats.pages_reused} pages reused, {stats.tokens / stats.seconds:,.0f} tokens/s")

    tokens = engine.finished["req2"]
    expect = dense_forward(weights, tokens)[len(requests[2].prompt) - 1:-1].argmax(-1).tolist()
    print(f"req2 generated {tokens[len(requests[2].prompt):]} (dense reference agrees: "
          f"{tokens[len(requests[2].prompt):] == expect})")


if __name__ == "__main__":
    main()
