"""Decode steps of graphkv.hf through graphkv's split-KV paged decode kernel, against flex on the same steps.

On the GPU path (``kernels="triton"``: on a CPU the kernels run in Triton's interpreter) a one-token
decode step attends through :func:`graphkv.kernels.paged_attention.paged_decode_attention`, which
reads the block tables directly, and builds no flex mask; every other step keeps flex. The same
prompts served with ``decode_attention="flex"`` give the reference logits: full attention
(qwen3), a sliding window (mistral) and a sliding window with attention sinks (gpt-oss).
"""

from __future__ import annotations

import pytest
import torch

from graphkv import SpecError
from graphkv.hf.tiny import tiny_model
from graphkv.runtime.capture.keys import GraphKey
from graphkv.runtime.capture.shape import current_shape
from graphkv.runtime.step.context import StepContext
from graphkv.runtime.step.batch import Batch

from hf_harness import serving_loop


def _decode_logits(loop, prompt_lengths, num_decodes: int) -> list[torch.Tensor]:
    """Prefill ``prompt_lengths`` prompts in one step, then ``num_decodes`` decode steps of their greedy
    tokens: every step's logits (copied: a replayed step's outputs live until the next replay)."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in prompt_lengths]
    ids = [f"r{i}" for i in range(len(prompts))]
    pages = loop.plan.block_size
    held = [1 + (n + num_decodes) // pages for n in prompt_lengths]
    new_pages, first = [], 1
    for count in held:  # each group its own pages (one pool: page IDs are distinct across groups)
        per_group = []
        for _ in loop.plan.groups:
            per_group.append(tuple(range(first, first + count)))
            first += count
        new_pages.append(tuple(per_group))
    batch = Batch(req_ids=tuple(ids), query_lens=tuple(prompt_lengths), seq_lens=tuple(prompt_lengths),
                  new_pages=tuple(new_pages))
    out = [loop.run(batch, input_ids=[t for p in prompts for t in p]).clone()]
    lens = list(prompt_lengths)
    for _ in range(num_decodes):
        nxt = out[-1][:len(ids)].argmax(-1).tolist()
        lens = [n + 1 for n in lens]
        batch = Batch(req_ids=tuple(ids), query_lens=(1,) * len(ids), seq_lens=tuple(lens),
                      new_pages=(None,) * len(ids))
        out.append(loop.run(batch, input_ids=nxt).clone())
    return out


# flex's decode mask builds: a warm-up and a capture (a rehearsal on a CPU) for each of the 3 decode keys, and on a
# CPU the 4 decode steps (a GPU replays them)
FLEX_DECODE_BUILDS = {"cpu": 3 * 2 + 4, "cuda": 3 * 2}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "mistral", "gpt_oss"])
def test_decode_kernel_matches_flex_and_builds_no_mask(family: str, device: str, monkeypatch) -> None:
    """Three requests (2, 4 and 26 tokens, one step's 32; the last past the 24-token window) decode 4 steps: the
    kernel's logits equal flex's to 1e-4 at every step, and its decode forwards build no flex mask (flex's build
    one per forward: the warm-ups and graphs of its 3 decode keys, and on a CPU the 4 decode steps). With
    ``compile=False`` on a GPU the flex regions are compiled all the same, so its decode steps are captured."""
    model = tiny_model(family).to(device)
    logits, builds = {}, {"kernel": 0, "flex": 0}
    build_masks = StepContext.build_masks

    def counting(ctx, num_tokens):  # decode-shaped forwards only; a replayed graph rebuilds its masks without a call
        shape = current_shape()
        builds[choice] += shape is not None and shape.uniform
        return build_masks(ctx, num_tokens)

    monkeypatch.setattr(StepContext, "build_masks", counting)
    for choice in ("kernel", "flex"):
        loop = serving_loop(model, compile=False, kernels="triton", decode_attention=choice)
        assert loop.model.decode_attention == choice
        assert loop.capture_report.keys == (GraphKey(num_tokens=4, num_reqs=4, uniform=True),
                                            GraphKey(num_tokens=2, num_reqs=2, uniform=True),
                                            GraphKey(num_tokens=1, num_reqs=1, uniform=True))
        # the 3 decodes pad to the decode(4) key: still one token per row, so the kernel serves them
        logits[choice] = _decode_logits(loop, (2, 4, 26), num_decodes=4)
    assert builds == {"kernel": 0, "flex": FLEX_DECODE_BUILDS[device]}
    for step, (ours, theirs) in enumerate(zip(logits["kernel"], logits["flex"])):
        assert torch.allclose(ours[:3], theirs[:3], atol=1e-4, rtol=1e-4), (family, step)


def test_decode_attention_choice_is_checked(device: str) -> None:
    """An unknown decode_attention is a SpecError naming the choices; the default is the kernel on the GPU path,
    flex otherwise."""
    model = tiny_model("qwen3").to(device)
    with pytest.raises(SpecError, match="decode_attention='flash': must be one of kernel, flex or None"):
        serving_loop(model, compile=False, kernels="triton", decode_attention="flash", capture_graphs=False)
    assert serving_loop(model, compile=False, kernels="triton",
                        capture_graphs=False).model.decode_attention == "kernel"
    if device == "cpu":
        assert serving_loop(model, compile=False, capture_graphs=False).model.decode_attention == "flex"


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "gpt_oss"])
def test_long_context_decode_splits_and_matches_flex(family: str, device: str) -> None:
    """With a 512-token plan the kernel splits each sequence (8 ways: its workspace holds more than one partial row)
    and prompts of 2, 150 and 300 tokens (the longest over several of the kernel's tiles, the shortest leaving
    splits empty) decode 2 steps with flex's logits to 1e-4."""
    from graphkv import CudaGraphMode, Limits
    from graphkv.hf import ServingLoop
    from graphkv.hf.declare import model_kv
    from graphkv.hf.generation import workload_budget

    limits = Limits(max_model_len=512, max_num_seqs=4, max_num_batched_tokens=512,
                    cudagraph_mode=CudaGraphMode.FULL_DECODE_ONLY)
    model = tiny_model(family).to(device)
    logits = {}
    for choice in ("kernel", "flex"):
        loop = ServingLoop(model, limits=limits, budget=workload_budget(model_kv(model), limits), compile=False,
                           kernels="triton", decode_attention=choice)
        if choice == "kernel":
            workspaces = {b.workspace.shape for b in loop.model.attention.values()}
            assert all(rows > 1 for rows, _, _ in workspaces), workspaces
        logits[choice] = _decode_logits(loop, (2, 150, 300), num_decodes=2)
    for step, (ours, theirs) in enumerate(zip(logits["kernel"], logits["flex"])):
        assert torch.allclose(ours[:3], theirs[:3], atol=1e-4, rtol=1e-4), (family, step)


def test_flex_regions_are_compiled_on_a_gpu_whatever_compile_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile=False leaves flex eager on a CPU only: on a CUDA device eager flex cannot be captured (H100). Before
    torch 2.13 a CPU runs every region eagerly (torch 2.11's CPU flex template aborts on the regions' K/V views)."""
    from graphkv.runtime.flex.region import cpu_flex_compiles, region_compiled

    assert [cpu_flex_compiles(v) for v in ("2.11.0+cu130", "2.12.1", "2.13.0", "2.13.0.dev20261101+cpu", "2.14.0",
                                           "3.0.0", "10.1", "unknown")] == [False, False, True, True, True, True,
                                                                           True, False]
    modes = (False, True)
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    assert [region_compiled(c, "cpu", return_lse=False) for c in modes] == [False, False]
    assert [region_compiled(c, "cuda", return_lse=False) for c in modes] == [True, True]
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    assert [region_compiled(c, "cpu", return_lse=False) for c in modes] == [False, True]
    assert [region_compiled(c, "cuda", return_lse=False) for c in modes] == [True, True]
    # a CPU's compiled flex returns no log-sum-exp (sinks): eager there; a GPU's does
    assert [region_compiled(c, "cpu", return_lse=True) for c in modes] == [False, False]
    assert [region_compiled(c, "cuda", return_lse=True) for c in modes] == [True, True]
