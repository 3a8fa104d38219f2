"""Serving limits: how long, how many and how much per step the plan must support."""

from __future__ import annotations

import enum
from typing import Any, Literal, Union

import attrs

from graphkv.spec._checks import Checker, as_int
from graphkv.spec.layers import MambaCacheMode

__all__ = ["AUTO", "CudaGraphMode", "Limits", "MaxModelLen"]

AUTO: Literal["auto"] = "auto"
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
# The largest step captured in a CUDA graph: 65,555 capture sizes (vLLM's 1, 2, 4, every 8 to 256, every 16 above),
# planned in under a second. A step that large spends its time computing, not launching, and each size captured
# costs capture time and graph memory (the plan warns long before); the list of every 16th size up to 2**31 (134
# million) never finished planning.
MAX_CUDAGRAPH_CAPTURE_SIZE = 1 << 20
MaxModelLen = Union[int, Literal["auto"]]


class CudaGraphMode(enum.Enum):
    """Which steps are captured: nothing, the pieces between attention ops, whole steps, whole
    decode steps only, or whole decode steps plus pieces for mixed steps."""

    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"


def _enum(kind: type[enum.Enum]) -> Any:
    def convert(value: Any) -> Any:
        if isinstance(value, kind):
            return value
        if isinstance(value, str):
            for member in kind:
                if member.value.lower() == value.strip().lower():
                    return member
        return value

    return convert


@attrs.frozen(kw_only=True)
class Limits:
    """What the plan must serve.

    - ``max_model_len``: tokens per request (prompt + output), or ``"auto"`` for the longest the
      pool can hold for one request — or for ``concurrency`` requests at once when that is set;
    - ``concurrency``: requests of ``max_model_len`` tokens that must fit the pool at once
      (``None``: one). With ``"auto"`` it picks the longest length at which that many fit; with a
      fixed length, fewer fitting is a :class:`~graphkv.errors.CapacityError` naming the largest
      count and the largest length for this count. It does not set ``max_num_seqs``;
    - ``max_num_seqs``: running requests per step; ``max_num_batched_tokens``: tokens per step;
    - ``num_blocks_override``: exact pool size in pages; it replaces the memory budget for every
      check (page 0 is the null page, so ``num_blocks_override - 1`` pages are usable);
    - ``mamba_cache_mode``, ``num_speculative_tokens``, ``tensor_parallel_size`` (``None``: the
      model's), ``block_size`` / ``mamba_block_size`` (``None``: chosen by the planner),
      ``cudagraph_mode``: the requested capture mode (downgraded, with a note, if unsupported);
    - ``max_cudagraph_capture_size``: the largest step (tokens) captured in a CUDA graph; larger steps
      run uncaptured. ``None`` (the default) follows vLLM 0.33: ``min(2 x max_num_seqs x (1 +
      num_speculative_tokens), 512)``. Never more than ``max_num_batched_tokens``; set it to that to
      capture every step size (more capture time and graph memory). At most
      :data:`MAX_CUDAGRAPH_CAPTURE_SIZE` (1,048,576) tokens after that cap;
    - ``max_concurrent_batches``: steps scheduled but not yet settled. ``None`` (the default)
      follows the pipeline depth as vLLM 0.33 does under its default async scheduling (Model Runner
      V2, ``VllmConfig.max_concurrent_batches``): ``stages + 1`` — 2 on one stage, 3 for a model
      split into 2 pipeline stages; the plan learns the stages from the model
      (:meth:`ModelKV.stage <graphkv.spec.model.ModelKV.stage>`) and its ``limits`` hold the
      resolved number. Set it for another scheduler: ``stages`` for a synchronous one (1 on one
      stage). Sliding-window and chunked layers keep the pages of every step in flight:
      ``max_concurrent_batches * max_num_batched_tokens``;
    - ``speculative_lookahead_tokens``: prefill tokens a drafter reads past the scheduled range
      (vLLM's ``num_prefill_lookahead_tokens``: ``num_speculative_tokens`` for multi-module MTP, 1
      for other EAGLE drafters, 0 without one); sliding windows retain ``max(0, this - 1)`` more;
    - ``disable_hybrid_kv_cache_manager``: vLLM's ``--disable-hybrid-kv-cache-manager``. ``True``
      allocates sliding-window and chunked-local layers as full attention beside full attention
      or MLA (one group, every token's page kept; their attention still reads only the window);
      ``False`` keeps the hybrid manager; ``None`` (default) decides as vLLM 0.33 does: off for a
      model with chunked-local attention, on otherwise (:mod:`graphkv.plan.promotion`).
    """

    max_model_len: MaxModelLen = attrs.field(default=AUTO, converter=as_int)
    concurrency: int | None = attrs.field(default=None, converter=as_int)
    max_num_seqs: int = attrs.field(default=256, converter=as_int)
    max_num_batched_tokens: int = attrs.field(default=DEFAULT_MAX_NUM_BATCHED_TOKENS, converter=as_int)
    num_blocks_override: int | None = attrs.field(default=None, converter=as_int)
    mamba_cache_mode: MambaCacheMode = attrs.field(default=MambaCacheMode.NONE, converter=_enum(MambaCacheMode))
    num_speculative_tokens: int = attrs.field(default=0, converter=as_int)
    tensor_parallel_size: int | None = attrs.field(default=None, converter=as_int)
    block_size: int | None = attrs.field(default=None, converter=as_int)
    mamba_block_size: int | None = attrs.field(default=None, converter=as_int)
    cudagraph_mode: CudaGraphMode = attrs.field(default=CudaGraphMode.FULL_AND_PIECEWISE,
                                                converter=_enum(CudaGraphMode))
    max_concurrent_batches: int | None = attrs.field(default=None, converter=as_int)
    max_cudagraph_capture_size: int | None = attrs.field(default=None, converter=as_int)
    speculative_lookahead_tokens: int = attrs.field(default=0, converter=as_int)
    disable_hybrid_kv_cache_manager: bool | None = None

    def __attrs_post_init__(self) -> None:
        check = Checker("Limits")
        if self.max_model_len != AUTO:
            check.positive_int("max_model_len", self.max_model_len, limit="must be an integer > 0 or 'auto'",
                               fix="set max_model_len to a positive integer or 'auto'")
        if self.concurrency is not None:
            check.positive_int("concurrency", self.concurrency)
        check.positive_int("max_num_seqs", self.max_num_seqs)
        check.positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.num_blocks_override is not None:
            # 1 is positive too, but leaves no usable page: ask for what works
            whole = check.positive_int("num_blocks_override", self.num_blocks_override,
                                       limit="must be an integer >= 2 (page 0 is the null page)",
                                       fix="set num_blocks_override to an integer >= 2")
            if whole and self.num_blocks_override < 2:
                check.add("num_blocks_override", self.num_blocks_override,
                          "must be >= 2 (page 0 is the null page, so 1 leaves no usable page)",
                          "raise num_blocks_override to at least 2")
        if not isinstance(self.mamba_cache_mode, MambaCacheMode):
            check.add("mamba_cache_mode", self.mamba_cache_mode, "must be 'none', 'align' or 'all'",
                      "pick one of none / align / all")
        check.non_negative_int("num_speculative_tokens", self.num_speculative_tokens)
        if self.tensor_parallel_size is not None:
            check.positive_int("tensor_parallel_size", self.tensor_parallel_size)
        if self.block_size is not None:
            check.positive_int("block_size", self.block_size)
        if self.mamba_block_size is not None:
            check.positive_int("mamba_block_size", self.mamba_block_size)
        if self.max_concurrent_batches is not None:
            check.positive_int("max_concurrent_batches", self.max_concurrent_batches)
        if self.max_cudagraph_capture_size is not None:
            check.positive_int("max_cudagraph_capture_size", self.max_cudagraph_capture_size)
        check.non_negative_int("speculative_lookahead_tokens", self.speculative_lookahead_tokens)
        if not isinstance(self.disable_hybrid_kv_cache_manager, (bool, type(None))):
            check.add("disable_hybrid_kv_cache_manager", self.disable_hybrid_kv_cache_manager,
                      "must be True, False or None (vLLM 0.33's automatic choice)",
                      "pass disable_hybrid_kv_cache_manager=True to allocate local attention as full attention")
        if not isinstance(self.cudagraph_mode, CudaGraphMode):
            check.add("cudagraph_mode", self.cudagraph_mode, f"must be one of {[m.value for m in CudaGraphMode]}",
                      "pick a CudaGraphMode")
        if not check.problems and self.max_num_batched_tokens < self.max_num_seqs:
            if self.max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS:  # the default: max_num_seqs moved it
                check.add("max_num_seqs", self.max_num_seqs,
                          f"must be <= max_num_batched_tokens={self.max_num_batched_tokens} (each running request "
                          "decodes one token per step)",
                          f"lower max_num_seqs to <= {self.max_num_batched_tokens}, or raise max_num_batched_tokens "
                          f"to >= {self.max_num_seqs}")
            else:
                check.add("max_num_batched_tokens", self.max_num_batched_tokens,
                          f"must be >= max_num_seqs={self.max_num_seqs} (each running request decodes one token per "
                          "step)", f"raise max_num_batched_tokens to >= {self.max_num_seqs} or lower max_num_seqs")
        if (not check.problems and self.max_cudagraph_capture_size is not None
                and self.max_cudagraph_capture_size < 1 + self.num_speculative_tokens):
            check.add("max_cudagraph_capture_size", self.max_cudagraph_capture_size,
                      f"must be >= 1 + num_speculative_tokens={1 + self.num_speculative_tokens} (one request's decode "
                      "step), or no decode step is ever captured",
                      f"raise max_cudagraph_capture_size to >= {1 + self.num_speculative_tokens}, or leave it unset "
                      "(vLLM's default: min(2 x max_num_seqs x (1 + num_speculative_tokens), 512))")
        if (not check.problems and self.max_cudagraph_capture_size is not None
                and min(self.max_cudagraph_capture_size, self.max_num_batched_tokens) > MAX_CUDAGRAPH_CAPTURE_SIZE):
            check.add("max_cudagraph_capture_size", self.max_cudagraph_capture_size,
                      f"must be <= {MAX_CUDAGRAPH_CAPTURE_SIZE} tokens (max_num_batched_tokens="
                      f"{self.max_num_batched_tokens}): every 16th step size up to it would be captured, and a step "
                      "that large gains nothing from a graph",
                      f"lower max_cudagraph_capture_size to <= {MAX_CUDAGRAPH_CAPTURE_SIZE} (steps above it run "
                      "piecewise-compiled, without graphs), or leave it unset (vLLM's default: min(2 x max_num_seqs x "
                      "(1 + num_speculative_tokens), 512))")
        if not check.problems and self.max_num_batched_tokens < 1 + self.num_speculative_tokens:
            check.add("max_num_batched_tokens", self.max_num_batched_tokens,
                      f"must be >= 1 + num_speculative_tokens={1 + self.num_speculative_tokens} (one speculative "
                      "decode step of one request)",
                      f"raise max_num_batched_tokens to >= {1 + self.num_speculative_tokens} or lower "
                      "num_speculative_tokens")
        check.raise_if_any()

    def concurrent_batches(self, pipeline_parallel_size: int = 1) -> int:
        """Steps in flight: ``max_concurrent_batches`` when set, else ``pipeline_parallel_size + 1``
        (vLLM 0.33 with async scheduling: every stage busy plus the step being scheduled)."""
        if self.max_concurrent_batches is not None:
            return self.max_concurrent_batches
        return pipeline_parallel_size + 1

    @property
    def extra_retained_tokens(self) -> int:
        """Tokens below a sliding window kept for a drafter that re-prefills them (vLLM 0.33
        ``get_kv_cache_configs``: ``max(0, num_prefill_lookahead_tokens - 1)``)."""
        return max(0, self.speculative_lookahead_tokens - 1)

    @property
    def is_auto_len(self) -> bool:
        """Whether ``max_model_len`` is to be fitted to the pool."""
        return self.max_model_len == AUTO
