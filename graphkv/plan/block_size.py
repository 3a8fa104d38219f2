"""Step 1: choose the page size in tokens, aligning attention pages with Mamba states.

In a hybrid model one page index must hold an attention page and a Mamba state in the same
bytes, so the attention page is grown until it holds a whole state and the Mamba page is padded
up to the attention page.
"""

from __future__ import annotations

import itertools
import math

import attrs

from graphkv.errors import PlanError, Problem
from graphkv.plan.plan import BlockSizeChoice
from graphkv.spec.backends import Backend, MultipleOf
from graphkv.spec._checks import cdiv
from graphkv.spec.layers import LayerKind, MambaCacheMode, MambaSpec
from graphkv.spec.limits import Limits
from graphkv.spec.model import LayerDecl, ModelKV

__all__ = ["choose_block_size", "pad_mamba_layers"]

DEFAULT_BLOCK_SIZE = 16
MLA_HYBRID_ALIGNMENT = 128
"""Tokens a hybrid (attention + Mamba) model's page is a multiple of when its attention is MLA (vLLM 0.33)."""


def choose_block_size(model: ModelKV, limits: Limits) -> BlockSizeChoice:
    """Pick ``block_size`` (and ``mamba_block_size`` for hybrid models) following DESIGN step 1.

    Pure; raises :class:`PlanError` when a user-set ``mamba_block_size`` conflicts.
    """
    attention = [layer for layer in model.layers if not layer.spec.is_ssm]
    mamba = [layer for layer in model.layers if layer.spec.is_ssm]
    # sizes are asked once per distinct spec / backend (models repeat a few specs over many layers)
    attention_specs = set(layer.spec for layer in attention)
    mamba_specs = set(layer.spec for layer in mamba)

    if limits.block_size is not None:
        block_size, reason = limits.block_size, f"block_size={limits.block_size} set by the user"
    elif attention:
        first: dict[str, Backend] = {}  # one per backend name, as vLLM asks each backend class for its sizes
        for layer in attention:
            first.setdefault(layer.backend.name, layer.backend)
        block_size, reason = _preferred_block_size(list(first.values()))
    else:
        block_size, reason = DEFAULT_BLOCK_SIZE, f"no attention layers: default {DEFAULT_BLOCK_SIZE}"

    if not mamba:
        if limits.mamba_block_size is not None:
            raise PlanError(Problem(field="mamba_block_size", value=limits.mamba_block_size,
                                    limit="the model has no Mamba / state layers", fix="leave mamba_block_size unset"))
        return BlockSizeChoice(block_size=block_size, mamba_block_size=None, reason=reason)

    # M: what one page must hold (a user's page_size_padded counts); the record keeps the real bytes.
    state_bytes = max(spec.page_size_bytes(block_size) for spec in mamba_specs)
    real_state_bytes = max(spec.real_page_size_bytes() for spec in mamba_specs)
    if not attention:
        block_size, mamba_bs, reason = _without_attention(block_size, reason, limits)
        return BlockSizeChoice(block_size=block_size, mamba_block_size=mamba_bs, reason=reason,
                               mamba_state_bytes=real_state_bytes, mamba_page_bytes=state_bytes)

    bytes_per_token = max(spec.bytes_per_token() for spec in attention_specs)
    # vLLM 0.33 (Platform._align_hybrid_block_size, commit 4ba787ec9): the first attention backend's smallest kernel
    # block (or the block size) is the step, at least 128 tokens where the attention is MLA (its TRTLLM / FlashInfer
    # decode kernels need the page's kernel blocks aligned to 128 tokens); the result is then rounded up to a
    # multiple of every attention backend's smallest kernel block
    backends = dict.fromkeys(layer.backend for layer in attention)  # each descriptor (a name can have several)
    align = max(attention[0].backend.smallest_kernel_block_size(), block_size)
    why_align = ""
    if any(spec.kind is LayerKind.MLA for spec in attention_specs) and align < MLA_HYBRID_ALIGNMENT:
        align = MLA_HYBRID_ALIGNMENT
        why_align = f" (MLA beside a state: at least {MLA_HYBRID_ALIGNMENT} tokens, as vLLM)"
    every_kernel = math.lcm(*(backend.smallest_kernel_block_size() for backend in backends))
    # vLLM 0.33: in mode align a prefill checkpoint lands on a page boundary, when every state layer exports them
    # (get_mamba_prefill_checkpoint_alignment): the step is a multiple of their alignment
    alignments = [spec.prefill_checkpoint_alignment for spec in mamba_specs if isinstance(spec, MambaSpec)]
    if (limits.mamba_cache_mode is MambaCacheMode.ALIGN and len(alignments) == len(mamba_specs)
            and all(a is not None for a in alignments)):
        every_checkpoint = math.lcm(*(a for a in alignments if a is not None))
        if align % every_checkpoint:
            align = math.lcm(align, every_checkpoint)
            why_align += f" (the lcm with prefill checkpoints every {every_checkpoint} tokens)"
    mode = limits.mamba_cache_mode
    if mode is MambaCacheMode.ALL:
        chunk = limits.mamba_block_size or max(spec.chunk_size for spec in mamba_specs if isinstance(spec, MambaSpec))
        step = math.lcm(chunk, align, every_kernel)
        aligned = step * cdiv(cdiv(state_bytes, bytes_per_token), step)
        if limits.mamba_block_size is not None and limits.mamba_block_size != aligned:
            raise PlanError(Problem(
                field="mamba_block_size", value=limits.mamba_block_size,
                limit=(f"with mamba_cache_mode='all' one attention page must hold a whole Mamba state "
                       f"({state_bytes} bytes = {cdiv(state_bytes, bytes_per_token)} tokens of attention) and be a "
                       f"multiple of lcm(mamba_block_size, kernel alignment {align}{why_align}, every backend's "
                       f"smallest kernel block {every_kernel}) = {step}, which gives {aligned}"),
                fix=f"set mamba_block_size={aligned} or leave it unset"))
        mamba_bs = aligned
        how = (f"lcm(mamba chunk {chunk}, kernel alignment {align}{why_align}, every backend's smallest kernel block "
               f"{every_kernel}) = {step}, times cdiv(state tokens, {step})")
    else:
        aligned = align * cdiv(state_bytes, align * bytes_per_token)
        mamba_bs = None
        how = (f"kernel alignment {align}{why_align} x cdiv({state_bytes} state bytes, {align} x {bytes_per_token} "
               f"bytes/token)")
        if aligned % every_kernel:
            aligned = every_kernel * cdiv(aligned, every_kernel)
            how += f", rounded up to a multiple of every backend's smallest kernel block ({every_kernel})"

    if aligned > block_size:
        reason += f"; grown to {aligned} so one attention page holds one Mamba state ({how})"
        block_size = aligned
    else:
        reason += f"; already holds one Mamba state ({how} = {aligned})"

    if mode is MambaCacheMode.ALIGN:
        if limits.mamba_block_size is not None and limits.mamba_block_size != block_size:
            raise PlanError(Problem(field="mamba_block_size", value=limits.mamba_block_size,
                                    limit=f"with mamba_cache_mode='align' it must equal block_size={block_size}",
                                    fix=f"set mamba_block_size={block_size} or leave it unset"))
        mamba_bs = block_size
    elif mode is MambaCacheMode.NONE and limits.mamba_block_size is not None:
        raise PlanError(Problem(field="mamba_block_size", value=limits.mamba_block_size,
                                limit="mamba_cache_mode='none' keeps one state per request and uses no Mamba block size",
                                fix="leave mamba_block_size unset, or use mamba_cache_mode='align' or 'all'"))
    # The largest attention page is block_size * A1 unless a page_size_padded makes it larger;
    # Mamba pages must equal it exactly so any page index holds either.
    attention_page = max(spec.page_size_bytes(block_size) for spec in attention_specs)
    return BlockSizeChoice(block_size=block_size, mamba_block_size=mamba_bs, reason=reason,
                           mamba_state_bytes=real_state_bytes, mamba_page_bytes=attention_page)


def _preferred_block_size(backends: list[Backend]) -> tuple[int, str]:
    """The block size with none given, as vLLM 0.33 picks it (``Platform._preferred_block_size_for_backends``,
    commit 4ba787ec9): one backend's preferred size (the default 16 if it takes it, else its smallest kernel block);
    with several, 16 if every one takes it, else the smallest lcm of one size per backend that every one takes.
    ``backends`` holds one descriptor per name, the first layer's: vLLM asks a backend class for its sizes without a
    layer (a FlashAttention layer whose own kernel blocks differ, e.g. FlashAttention 4's 64-token fp8 pages at
    512-wide heads beside 256-wide ones, is then refused by the kernel-block step, as vLLM fails at start-up)."""
    first = backends[0]
    if len(backends) == 1:
        size = first.preferred_block_size(DEFAULT_BLOCK_SIZE)
        return size, (f"{first.name} (first attention backend) prefers {size}"
                      + ("" if size == DEFAULT_BLOCK_SIZE else f" ({DEFAULT_BLOCK_SIZE} unsupported)"))
    names = ", ".join(f"{b.name} {b.describe_sizes()}" for b in backends)
    if all(b.supports(DEFAULT_BLOCK_SIZE) for b in backends):
        return DEFAULT_BLOCK_SIZE, f"every attention backend ({names}) takes {DEFAULT_BLOCK_SIZE}"
    per_backend = [[s.n if isinstance(s, MultipleOf) else s for s in b.supported_kernel_block_sizes] or [1]
                   for b in backends]
    for size in sorted({math.lcm(*sizes) for sizes in itertools.product(*per_backend)}):
        if all(b.supports(size) for b in backends):
            return size, f"the smallest size every attention backend ({names}) takes"
    raise PlanError(Problem(field="block_size", value=None, limit=f"the attention backends share no kernel block "
                            f"size: {names}", fix="name one attention backend for every layer (attention_backend)"))


def _without_attention(block_size: int, reason: str, limits: Limits) -> tuple[int, int | None, str]:
    """Block size, Mamba block size and reason of a model with state layers only.

    Without attention a page is one Mamba block, so a user's ``mamba_block_size`` (modes
    ``align`` / ``all``) becomes the block size; it may not contradict a user ``block_size``.
    """
    if limits.mamba_cache_mode is MambaCacheMode.NONE:
        if limits.mamba_block_size is not None:
            raise PlanError(Problem(field="mamba_block_size", value=limits.mamba_block_size,
                                    limit="mamba_cache_mode='none' uses no Mamba block size",
                                    fix="leave mamba_block_size unset, or use mamba_cache_mode='align' or 'all'"))
        return block_size, None, reason
    if limits.mamba_block_size is None:
        return block_size, block_size, reason
    if limits.block_size is not None and limits.block_size != limits.mamba_block_size:
        raise PlanError(Problem(
            field="mamba_block_size", value=limits.mamba_block_size,
            limit=(f"a model without attention layers pages by Mamba block, so it must equal "
                   f"block_size={limits.block_size}"),
            fix=f"set mamba_block_size={limits.block_size}, or leave one of block_size / mamba_block_size unset"))
    reason = (f"mamba_block_size={limits.mamba_block_size} set by the user "
              "(no attention layers: a page is one Mamba block)")
    return limits.mamba_block_size, limits.mamba_block_size, reason


def pad_mamba_layers(model: ModelKV, choice: BlockSizeChoice) -> tuple[LayerDecl, ...]:
    """The model's layers with every Mamba page padded to ``choice.mamba_page_bytes`` (each distinct
    spec is padded once)."""
    target = choice.mamba_page_bytes
    if not target:
        return model.layers
    padded = {spec: attrs.evolve(spec, page_size_padded=target)
              for spec in {layer.spec for layer in model.layers if layer.spec.is_ssm}
              if spec.page_size_bytes() != target}
    return tuple(attrs.evolve(layer, spec=padded[layer.spec]) if layer.spec in padded else layer
                 for layer in model.layers)
