"""``graphkv.hf.generate``: greedy continuous batching of a transformers model on graphkv."""

from __future__ import annotations

import numbers
import time
from typing import Any, Sequence

import attrs
import torch

from graphkv.command.compile_flag import graph_mode_for
from graphkv.errors import CapacityError, Problem, SpecError
from graphkv.hf.declare import model_kv
from graphkv.hf.serving import ServingLoop
from graphkv.runtime.device import resolve_device
from graphkv.hf.support import family_of, vocab_size_of
from graphkv.models.demo_engine import DemoEngine, DemoRequest, EngineStats, engine_pages
from graphkv.models.prompts import check_vocab, prompt_ids, stop_token_ids
from graphkv.plan.compile import compile_plan
from graphkv.spec._checks import count_arg
from graphkv.spec.budget import Budget
from graphkv.spec.layers import LayerKind
from graphkv.spec.limits import Limits
from graphkv.spec.model import ModelKV

__all__ = ["GenerateResult", "default_limits", "generate", "generate_with_stats", "sliding_tables_for",
           "workload_budget"]

_MAX_DEFAULT_SEQS = 64
_DEFAULT_BATCHED_TOKENS = 256


@attrs.frozen(kw_only=True)
class GenerateResult:
    """What :func:`generate_with_stats` returns: the generated tokens per prompt, the engine (its
    counters and, with ``record=True``, its logits records), the serving loop (plan, pool, step),
    the seconds spent setting up (plan, allocation, capture) and each prompt's time to first token
    from the start of serving."""

    tokens: list[list[int]]
    engine: DemoEngine = attrs.field(repr=False)
    loop: ServingLoop = attrs.field(repr=False)
    setup_seconds: float
    first_token_seconds: tuple[float, ...]

    @property
    def stats(self) -> EngineStats:
        """The engine's counters (steps, tokens, pages reused, seconds stepping)."""
        return self.engine.stats


def _check_prompts(prompts: Any, max_new_tokens: Any, vocab_size: int | None) -> tuple[list[list[int]], int]:
    """The prompts as lists of Python ints and ``max_new_tokens`` as an int, or a :class:`SpecError`.

    ``prompts``: a list of prompts (each a list of ints, a 1-D integer numpy array or tensor) or a
    2-D integer array / tensor (one prompt per row). Every id is checked against ``vocab_size`` in
    one reduction (:func:`graphkv.models.prompts.check_vocab`)."""
    new_tokens = count_arg("max_new_tokens", max_new_tokens, 1, "pass how many tokens to generate per prompt, e.g. 16")
    if getattr(prompts, "ndim", None) == 2 and hasattr(prompts, "dtype"):
        rows: Any = list(prompts)  # a batch of equal-length prompts: one per row
        if not rows:
            raise SpecError(Problem(field="prompts", value=f"array of shape {tuple(prompts.shape)}",
                                    limit="holds no prompt (0 rows); generate needs at least one",
                                    fix="pass one prompt per row, e.g. np.array([[1, 2, 3]])"))
    elif isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        one = getattr(prompts, "ndim", None) == 1
        raise SpecError(Problem(field="prompts", value=type(prompts).__name__,
                                limit="must be a non-empty list of prompts (token-id lists)"
                                      + (", not one 1-D array" if one else ""),
                                fix="wrap one prompt in a list: prompts=[ids]" if one
                                else "tokenize first: [tokenizer(text).input_ids for text in texts]"))
    elif isinstance(prompts[0], numbers.Integral):
        raise SpecError(Problem(field="prompts", value=list(prompts[:8]),
                                limit="is one prompt (a list of token ids); generate takes a list of prompts",
                                fix="wrap it in a list: prompts=[ids]"))
    else:
        rows = prompts
    arrays = [prompt_ids(prompt, f"prompts[{i}]") for i, prompt in enumerate(rows)]
    check_vocab(arrays, vocab_size)
    return [ids.tolist() for ids in arrays], new_tokens


def _check_limits(limits: Any, *, optional: bool = False) -> None:
    """Refuse anything but :class:`Limits` (or ``None`` when ``optional``), naming the argument."""
    if not isinstance(limits, Limits) and not (optional and limits is None):
        raise SpecError(Problem(field="limits", value=type(limits).__name__,
                                limit="must be graphkv.Limits" + (" or None" if optional else ""),
                                fix="pass graphkv.Limits(max_model_len=..., max_num_seqs=...), or "
                                    + ("leave it unset for " if optional else "")
                                    + "default_limits(prompts, max_new_tokens)"))


def _check_model_kv(model_kv: Any, field: str, *, optional: bool = False) -> None:
    """Refuse anything but a :class:`ModelKV` (or ``None`` when ``optional``), naming ``field``."""
    if not isinstance(model_kv, ModelKV) and not (optional and model_kv is None):
        raise SpecError(Problem(field=field, value=type(model_kv).__name__,
                                limit="must be a graphkv ModelKV" + (" or None" if optional else ""),
                                fix="pass graphkv.hf.model_kv(model) of the model you serve"))


def _check_fits(prompts: Sequence[Sequence[int]], max_new_tokens: int, max_model_len: int) -> None:
    """Refuse, naming the first prompt that does not fit, prompts that with ``max_new_tokens`` exceed the
    caller's ``limits.max_model_len``."""
    for i, prompt in enumerate(prompts):
        if len(prompt) + max_new_tokens > max_model_len:
            raise CapacityError(Problem(
                field=f"prompts[{i}]", value=f"{len(prompt)} tokens",
                limit=f"with max_new_tokens={max_new_tokens} needs {len(prompt) + max_new_tokens} positions, more "
                      f"than limits.max_model_len={max_model_len}",
                fix=f"raise limits.max_model_len to >= {len(prompt) + max_new_tokens}, or shorten the prompt to <= "
                    f"{max(max_model_len - max_new_tokens, 0)} tokens, or generate fewer"))


def _check_length(prompts: Sequence[Sequence[int]], max_new_tokens: int, cap: int | None) -> None:
    """Refuse, naming ``max_new_tokens`` (or the prompt), prompts whose default ``max_model_len`` (the longest
    prompt plus ``max_new_tokens``) would exceed the model's ``max_position_embeddings`` (``cap``)."""
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    length = len(prompts[longest])
    if cap is None or length + max_new_tokens <= cap:
        return
    if length < cap:
        raise SpecError(Problem(field="max_new_tokens", value=max_new_tokens,
                                limit=f"with the longest prompt (prompts[{longest}], {length} tokens) makes "
                                      f"{length + max_new_tokens} positions, beyond the model's "
                                      f"max_position_embeddings={cap}",
                                fix=f"lower max_new_tokens to <= {cap - length}"))
    raise SpecError(Problem(field=f"prompts[{longest}]", value=f"{length} tokens",
                            limit=f"leaves no position to generate in: the model's max_position_embeddings is {cap}",
                            fix=f"shorten the prompt to <= {cap - 1} tokens"))


def default_limits(prompts: Sequence[Sequence[int]], max_new_tokens: int, model_kv: ModelKV | None = None, *,
                   compile: bool | str | None = None,  # noqa: A002 - the torch verb
                   device_type: str | None = None) -> Limits:
    """The limits :func:`generate` plans with when none are given: ``max_model_len`` the longest
    prompt plus ``max_new_tokens``, up to 64 running requests, 256 tokens per step, the CUDA-graph
    mode ``compile`` serves with (:func:`~graphkv.command.compile_flag.graph_mode_for`: decode steps
    only, prefill chunks eager, unless the forward is split — ``"piecewise"`` / ``"fused"`` capture
    mixed steps piece by piece; recurrent backends capture uniform batches) and, for a model with
    sliding-window layers (``model_kv``), sliding tables as wide as :func:`sliding_tables_for` makes
    them. ``device_type``: where the model runs (``compile=None`` is that device's default mode; without it,
    the GPU's). ``prompts`` and ``max_new_tokens`` are checked as :func:`generate` checks them
    (:class:`SpecError` naming the argument)."""
    prompts, max_new_tokens = _check_prompts(prompts, max_new_tokens, None)
    _check_model_kv(model_kv, "model_kv", optional=True)
    limits = Limits(max_model_len=max(map(len, prompts)) + max_new_tokens,
                    max_num_seqs=min(len(prompts), _MAX_DEFAULT_SEQS),
                    max_num_batched_tokens=max(_DEFAULT_BATCHED_TOKENS, min(len(prompts), _MAX_DEFAULT_SEQS)),
                    cudagraph_mode=graph_mode_for(compile, device_type))
    return sliding_tables_for(limits, model_kv) if model_kv is not None else limits


def sliding_tables_for(limits: Limits, model_kv: ModelKV) -> Limits:
    """``limits`` with sliding-window tables that hold a whole ``max_model_len`` request.

    graphkv's engine keeps every page of a request to its end: it does not free pages that left a
    sliding window (a table column is a logical page, so a freed page would leave a hole the
    runtime cannot reuse yet). A sliding group's table holds ``window - 1 +
    max_concurrent_batches x max_num_batched_tokens`` tokens (plus a page), so this raises
    ``max_concurrent_batches`` to ``cdiv(max_model_len, max_num_batched_tokens)`` when the model
    has sliding layers and ``max_model_len`` is a number; otherwise ``limits`` is returned as is.
    The plan then reserves the pages the engine really holds."""
    _check_limits(limits)
    _check_model_kv(model_kv, "model_kv")
    sliding = any(layer.spec.kind is LayerKind.SLIDING_WINDOW for layer in model_kv.layers)
    if not sliding or not isinstance(limits.max_model_len, int):
        return limits
    steps = -(-limits.max_model_len // limits.max_num_batched_tokens)
    return attrs.evolve(limits, max_concurrent_batches=max(steps, limits.concurrent_batches()))


def workload_budget(model_kv: ModelKV, limits: Limits) -> Budget:
    """A KV budget holding ``max_num_seqs`` requests of ``max_model_len`` tokens at once as the
    engine keeps them (every attention page of a request, a state page per state group) or as the
    plan counts them, whichever is more, plus the null page. Planning only (no allocation)."""
    _check_model_kv(model_kv, "model_kv")
    _check_limits(limits)
    probe = compile_plan(model_kv, attrs.evolve(limits, num_blocks_override=1 << 20), None)
    length = probe.max_model_len
    held = sum(engine_pages(probe.groups, length))
    per_request = max(held, probe.capacity.pages_per_request)
    return Budget.kv_bytes((1 + limits.max_num_seqs * per_request) * probe.pool_bytes_per_block)


def generate_with_stats(model: torch.nn.Module, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                        limits: Limits | None = None, budget: Budget | None = None,
                        device: "str | torch.device | None" = None, compile: bool | str | None = None,  # noqa: A002
                        record: bool = False, kernels: str = "auto") -> GenerateResult:
    """:func:`generate`, returning the engine's counters, timings and serving loop too (the
    benchmark and ``graphkv demo --hf`` read them). ``record=True`` keeps each step's logits rows
    (``result.engine.records``, see :class:`DemoEngine`); ``compile`` and ``kernels`` are
    :class:`ServingLoop`'s."""
    family_of(model)  # refuse what graphkv.hf does not run before reading anything else
    prompts, max_new_tokens = _check_prompts(prompts, max_new_tokens, vocab_size_of(model))
    stop = stop_token_ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                          "model.generation_config.eos_token_id")
    _check_limits(limits, optional=True)
    start = time.perf_counter()
    declared = model_kv(model)
    where = resolve_device(device if device is not None else next(model.parameters()).device)  # the loop's device
    if limits is None:
        _check_length(prompts, max_new_tokens, declared.max_position_embeddings)
        limits = default_limits(prompts, max_new_tokens, declared, compile=compile, device_type=where.type)
    elif isinstance(limits.max_model_len, int):  # named as the caller knows them, before anything is built
        _check_fits(prompts, max_new_tokens, limits.max_model_len)
    if budget is None and limits.num_blocks_override is None:
        budget = workload_budget(declared, limits)
    loop = ServingLoop(model, limits=limits, budget=budget, device=where, compile=compile, kernels=kernels)
    engine = loop.engine(record=record)
    requests = [DemoRequest(req_id=i, prompt=p, max_new_tokens=max_new_tokens, stop_token_ids=stop)
                for i, p in enumerate(prompts)]
    setup = time.perf_counter() - start
    served = time.perf_counter()
    engine.run(requests)
    return GenerateResult(tokens=[engine.finished[i][len(p):] for i, p in enumerate(prompts)], engine=engine,
                          loop=loop, setup_seconds=setup,
                          first_token_seconds=tuple(engine.first_token_at[i] - served for i in range(len(prompts))))


def generate(model: torch.nn.Module, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
             limits: Limits | None = None, budget: Budget | None = None,
             device: "str | torch.device | None" = None) -> list[list[int]]:
    """Greedy tokens for every prompt, served by continuous batching on graphkv's pool.

    ``model``: a loaded transformers causal LM (:data:`graphkv.hf.support.FAMILIES`; weights in
    memory, nothing is downloaded). ``prompts``: a list of prompts, each a list of ints or a 1-D
    integer numpy array / tensor (int64 ``[len]``), or a 2-D integer array of equal-length prompts;
    every id must be in ``[0, vocab_size)``. Returns, per prompt, the
    generated token ids (up to ``max_new_tokens``; a request ends early at the model's
    ``generation_config.eos_token_id``, which is kept, as ``model.generate`` does) — the tokens
    ``model.generate(prompt, do_sample=False)`` appends for that prompt alone.

    Requests are admitted first come, first served, as batch rows and pool pages allow; prompts
    longer than ``limits.max_num_batched_tokens`` are prefilled in chunks while others decode, and
    the pages of finished requests are handed to waiting ones. ``limits`` defaults to
    :func:`default_limits`, ``budget`` to :func:`workload_budget` (all ``max_num_seqs`` requests
    at full length at once), ``device`` to where the weights are. Raises :class:`SpecError` for bad
    prompts or arguments, :class:`CapacityError` when a prompt plus ``max_new_tokens`` exceeds
    ``limits.max_model_len``, and the plan's errors when the limits do not fit the budget.

    A random-weight 2-layer Qwen3 on this machine, against transformers' own greedy ``generate``::

        >>> import torch
        >>> import graphkv.hf
        >>> from graphkv.hf.tiny import tiny_model
        >>> model = tiny_model("qwen3")
        >>> prompts = [[1, 2, 3], [4, 5]]
        >>> tokens = graphkv.hf.generate(model, prompts, max_new_tokens=4)
        >>> tokens == [model.generate(torch.tensor([p]), max_new_tokens=4, do_sample=False)[0, len(p):].tolist()
        ...            for p in prompts]
        True
    """
    return generate_with_stats(model, prompts, max_new_tokens=max_new_tokens, limits=limits, budget=budget,
                               device=device).tokens
