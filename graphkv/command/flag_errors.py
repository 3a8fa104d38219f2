"""Speak the user's language: a planning error raised by the Python API names fields
(``Budget.kv_cache_bytes``, ``max_model_len``); on the command line it names the flag typed.

:func:`in_flag_terms` rewrites each problem's field to its flag and replaces field names inside
the limit and fix texts (whole identifiers only, so ``mamba_block_size`` is not read as
``block_size``), and "the KV budget" in a fix to ``--kv-memory`` when that flag sizes the pool.
Fields with no flag — a config.json field, a layer — are left as they are. The budget's value is
shown as typed (``--kv-memory='1.5'``), with the bytes it gave the pool.

:func:`in_tp_terms` turns the config head counts a ``--tp`` cannot split (one problem per count
in the Python API, so the API reports them all) into one problem on ``--tp`` that lists them and
the sizes that do split them.
"""

from __future__ import annotations

import re
import types
from typing import Callable, Mapping, Sequence

import attrs

from graphkv.errors import GraphkvError, Problem

__all__ = ["FIELD_FLAGS", "in_flag_terms", "in_tp_terms", "tp_split_problems"]

FIELD_FLAGS: Mapping[str, str] = types.MappingProxyType({
    "kv_cache_bytes": "--kv-memory",
    "weights_bytes": "--weights-memory",
    "activation_bytes": "--activation-memory",
    "graph_reserve_bytes": "--graph-reserve",
    "utilization": "--utilization",
    "gpu": "--gpu",
    "arch": "--arch",
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
    "max_cudagraph_capture_size": "--max-cudagraph-capture-size",
    "max_concurrent_batches": "--max-concurrent-batches",
    "speculative_lookahead_tokens": "--speculative-lookahead-tokens",
    "disable_hybrid_kv_cache_manager": "--disable-hybrid-kv-cache-manager",
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


def _text(text: str, flags: Mapping[str, str]) -> str:
    return _IN_TEXT.sub(lambda m: flags.get(m.group(1), m.group(1)), text)


def _problem(p: Problem, budget_flag: str, typed: Mapping[str, str | None], flags: Mapping[str, str]) -> Problem:
    field = p.field
    for owner in _OWNERS:
        if field.startswith(owner):
            field = field[len(owner):]
    flag = budget_flag if field == "budget" else flags.get(field, p.field)
    value, limit = p.value, _text(p.limit, flags)
    if field == "budget" and isinstance(p.value, str) and typed.get(flag) is not None:
        # the API names the pool's bytes ('1.00 KiB'); the user sees what they typed ('1KiB') and the bytes it gave
        value, limit = typed[flag], f"gives the KV pool {p.value}, which {limit}"
    fix = _text(p.fix, flags)
    if budget_flag == "--kv-memory":  # the budget is that flag's size: say which flag to raise
        fix = fix.replace("the KV budget", budget_flag)
    return attrs.evolve(p, field=flag, value=value, limit=limit, fix=fix)


def in_flag_terms(error: GraphkvError, *, budget_flag: str = "--kv-memory",
                  typed: Mapping[str, str | None] | None = None, has_flag: Callable[[str], bool] | None = None
                  ) -> GraphkvError:
    """The same error (same class) with fields and texts in flag terms; ``budget_flag`` stands for the
    budget as a whole (``--kv-memory`` or ``--gpu``), ``typed`` maps flags to the text the user typed.
    ``has_flag(flag)``: whether the command run has that flag (default: every flag of
    :data:`FIELD_FLAGS`); a field whose flag it lacks keeps its name (``graphkv demo`` fixes
    ``max_model_len``: "lower --max-model-len" would name a flag it does not take)."""
    flags = FIELD_FLAGS if has_flag is None else {k: v for k, v in FIELD_FLAGS.items() if has_flag(v)}
    return type(error)(*(_problem(p, budget_flag, typed or {}, flags) for p in error.problems))


def tp_split_problems(error: GraphkvError, tp: int) -> tuple[Problem, ...]:
    """The problems of ``error`` that are a config head count ``tp`` ranks cannot split (their limits
    name ``tp=<tp>``, as :mod:`graphkv.spec.split_rules` and the query-head check word them)."""
    named = re.compile(rf"\btp={tp}\b")
    return tuple(p for p in error.problems if p.field.startswith("config.") and named.search(p.limit))


def _sizes(values: Sequence[int]) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def in_tp_terms(error: GraphkvError, tp: int, valid: Sequence[int], *, up_to: int) -> GraphkvError:
    """``error`` with its :func:`tp_split_problems` replaced by one problem on ``--tp`` naming each
    count and ``valid`` (the sizes up to ``up_to`` that split every count); other problems are kept."""
    split = tp_split_problems(error, tp)
    if not split:
        return error
    counts = ", ".join(f"{p.field.removeprefix('config.')}={p.value}" for p in split)
    fix = (f"use --tp {_sizes(valid)}" if valid
           else f"no --tp up to {up_to} splits them; check the config's head counts")
    one = Problem(field="--tp", value=tp, fix=fix,
                  limit=f"does not split the model's heads over {tp} ranks ({counts}: each rank must hold a whole "
                        "number of each)")
    rest = tuple(p for p in error.problems if p not in split)
    return type(error)(one, *rest)
