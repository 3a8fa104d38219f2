"""A plan whose buffers beside the pool dwarf the pool: said in a note, not left to the reader.

``max_num_batched_tokens`` sizes the step's static device buffers (one row per token), and the
largest captured CUDA graph where ``max_cudagraph_capture_size`` lets the captures reach it, so a
typing slip (``1e10`` tokens per step) plans hundreds of GiB of buffers beside a pool of a few
GiB — a plan no GPU can hold. With a GPU
budget (``Budget.for_gpu``, ``--gpu``) :func:`graphkv.plan.gpu_fit.compile_for_gpu` fits them beside
the pool and refuses what does not fit, naming the largest ``max_num_batched_tokens`` that does.
With a byte budget or ``num_blocks_override`` graphkv knows no GPU, so it cannot refuse: the plan
gets a ``WARNING`` note (printed by ``graphkv plan``) when the device bytes beside the pool exceed
both the pool and :data:`NOTE_FLOOR_BYTES` (toy plans of a few MiB, whose step buffers outweigh
their pool by design, stay quiet).
"""

from __future__ import annotations

from graphkv.plan.ledger_entries import Ledger
from graphkv.spec.budget import KNOWN_GPUS, Budget, format_bytes
from graphkv.spec.limits import Limits

__all__ = ["NOTE_FLOOR_BYTES", "beside_pool_note"]

NOTE_FLOOR_BYTES = 1 << 30  # below 1 GiB beside the pool, no note: a test or demo plan


def beside_pool_note(ledger: Ledger, limits: Limits, budget: Budget | None, pool_bytes: int) -> str | None:
    """The warning for a plan (without a GPU budget) whose device bytes beside the pool (static buffers,
    allocator rounding, cuBLAS workspaces, estimated graph pool) exceed its ``pool_bytes`` KV pool and
    1 GiB; ``None`` otherwise."""
    if budget is not None and budget.gpu is not None:
        return None  # compile_for_gpu fits them (or refuses); a plain compile keeps its caller's choice
    beside = ledger.beside_pool_device_bytes
    if beside <= max(pool_bytes, NOTE_FLOOR_BYTES):
        return None
    parts = " + ".join(f"{e.name} {format_bytes(e.nbytes)}" for e in ledger.other_entries if e.on_device)
    largest = max(KNOWN_GPUS.values(), key=lambda g: g.total_memory_bytes)
    beyond = (f", more than any known GPU holds ({largest.name}: {format_bytes(largest.total_memory_bytes)})"
              if beside > largest.total_memory_bytes else "")
    grows, lower = "the step buffers grow with it", "Lower max_num_batched_tokens (vLLM's defaults are 2048-8192)"
    if limits.max_cudagraph_capture_size is not None:
        grows += f", the graph pool with max_cudagraph_capture_size={limits.max_cudagraph_capture_size}"
        lower += " or max_cudagraph_capture_size (vLLM's default: min(2 x max_num_seqs, 512))"
    return (f"WARNING: max_num_batched_tokens={limits.max_num_batched_tokens} puts {format_bytes(beside)} on the GPU "
            f"beside the KV pool ({parts}), more than the {format_bytes(pool_bytes)} pool itself{beyond}; {grows}. "
            f"{lower}, or plan with a GPU budget (--gpu NAME / Budget.for_gpu with compile_for_gpu), which fits "
            "them beside the pool and names the largest max_num_batched_tokens that does")
