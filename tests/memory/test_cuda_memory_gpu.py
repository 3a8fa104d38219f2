"""On a GPU, in a fresh process: allocate(plan, 'cuda') and Step(plan, 'cuda') grow torch.cuda.memory_allocated
and memory_reserved by exactly plan.ledger.cuda_memory(), pool and static buffers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: the real caching allocator (tests/plan/test_cuda_memory.py "
                                       "checks the ledger's numbers on a CPU)")

_MEASURE = """
import json, sys, torch
from graphkv import Budget, Limits, compile_plan
from graphkv.models.demo import DemoOptions, demo_plan
from graphkv.presets import preset_model
from graphkv.runtime import Step, allocate

name = sys.argv[1]
if name == "demo":
    plan = demo_plan(DemoOptions())
else:  # 1045 pages: 32 slots of 65 MiB + 1.3 MiB, each taking a whole 2 MiB-rounded segment
    plan = compile_plan(preset_model(name), Limits(), Budget.kv_bytes(1045 * 2 * 1024 * 1024))

def counters():
    torch.cuda.synchronize()
    return [torch.cuda.memory_allocated(), torch.cuda.memory_reserved()]

torch.empty(0, device="cuda")
assert counters() == [0, 0], "the allocator is not empty"
pool = allocate(plan, "cuda")
after_pool = counters()
step = Step(plan, "cuda")
after_step = counters()
memory = plan.ledger.cuda_memory()
print(json.dumps({"measured": [after_pool, [a - b for a, b in zip(after_step, after_pool)]],
                  "predicted": [[memory.pool.allocated_bytes, memory.pool.reserved_bytes],
                                [memory.static_buffers.allocated_bytes, memory.static_buffers.reserved_bytes]]}))
"""


@pytest.mark.parametrize("name", ["demo", "llama-3.1-8b"])
def test_pool_and_static_buffers_are_charged_what_the_ledger_says(name):
    """The pool, then the step's buffers: (allocated, reserved) growth equals the ledger's caching-allocator charge."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}  # the default allocator
    proc = subprocess.run([sys.executable, "-c", _MEASURE, name], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["measured"] == got["predicted"]
