"""The ``vllm serve`` command line that realizes a plan (flag names and defaults of vLLM 0.33).

Every flag whose value differs from what the engine would pick by itself gets a ``#`` comment
above the command saying the engine's default and why the plan's value is used. The defaults
are those of vLLM 0.33's source: ``CacheConfig`` (``config/cache.py``: 16-token pages before the
backend and hybrid alignment, ``gpu_memory_utilization`` 0.92, prefix caching on for generative
models), ``EngineArgs.get_batch_defaults`` (``engine/arg_utils.py``: ``vllm serve`` on a GPU of
at least 70 GiB other than an A100 takes 1024 sequences and 8192 tokens per step, smaller GPUs
256 and 2048), ``VllmConfig._set_cudagraph_sizes`` (``config/vllm.py``, as of commit 000fc94b: capture sizes 1, 2,
4, every 8 below 256, every 16 from 256, up to ``min(2 x max_num_seqs x (1 + k), 512)`` tokens on
Hopper, plus ``max_num_batched_tokens`` within that and, with ``k`` speculative tokens, the uniform
decode steps; not ``max_num_seqs``) and
``CompilationConfig.cudagraph_mode`` (FULL_AND_PIECEWISE). The Mamba cache mode
(``CacheConfig.mamba_cache_mode``, ``config/cache.py`` as of commit 002f10e0: ``none`` / ``align`` / ``all``) is
``align`` when prefix caching is on (the default) and ``none`` without it, so a hybrid plan in ``none`` mode emits
``--no-enable-prefix-caching`` and one in ``all`` mode ``--mamba-cache-mode all``.
"""

from __future__ import annotations

import json
import shlex
from typing import Sequence

import attrs

from graphkv.emit.vllm_dtypes import vllm_kv_cache_dtype, vllm_mamba_ssm_dtype
from graphkv.plan.cudagraph import VLLM_MAX_CAPTURE_SIZE, engine_capture_sizes, vllm_uniform_decode_sizes
from graphkv.plan.plan import Plan
from graphkv.printable import printable
from graphkv.spec.budget import format_bytes
from graphkv.spec.layers import MambaCacheMode, PromotedLocalSpec
from graphkv.spec.limits import CudaGraphMode

__all__ = ["VLLM_VERSION", "VllmTarget", "vllm_default_capture_sizes", "vllm_serve_command"]

VLLM_VERSION = "0.33"
_DEFAULT_MODE = CudaGraphMode.FULL_AND_PIECEWISE
_KEEP_CHUNKED_HYBRID = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"
_BIG_GPU_BYTES = 70 << 30  # get_batch_defaults: >= 70 GiB and not an A100 -> the larger defaults
_BACKEND_NAMES = {"flash_attn": "FLASH_ATTN", "flashinfer": "FLASHINFER", "flex": "FLEX_ATTENTION",
                  "triton_paged": "TRITON_ATTN", "flashmla": "FLASHMLA", "triton_mla": "TRITON_MLA",
                  "flash_attn_mla": "FLASH_ATTN_MLA"}


@attrs.frozen(kw_only=True)
class VllmTarget:
    """What the command needs besides the plan.

    ``model``: the repository id or directory ``vllm serve`` loads; ``tensor_parallel_size`` /
    ``pipeline_parallel_size``: the ranks (with stages, ``plan`` is the stage with the most bytes per
    page index, so the pinned per-GPU pool covers every stage); ``engine_block_size``: the
    page size the planner picks with no ``block_size`` given (the engine's own choice);
    ``gpu_name`` / ``gpu_bytes``: the GPU when planned with ``--gpu`` (``None``: unknown);
    ``kv_cache_dtype``, ``mamba_ssm_dtype``, ``attention_backend``: the overrides given, if any;
    ``notes``: comments put first (e.g. that ``model`` holds another config than the one planned).
    """

    model: str
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    engine_block_size: int | None = None
    gpu_name: str | None = None
    gpu_bytes: int | None = None
    kv_cache_dtype: str | None = None
    mamba_ssm_dtype: str | None = None
    attention_backend: str | None = None
    notes: tuple[str, ...] = ()  # said first in the command's comments (e.g. a config vllm serve will not read)


def vllm_default_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                               num_speculative_tokens: int = 0) -> tuple[int, ...]:
    """The capture sizes vLLM picks by itself on Hopper (``VllmConfig._set_cudagraph_sizes``, commit 000fc94b).

    >>> vllm_default_capture_sizes(20, 8192)  # max_num_seqs=20 is no size: 17..20 requests pad to 24
    (1, 2, 4, 8, 16, 24, 32, 40)
    """
    query_len = 1 + num_speculative_tokens
    ceiling = min(min(2 * max_num_seqs * query_len, VLLM_MAX_CAPTURE_SIZE), max_num_batched_tokens)
    return engine_capture_sizes(ceiling, max_num_batched_tokens,
                                uniform_decode_sizes=vllm_uniform_decode_sizes(max_num_seqs, num_speculative_tokens))


def _batch_defaults(target: VllmTarget) -> tuple[str, int | None, int | None]:
    if target.gpu_bytes is None or target.gpu_name is None:
        return "1024 sequences / 8192 tokens on H100-class GPUs, 256 / 2048 on smaller ones", None, None
    if target.gpu_bytes >= _BIG_GPU_BYTES and "a100" not in target.gpu_name.lower():
        return f"1024 sequences / 8192 tokens on an {target.gpu_name}", 1024, 8192
    return f"256 sequences / 2048 tokens on an {target.gpu_name}", 256, 2048


def _span(sizes: Sequence[int]) -> str:
    return f"{len(sizes)} sizes, {sizes[0]}..{sizes[-1]}" if sizes else "none"


def vllm_serve_command(plan: Plan, target: VllmTarget) -> str:
    """The commented ``vllm serve ...`` command (a shell snippet) that realizes ``plan``.

    >>> from graphkv import Budget, FullAttentionSpec, Limits, ModelKV, compile
    >>> model = ModelKV.from_specs("tiny", [(FullAttentionSpec(num_kv_heads=8, head_size=128), "flash_attn")] * 2)
    >>> plan = compile(model, Limits(max_model_len=4096, max_num_seqs=64), Budget.kv_bytes("1GiB"))
    >>> print(vllm_serve_command(plan, VllmTarget(model="my/model")).splitlines()[-1])  # capture sizes: vLLM's own
      --kv-cache-memory-bytes 1073741824
    """
    lim, cap = plan.limits, plan.capacity
    notes: list[str] = list(target.notes)
    flags: list[tuple[str, str]] = [("--tensor-parallel-size", str(target.tensor_parallel_size))]
    if target.pipeline_parallel_size > 1:
        flags.append(("--pipeline-parallel-size", str(target.pipeline_parallel_size)))
        notes.append(f"--pipeline-parallel-size {target.pipeline_parallel_size}: the engine splits the layers as the "
                     f"plan does (its default partition, or VLLM_PP_LAYER_PARTITION); the pool below is sized for the "
                     f"stage with the most bytes per page index, and the engine keeps every worker's smallest page "
                     f"count, {plan.num_blocks}")

    flags.append(("--max-model-len", str(plan.max_model_len)))
    if plan.max_model_len != cap.max_position_embeddings:
        engine = (f"max_position_embeddings={cap.max_position_embeddings}" if cap.max_position_embeddings
                  else "the config's max_position_embeddings")
        notes.append(f"--max-model-len {plan.max_model_len}: the engine's default is {engine}; "
                     f"graphkv: {cap.max_model_len_reason}")

    defaults, seqs_default, tokens_default = _batch_defaults(target)
    flags.append(("--max-num-seqs", str(lim.max_num_seqs)))
    flags.append(("--max-num-batched-tokens", str(lim.max_num_batched_tokens)))
    if (seqs_default, tokens_default) != (lim.max_num_seqs, lim.max_num_batched_tokens):
        notes.append(f"--max-num-seqs {lim.max_num_seqs} --max-num-batched-tokens {lim.max_num_batched_tokens}: "
                     f"vllm serve defaults to {defaults}; the plan's block tables, state pages and graphs are sized "
                     "for these values")

    if target.engine_block_size is not None and plan.block_size != target.engine_block_size:
        flags.append(("--block-size", str(plan.block_size)))
        notes.append(f"--block-size {plan.block_size}: without it the engine picks {target.engine_block_size} "
                     f"tokens per page; graphkv: {plan.block.reason}")

    if cap.from_override:
        flags.append(("--num-gpu-blocks-override", str(plan.num_blocks)))
        notes.append(f"--num-gpu-blocks-override {plan.num_blocks}: the engine would size the pool from memory "
                     "profiling; the plan fixes the page count")
    else:
        pool = plan.num_blocks * plan.pool_bytes_per_block
        flags.append(("--kv-cache-memory-bytes", str(pool)))
        notes.append(f"--kv-cache-memory-bytes {pool}: the engine's default profiles memory and gives the pool "
                     f"gpu_memory_utilization (0.92) x total minus what it measured; this pins the planned pool "
                     f"({plan.num_blocks} pages x {plan.pool_bytes_per_block} B = {format_bytes(pool)}, per GPU) "
                     "and skips profiling")

    if target.kv_cache_dtype is not None:
        attention = next((g.spec for g in plan.groups if not g.is_ssm), None)
        name = vllm_kv_cache_dtype(target.kv_cache_dtype, getattr(attention, "dtype", None))
        flags.append(("--kv-cache-dtype", name))
        notes.append(f"--kv-cache-dtype {name}: the engine's default is the model's dtype ('auto'); planned with "
                     f"{target.kv_cache_dtype}")
    if target.mamba_ssm_dtype is not None:
        state = vllm_mamba_ssm_dtype(target.mamba_ssm_dtype)
        flags.append(("--mamba-ssm-cache-dtype", state))
        notes.append(f"--mamba-ssm-cache-dtype {state}: planned with this state dtype; the "
                     "engine's default follows the model ('auto')")
    if target.attention_backend is not None:
        name = _BACKEND_NAMES.get(target.attention_backend, target.attention_backend.upper())
        flags.append(("--attention-backend", name))
        notes.append(f"--attention-backend {name}: planned for this backend's page sizes; the engine would pick "
                     "one by itself")

    env = _hybrid_manager_flags(plan, flags, notes)

    if any(g.is_ssm for g in plan.groups):
        _mamba_flags(plan, flags, notes)

    _graph_flags(plan, target, flags, notes)

    if lim.num_speculative_tokens:
        notes.append(f"speculative decoding: planned for {lim.num_speculative_tokens} draft tokens per step; add "
                     f"--speculative-config '{{\"method\": \"...\", \"num_speculative_tokens\": "
                     f"{lim.num_speculative_tokens}}}' with your draft method")

    header = [f"# vllm serve (vLLM {VLLM_VERSION} flags) realizing graphkv's plan for {printable(plan.model_name)}"]
    header += [f"# {note}" for note in notes]
    lines = [f"{env}vllm serve {shlex.quote(target.model)}"] + [f"  {flag} {value}".rstrip() for flag, value in flags]
    return "\n".join(header + [" \\\n".join(lines)])


def _hybrid_manager_flags(plan: Plan, flags: list[tuple[str, str]], notes: list[str]) -> str:
    """``--disable-hybrid-kv-cache-manager`` when the plan allocates local attention as full
    attention on purpose; the environment prefix that keeps vLLM's hybrid manager for chunked-local
    attention when the plan keeps it (returned, ``""`` when none)."""
    wanted = plan.limits.disable_hybrid_kv_cache_manager
    promoted = [layer for layer in plan.layers if isinstance(layer.spec, PromotedLocalSpec)]
    chunked = any(getattr(layer.spec, "chunk", None) is not None for layer in plan.layers)  # promoted or not
    if wanted:
        flags.append(("--disable-hybrid-kv-cache-manager", ""))
        planned = (f"planned with {len(promoted)} local-attention layer(s) allocated as full attention (every token's "
                   "page kept)" if promoted else "as planned; the model has no local-attention layer beside full "
                   "attention to promote, so it changes nothing here")
        notes.append(f"--disable-hybrid-kv-cache-manager: {planned}; the engine keeps its hybrid KV cache manager by "
                     "default" + (" except for chunked-local attention" if chunked else ""))
    elif wanted is False and chunked:
        notes.append(f"{_KEEP_CHUNKED_HYBRID}=1: vLLM {VLLM_VERSION} turns its hybrid KV cache manager off for "
                     "chunked-local attention unless this is set; the plan keeps it (disable_hybrid_kv_cache_manager="
                     "False), so chunked layers hold only their chunk's pages")
        return f"{_KEEP_CHUNKED_HYBRID}=1 "
    elif promoted and chunked:
        notes.append(f"vLLM {VLLM_VERSION} turns its hybrid KV cache manager off by itself for chunked-local "
                     f"attention, as planned: {len(promoted)} local-attention layer(s) allocated as full attention")
    elif promoted:
        notes.append(f"the engine allocates the {len(promoted)} sliding-window layer(s) as full attention by itself "
                     "(its full-allocation fallback: page sizes cannot be unified beside MLA), as planned")
    return ""


def _mamba_flags(plan: Plan, flags: list[tuple[str, str]], notes: list[str]) -> None:
    mode = plan.limits.mamba_cache_mode
    if mode is MambaCacheMode.NONE:
        flags.append(("--no-enable-prefix-caching", ""))
        notes.append("--no-enable-prefix-caching: the engine enables prefix caching by default, which puts hybrid "
                     "models in Mamba 'align' mode (two state pages per request, three for Mamba2); the plan keeps "
                     "one state per request (mamba_cache_mode=none, the engine's mode without prefix caching)")
        return
    if mode is MambaCacheMode.ALL:
        flags.append(("--mamba-cache-mode", "all"))
        notes.append("--mamba-cache-mode all: the engine's default with prefix caching is 'align' (a state kept where "
                     "a step ends on a block boundary); the plan keeps a state every block_size tokens "
                     f"({plan.block_size}), cdiv(max_model_len, block_size) state pages per request")
    mamba_block = plan.block.mamba_block_size
    if mamba_block is not None and mamba_block != plan.block_size:
        flags.append(("--mamba-block-size", str(mamba_block)))
        notes.append(f"--mamba-block-size {mamba_block}: the engine's default in align mode is block_size "
                     f"({plan.block_size})")


def _graph_flags(plan: Plan, target: VllmTarget, flags: list[tuple[str, str]], notes: list[str]) -> None:
    cg, lim = plan.cudagraph, plan.limits
    if cg.mode is not _DEFAULT_MODE:
        flags.append(("--compilation-config", shlex.quote(json.dumps({"cudagraph_mode": cg.mode.value}))))
        why = "; ".join(cg.downgrades) or f"cudagraph_mode={cg.requested_mode.value} was asked for"
        notes.append(f"--compilation-config cudagraph_mode={cg.mode.value}: the engine's default is "
                     f"{_DEFAULT_MODE.value}; graphkv: {why}")
    sizes = tuple(sorted(set(cg.capture_sizes.decode) | set(cg.capture_sizes.mixed)))
    if not sizes:
        return
    k = lim.num_speculative_tokens
    default = vllm_default_capture_sizes(lim.max_num_seqs, lim.max_num_batched_tokens, k)
    if sizes != default or k:
        flags.append(("--cudagraph-capture-sizes", " ".join(str(s) for s in sizes)))
        spec = f" x (1 + {k})" if k else ""
        notes.append(f"--cudagraph-capture-sizes ({_span(sizes)}): the engine's default on Hopper is "
                     f"{_span(default)} (up to min(2 x max_num_seqs{spec}, 512) tokens); the plan captures steps "
                     f"up to {cg.max_capture_size} tokens ({cg.max_capture_size_reason}), graph pool estimate in "
                     "the plan's ledger")
