"""Speak the user's language: a planning error raised by the Python API names fields
(``Budget.kv_cache_bytes``, ``max_model_len``); on the command line it names the flag typed.

:func:`in_flag_terms` rewrites each problem's field to its flag and replaces field names inside
the limit and fix texts (whole identifiers only, so ``mamba_block_size`` is not read as
``block_size``). Fields with no flag — a config.json field, a layer — are left as they are.
"""

from __future__ import annotations

import re
import types
from typing import Mapping

import attrs

from graphkv.errors import GraphkvError, Problem

__all__ = ["FIELD_FLAGS", "in_flag_terms"]

FIELD_FLAGS: Mapping[str, str] = types.MappingProxyType({
    "kv_cache_bytes": "--kv-memory",
    "weights_bytes": "--weights-memory",
    "activation_bytes": "--activation-memory",
    "graph_reserve_bytes": "--graph-reserve",
    "utilization": "--utilization",
    "gpu": "--gpu",
    "max_model_len": "--max-model-len",
    "concurrency": "--concurrency",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "num_blocks_override": "--num-blocks-override",
    "mamba_cache_mode": "--mamba-cache-mode",
    "num_speculative_tokens": "--num-speculative-tokens",
    "tensor_parallel_size": "--tp",
    "tp": "--tp",
    "tp_size": "--tp",
    "pp_size": "--pp",
    "partition": "--pp-partition",
    "block_size": "--block-size",
    "mamba_block_size": "--mamba-block-size",
    "cudagraph_mode": "--cudagraph-mode",
    "kv_cache_dtype": "--kv-cache-dtype",
    "mamba_ssm_dtype": "--mamba-ssm-dtype",
    "attention_backend": "--attention-backend",
    "preset": "--preset",
})
_OWNERS = ("Limits.", "Budget.")
# Identifiers with an underscore are unambiguous in prose, and so is "concurrency" (only ever the limit);
# other bare words (gpu, tp, preset) are not.
_IN_TEXT = re.compile(r"(?<![\w.\-])(" + "|".join(
    sorted((re.escape(k) for k in FIELD_FLAGS if "_" in k or k == "concurrency"), key=len, reverse=True))
    + r")(?!\w)")


def _text(text: str) -> str:
    return _IN_TEXT.sub(lambda m: FIELD_FLAGS[m.group(1)], text)


def _problem(p: Problem, budget_flag: str) -> Problem:
    field = p.field
    for owner in _OWNERS:
        if field.startswith(owner):
            field = field[len(owner):]
    flag = budget_flag if field == "budget" else FIELD_FLAGS.get(field, p.field)
    return attrs.evolve(p, field=flag, limit=_text(p.limit), fix=_text(p.fix))


def in_flag_terms(error: GraphkvError, *, budget_flag: str = "--kv-memory") -> GraphkvError:
    """The same error (same class) with fields and texts in flag terms; ``budget_flag`` stands for the
    budget as a whole (``--kv-memory`` or ``--gpu``)."""
    return type(error)(*(_problem(p, budget_flag) for p in error.problems))
