"""graphkv.hf on a GPU: decode steps replayed from CUDA graphs equal eager steps and transformers."""

from __future__ import annotations

import pytest
import torch

from graphkv.hf import tiny_model
from graphkv.hf.tiny import CORE_FAMILIES
from graphkv.models.demo_engine import DemoRequest

from hf_harness import NEW_TOKENS, generate_alone, prompts, serving_loop

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: CUDA graphs and compiled GPU flex cannot run on a CPU")


def serve(model, *, capture_graphs: bool):
    """Serve the test workload on the GPU with per-step logits recorded."""
    loop = serving_loop(model, logits="all", capture_graphs=capture_graphs)
    engine = loop.engine(record=True)
    engine.run([DemoRequest(req_id=i, prompt=p, max_new_tokens=NEW_TOKENS) for i, p in enumerate(prompts())])
    return loop, engine


@pytest.mark.parametrize("model_type", CORE_FAMILIES)
def test_captured_run_equals_eager_and_generate(model_type: str) -> None:
    """Decode steps replay captured graphs; tokens equal the eager run's and model.generate's, logits eager's."""
    model = tiny_model(model_type).cuda()
    loop, captured = serve(model, capture_graphs=True)
    assert loop.capture_report.keys, loop.graphs
    _, eager = serve(model, capture_graphs=False)
    assert captured.finished == eager.finished
    for i, prompt in enumerate(prompts()):
        assert captured.finished[i] == generate_alone(model, prompt)
    replayed = {(r, p): row for r, p, row in captured.records}
    for r, p, row in eager.records:
        torch.testing.assert_close(replayed[(r, p)], row, atol=2e-3, rtol=2e-3)
