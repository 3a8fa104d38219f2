"""Compiled flex-attention regions that compile once and never recompile while serving.

``torch.compile`` keeps its compiled entries — and its recompile limit (8) — on the function's
*code object*, and guards every entry on the constants the function reads. One compiled
attention function shared by every layer, group and model therefore recompiled for each new
mask closure, table width, window and token count until it hit the limit. Here each
:class:`FlexRegions` owns one region per (mask builder, phase, scale, lse, soft-cap) — the builder fixing the
group's geometry — and each region is compiled from its own copy of the code object
(:func:`fresh_function`), so regions never share entries, and within a region:

- the per-group geometry (kernel block size, window, query tile, flex view length, mask closure)
  and the kernel options are constants, computed here in plain Python, never inside the region;
- the one dynamic dimension is the query's token count, marked dynamic on the first call. The
  query is copied into a fresh ``[1, Hq, max(T, 2), D]`` buffer, so the token count is never 1
  (a size-1 dimension would be specialized by the compiler and recompile later) and compiled CPU
  flex gets the dense 4-D query it needs;
- the block mask's tensors are the builder's persistent full-size buffers (rows past the step's
  query tiles are never read), so their shapes never change;
- K and V are flat strided views of the layer's cache built once, outside the region (no
  ``as_strided`` over a graph input inside it), and the step's K/V are written before the region
  by the K/V write op (:mod:`graphkv.runtime.ops.kv_write_op`): the region only reads the pool,
  so it never copies it;
- the region always runs under ``torch.no_grad()`` (no grad-mode guard to fail).

A region that returns the log-sum-exp (attention sinks) runs eagerly on a CPU: torch 2.13's
compiled CPU flex does not return it. Before torch 2.13 every region runs eagerly on a CPU
(:func:`cpu_flex_compiles`).

Decode steps (``phase="decode"``, uniform batches) and mixed steps (``"mixed"``) get separate
regions: a uniform decode key's graph and a mixed key's graph each replay their own code.

Example::

    regions = FlexRegions(compile=True)
    out = regions.attend(q, k_flat, v_flat, ctx.mask_builders[g], phase="decode", scale=0.125)
"""

from __future__ import annotations

import contextlib
import math
import types
import uuid
from typing import Any, Callable

import torch
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention

from graphkv.errors import Problem, SpecError
from graphkv.runtime.flex.mask import FlexMaskBuilder
from graphkv.versions import release

__all__ = ["CPU_FLEX_MIN_TORCH", "PHASES", "FlexRegions", "cpu_flex_compiles", "eager_regions_callable",
           "flex_kernel_options", "fresh_function", "region_compiled"]

PHASES = ("decode", "mixed")
CPU_FLEX_MIN_TORCH = (2, 13)
"""The first torch whose compiled CPU flex attention reads graphkv's K/V views (checked: 2.13; 2.11 fails)."""
_MIN_QUERY_TOKENS = 2  # a query of one token would be specialized (0/1 specialization) and recompile


def fresh_function(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` with its own copy of its code object (same bytecode, globals, defaults and closure),
    named ``name``: ``torch.compile`` keeps compiled entries and the recompile budget per code
    object, so a fresh copy compiles on its own."""
    code = fn.__code__.replace(co_name=name, co_qualname=name) if hasattr(fn.__code__, "co_qualname") \
        else fn.__code__.replace(co_name=name)
    out = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out


def flex_kernel_options(device_type: str, q_tile_tokens: int, kernel_block_size: int) -> dict[str, int | bool] | None:
    """Triton tile sizes for flex attention on CUDA that fit the mask's sparse blocks (``None`` on
    a CPU): the kernel's key tile must divide the kernel block size and its query tile the query
    tile, so each is the largest power of two <= 64 dividing them; one kernel serves decode and
    mixed steps (``FORCE_USE_FLEX_ATTENTION``). Plain Python, computed once per region."""
    if device_type != "cuda":
        return None
    return {"BLOCK_M": math.gcd(q_tile_tokens, 64), "BLOCK_N": math.gcd(kernel_block_size, 64),
            "FORCE_USE_FLEX_ATTENTION": True}


def _region_function(mask_mod: Callable[..., torch.Tensor], q_tile: int, kbs: int, kv_tokens: int,
                     scale: float | None, options: dict[str, int | bool] | None,
                     return_lse: bool, softcap: float | None = None) -> Callable[..., Any]:
    """The flex call of one region, its constants bound in a closure; ``softcap``: scores (after the scale) become
    ``softcap * tanh(score / softcap)``."""
    score_mod = None
    if softcap is not None:
        def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                      kv: torch.Tensor) -> torch.Tensor:
            return softcap * torch.tanh(score / softcap)

    def flex_region(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_num_blocks: torch.Tensor,
                    kv_indices: torch.Tensor, full_kv_num_blocks: torch.Tensor,
                    full_kv_indices: torch.Tensor) -> Any:
        mask = BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
                                        BLOCK_SIZE=(q_tile, kbs), mask_mod=mask_mod,
                                        seq_lengths=(query.shape[2], kv_tokens), compute_q_blocks=False)
        if return_lse:
            out, aux = flex_attention(query, key, value, score_mod=score_mod, block_mask=mask, scale=scale,
                                      enable_gqa=True, kernel_options=options, return_aux=AuxRequest(lse=True))
            return out, aux.lse
        return flex_attention(query, key, value, score_mod=score_mod, block_mask=mask, scale=scale, enable_gqa=True,
                              kernel_options=options)

    return flex_region


def cpu_flex_compiles(version: str | None = None) -> bool:
    """Whether Inductor's CPU flex attention compiles the regions' K/V views on torch ``version`` (default: the
    installed one): from :data:`CPU_FLEX_MIN_TORCH` on. torch 2.11's CPU template refuses K and V views of one cache
    buffer taken inside the compiled function ("Unsupported for now if query, key, value are the same buffer") and
    aborts the whole process in its C++ kernel on K and V views whose token stride is not the head size (a layer's
    interleaved K/V pages); 2.12 was not checked. Such a torch runs the regions' flex eagerly on a CPU: the same
    values, slower. CUDA (Triton's flex template) is not affected."""
    return release(version if version is not None else str(torch.__version__)) >= CPU_FLEX_MIN_TORCH


def region_compiled(compile: bool, device_type: str, *, return_lse: bool) -> bool:  # noqa: A002 - the torch verb
    """Whether a flex region on ``device_type`` is compiled. On CUDA always: eager flex there is PyTorch's unfused
    math path, which materialises every score and copies a host scalar to the device, so a CUDA graph cannot capture
    it (on an H100, graphkv.hf with ``compile=False`` and flex decode failed its first decode capture: "Cannot copy
    between CPU and CUDA tensors during CUDA graph capture"). Elsewhere as ``compile`` asks, except on a CPU: torch
    2.13's compiled CPU flex returns no log-sum-exp, so a region that needs it (``return_lse``) runs eager flex, and
    before torch 2.13 every region does (:func:`cpu_flex_compiles`)."""
    if device_type == "cuda":
        return True
    if device_type == "cpu" and (return_lse or not cpu_flex_compiles()):
        return False
    return compile


def eager_regions_callable(device_type: str) -> contextlib.AbstractContextManager[Any]:
    """A context (reusable: build it once) for each call of a compiled forward whose custom ops call flex regions,
    which run eagerly on a CPU (:func:`region_compiled`). The first call of each graph AOT autograd compiled checks that its custom ops' outputs
    alias no input under a dispatch mode, and eager flex evaluates the mask with ``vmap``, which cannot run inside a
    dispatch mode's handler: a mixed step as the first call failed with "could not find kernel for
    custom_function_call at dispatch key CPU" (torch 2.11 and 2.13). On a CPU the check is off for the call (graphkv's
    ops return fresh tensors; the check stays on for CUDA, where regions are compiled and nothing changes)."""
    import torch._functorch.config as config

    if device_type == "cuda" or not hasattr(config, "check_custom_op_aliasing"):
        return contextlib.nullcontext()
    return config.patch(check_custom_op_aliasing=False)


class _Region:
    """One compiled (or eager) flex call and the builder whose buffers it reads."""

    __slots__ = ("builder", "call", "compiled", "mask_args")

    def __init__(self, builder: FlexMaskBuilder, call: Callable[..., Any], compiled: bool) -> None:
        self.builder, self.call, self.compiled = builder, call, compiled
        self.mask_args = (builder.kv_num_blocks[None, None], builder.kv_indices[None, None],
                          builder.full_kv_num_blocks[None, None], builder.full_kv_indices[None, None])


class FlexRegions:
    """The flex-attention regions of one model: compiled (``compile=True``, and on CUDA always: see
    :func:`region_compiled`) or eager, one per (mask builder, phase, scale, lse, soft-cap), created on first use. Not
    thread-safe (one model, one serving thread)."""

    def __init__(self, *, compile: bool, name: str = "graphkv_flex") -> None:  # noqa: A002 - the torch verb
        self.compile = compile
        self.name = name
        self._tag = uuid.uuid4().hex[:12]  # names this instance's regions apart (an id() is reused after collection)
        self._regions: dict[tuple[int, str, float | None, bool, float | None], _Region] = {}

    @property
    def num_regions(self) -> int:
        """Regions created so far (each compiles on its first call)."""
        return len(self._regions)

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, builder: FlexMaskBuilder, *,
               phase: str = "mixed", scale: float | None = None, softcap: float | None = None,
               return_lse: bool = False) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
        """Flex attention of ``query`` ``[T, Hq, D]`` (the step's packed tokens, padded ones
        included) over a layer's flat K/V views ``key`` / ``value`` ``[1, Hkv, kv_tokens, D]``
        (:func:`~graphkv.runtime.flex.views.paged_kv_views` of its cache, built once) with the mask
        ``builder`` built for this step (``builder.build`` ran for ``num_tokens_padded >= T``).
        Returns ``[T, Hq, D]`` (and, with ``return_lse``, the log-sum-exp ``[T, Hq]`` float32).
        ``phase``: ``"decode"`` for uniform decode steps, ``"mixed"`` otherwise; ``softcap``: scores (after
        ``scale``) become ``softcap * tanh(score / softcap)`` (Gemma-2's attention-logit soft-capping). Capture-safe."""
        geometry = builder.geometry
        if key.shape[2] != geometry.kv_tokens:
            raise SpecError(Problem(field="key", value=tuple(key.shape),
                                    limit=f"the flex view must hold the mask's kv_tokens={geometry.kv_tokens} (group "
                                          f"{geometry.group_index}, kv_block_stride={geometry.kv_block_stride})",
                                    fix="pass paged_kv_views(pool.kv_cache(layer)) of a layer of the builder's group, "
                                        "from the pool allocated for the builder's plan"))
        region = self._region(builder, phase, scale, return_lse, query.device.type, softcap)
        num_tokens, heads, dim = query.shape
        num_tokens_padded = max(num_tokens, _MIN_QUERY_TOKENS)
        with torch.no_grad():
            q = query.new_empty((1, heads, num_tokens_padded, dim))
            q[0, :, :num_tokens].copy_(query.transpose(0, 1))
            if num_tokens_padded > num_tokens:
                q[0, :, num_tokens:].zero_()
            if region.compiled:
                torch._dynamo.mark_dynamic(q, 2)
            result = region.call(q, key, value, *region.mask_args)
        if return_lse:
            out, lse = result
            return out[0, :, :num_tokens].transpose(0, 1), lse[0, :, :num_tokens].transpose(0, 1)
        return result[0, :, :num_tokens].transpose(0, 1)

    def _region(self, builder: FlexMaskBuilder, phase: str, scale: float | None, return_lse: bool,
                device_type: str, softcap: float | None = None) -> _Region:
        key = (id(builder), phase, scale, return_lse, softcap)
        found = self._regions.get(key)
        if found is not None and found.builder is builder:
            return found
        if phase not in PHASES:
            raise SpecError(Problem(field="phase", value=phase, limit=f"must be one of {', '.join(PHASES)}",
                                    fix="'decode' for uniform decode steps, 'mixed' otherwise"))
        g = builder.geometry
        fn = _region_function(builder.mask_mod, g.q_tile_tokens, g.kernel_block_size, g.kv_tokens, scale,
                              flex_kernel_options(device_type, g.q_tile_tokens, g.kernel_block_size), return_lse,
                              softcap)
        compiled = region_compiled(self.compile, device_type, return_lse=return_lse)
        if compiled:
            # unique to this FlexRegions: Dynamo also keys its automatic-dynamic record by the code's name, file and
            # line, so two models' regions of one name would share it (the second compiling dimensions dynamic that
            # the first saw change: torch 2.13's C++ flex template then fails to compile on a CPU)
            name = f"{self.name}_{self._tag}_g{g.group_index}_{phase}_{len(self._regions)}"
            fn = torch.compile(fresh_function(fn, name), fullgraph=True)
        region = self._regions[key] = _Region(builder, fn, compiled)
        return region
