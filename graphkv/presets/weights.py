"""Weight bytes of each preset's public checkpoint, so ``--gpu`` budgets subtract real weights.

Each number is the checkpoint's ``model.safetensors.index.json`` ``metadata.total_size``: the
bytes of every tensor stored, multi-token-prediction layers included (engines load those only
for speculative decoding, so the budget errs on the safe side). Where the index could not be
read offline, the number is derived from the architecture's parameter count (Hugging Face
``transformers`` model of the public config, built on the meta device) and the checkpoint's
storage dtypes, and the comment says so.
"""

from __future__ import annotations

import types
from typing import Mapping

__all__ = ["PRESET_WEIGHT_BYTES", "preset_weight_bytes"]

PRESET_WEIGHT_BYTES: Mapping[str, int] = types.MappingProxyType({
    # Read: the index's total_size (8,030,261,248 bf16 parameters x 2 B; the derivation below agrees).
    "llama-3.1-8b": 16_060_522_496,
    # Derived: 79,674,391,296 parameters + 1,650,471,424 in the MTP layer (one full-attention
    # MoE layer + fc + norms), all bf16 x 2 B.
    "qwen3-next-80b-a3b": 162_649_725_440,
    # Derived: MXFP4 expert weights (114,661,785,600 parameters x 17/32 B: 4-bit values + one
    # scale byte per 32) + 2,167,371,072 bf16 parameters (attention, router, embeddings, biases) x 2 B.
    "gpt-oss-120b": 65_248_815_744,
    # Derived the same way: 19,110,297,600 MXFP4 expert parameters + 1,804,459,584 bf16 parameters.
    "gpt-oss-20b": 13_761_264_768,
    # Derived: 684,489,830,400 parameters (671.0 B + 13.5 B MTP layer 61); projections fp8 (1 B)
    # with a float32 scale per 128 x 128 tile, embeddings / heads / norms / routers bf16.
    "deepseek-v3": 688_472_043_584,
    # Derived: 51,570,323,328 bf16 parameters x 2 B (Jamba 1.5 Mini keeps Jamba v0.1's shape).
    "jamba-mini-1.5": 103_140_646_656,
    # Derived: 8,100,852,736 bf16 parameters x 2 B.
    "nemotron-h-8b": 16_201_705_472,
})


def preset_weight_bytes(name: str) -> int | None:
    """Bytes of preset ``name``'s checkpoint (all ranks together); ``None`` for an unknown preset."""
    return PRESET_WEIGHT_BYTES.get(name)
