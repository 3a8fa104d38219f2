"""What the graphkv.hf tests share: the workload, transformers' own answers, a Step that records batches."""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import torch

from graphkv import CudaGraphMode, Limits

NEW_TOKENS = 8
PROMPT_LENGTHS = (5, 40, 17, 70, 3, 33, 9, 50)  # the 70-token prompt is longer than a step's 32 tokens
LIMITS = Limits(max_model_len=96, max_num_seqs=4, max_num_batched_tokens=32,
                cudagraph_mode=CudaGraphMode.FULL_DECODE_ONLY)


def prompts(lengths: Sequence[int] = PROMPT_LENGTHS, *, vocab: int = 128, seed: int = 1) -> list[list[int]]:
    """Random prompts of ``lengths`` tokens (fixed seed)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


@torch.no_grad()
def generate_alone(model: Any, prompt: Sequence[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    """``model.generate(prompt, do_sample=False)`` for one prompt alone, on the model's device: prompt + generated
    tokens."""
    ids = torch.tensor([list(prompt)], device=model.device)
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          do_sample=False)[0].tolist()


def serving_loop(model: Any, **kwargs: Any) -> Any:
    """A :class:`~graphkv.hf.ServingLoop` for ``model`` under the test limits, its pool sized for the workload."""
    from graphkv.hf import ServingLoop
    from graphkv.hf.declare import model_kv
    from graphkv.hf.generation import workload_budget

    return ServingLoop(model, limits=LIMITS, budget=workload_budget(model_kv(model), LIMITS), **kwargs)


@torch.no_grad()
def own_logits(model: Any, tokens: Sequence[int]) -> torch.Tensor:
    """The model's own full-sequence forward: logits ``[len(tokens), vocab]``."""
    return model(torch.tensor([list(tokens)])).logits[0]


class RecordingStep:
    """A :class:`~graphkv.runtime.step.Step` stand-in for the engine that records every batch it runs."""

    def __init__(self, step: Any) -> None:
        self.step = step
        self.batches: list[Any] = []

    def run(self, forward: Any, batch: Any, *, input_ids: Any) -> Any:
        """Record ``batch``, then run it on the real step."""
        self.batches.append(batch)
        return self.step.run(forward, batch, input_ids=input_ids)

    def finish(self, req_id: Hashable) -> None:
        """Finish ``req_id`` on the real step."""
        self.step.finish(req_id)


def joined_while_others_decoded(batches: Sequence[Any]) -> bool:
    """Whether some step admitted a new request's prefill while another request decoded one token."""
    seen: set = set()
    for batch in batches:
        new = [r for r in batch.req_ids if r not in seen]
        decoding = [r for r, q in zip(batch.req_ids, batch.query_lens) if q == 1 and r in seen]
        if new and decoding:
            return True
        seen.update(batch.req_ids)
    return False


def prefill_chunks(batches: Sequence[Any], req_id: Hashable, prompt_len: int) -> list[int]:
    """The query lengths of the steps that prefilled ``req_id``'s ``prompt_len``-token prompt."""
    return [q for b in batches for r, q, s in zip(b.req_ids, b.query_lens, b.seq_lens)
            if r == req_id and s <= prompt_len]
