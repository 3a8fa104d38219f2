"""Recurrent state layers: one fixed-size state per request, whatever its length.

Every recurrent family caches a few tensors per request, declared as ``shapes`` and ``dtypes``
(vLLM's ``get_mamba_state_shape_from_config`` / ``..._dtype_from_config`` of each model class):

- ``mamba1``: conv ``(d_conv - 1, d_inner)`` and ssm ``(d_inner, d_state)``;
- ``mamba2``: conv ``(d_conv - 1, d_inner + 2 * groups * d_state)`` and ssm ``(heads, head_dim, d_state)``;
- ``gated_delta``: conv ``(k - 1, 2 * k_heads * k_dim + v_heads * v_dim)`` and recurrent
  ``(v_heads, v_dim, k_dim)``;
- ``kda`` (Kimi delta attention): conv ``(k - 1, 3 * heads * head_dim)`` and recurrent
  ``(heads, head_dim, head_dim)`` in float32;
- ``lightning`` (MiniMax linear attention): ``(heads, head_dim, head_dim)``;
- ``short_conv`` (LFM2): conv ``(L_cache - 1, conv_dim)``.

A page holds one whole state: page bytes = ``sum(prod(shape) * itemsize)``, independent of
``block_size``. Pages per request: 1 (mode ``none``), 2 (``align``; Mamba2 layers keep one more
prefill-checkpoint page, as vLLM 0.33's ``MambaMixer2.get_kv_cache_spec``), or one per page of
the request (``all``), each plus one per speculative token.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec._checks import Checker, as_int, cdiv
from graphkv.spec.dtypes import DType
from graphkv.spec.layers._base import LayerKind, MambaCacheMode, PageDemand, RankSpec, check_dtype, dtype_or_raw
from graphkv.spec.layers.state_split import StateSplit

__all__ = ["MambaSpec", "STATE_VARIANTS"]

STATE_VARIANTS: tuple[str, ...] = ("mamba1", "mamba2", "gated_delta", "kda", "lightning", "short_conv")
"""The recurrent families graphkv reads from configs (``variant`` may be any other label too)."""

_CHECKPOINT_VARIANTS = ("mamba2",)  # layers whose kernels export a mid-prefill state (vLLM 0.33)


def _shapes(value: Any) -> Any:
    try:
        return tuple(tuple(int(d) for d in shape) for shape in value)
    except (TypeError, ValueError):
        return value


def _dtypes(value: Any) -> Any:
    if isinstance(value, (str, DType)):
        return (dtype_or_raw(value),)
    try:
        return tuple(dtype_or_raw(v) for v in value)
    except TypeError:
        return value


def _default_checkpoint_pages(spec: "MambaSpec") -> int:
    return 1 if spec.variant in _CHECKPOINT_VARIANTS else 0


@attrs.frozen(kw_only=True, cache_hash=True)
class MambaSpec:
    """Recurrent state of a Mamba / gated-delta / linear-attention / short-conv layer.

    ``shapes`` are the per-request state tensors (e.g. conv ``(k - 1, conv_dim)`` and ssm
    ``(heads, head_dim, state)``), ``dtypes`` one per shape; ``variant`` names the family (see
    :data:`STATE_VARIANTS`). page bytes = ``sum(prod(shape) * itemsize)`` or ``page_size_padded``
    (the planner pads it to the attention page in hybrid models). ``chunk_size`` is the kernel's
    chunk length in tokens (prefix-caching mode ``all``); ``prefill_checkpoint_pages`` the extra
    pages mode ``align`` keeps per request (1 for Mamba2, else 0); ``prefill_checkpoint_alignment`` (optional) the
    tokens a prefill checkpoint lands on in mode ``align``, which the page size becomes a multiple of (vLLM 0.33:
    Qwen's gated-delta layers export checkpoints every 64 tokens with FlashInfer's GDN prefill, its sm_90
    default). ``tp_split`` (optional) says
    how the shapes split over tensor-parallel ranks (:class:`StateSplit`); at ``tp=1`` it must give
    ``shapes``. Without it the state cannot be sharded (:meth:`per_rank` refuses ``tp > 1``).
    """

    shapes: tuple[tuple[int, ...], ...] = attrs.field(converter=_shapes)
    dtypes: tuple[DType, ...] = attrs.field(converter=_dtypes)
    variant: str = "mamba2"
    chunk_size: int = attrs.field(default=256, converter=as_int)
    page_size_padded: int | None = attrs.field(default=None, converter=as_int)
    prefill_checkpoint_pages: int = attrs.field(default=attrs.Factory(_default_checkpoint_pages, takes_self=True),
                                                converter=as_int)
    tp_split: StateSplit | None = None
    prefill_checkpoint_alignment: int | None = attrs.field(default=None, converter=as_int)

    kind = LayerKind.MAMBA
    is_ssm = True
    holds_cache = True

    def __attrs_post_init__(self) -> None:
        check = Checker(type(self).__name__)
        shapes_ok = isinstance(self.shapes, tuple) and len(self.shapes) > 0
        if not shapes_ok:
            check.add("shapes", self.shapes, "must be a non-empty tuple of shapes",
                      "pass e.g. shapes=((3, 8192), (64, 64, 128))")
        else:
            for i, shape in enumerate(self.shapes):
                if not shape or any(d <= 0 for d in shape):
                    check.add(f"shapes[{i}]", shape, "every dimension must be > 0",
                              "derive the state shape from positive config sizes")
        if not isinstance(self.dtypes, tuple):
            check.add("dtypes", self.dtypes, "must be a tuple of dtypes", "pass one dtype per state shape")
        else:
            for i, dt in enumerate(self.dtypes):
                check_dtype(check, f"dtypes[{i}]", dt)
            if shapes_ok and len(self.dtypes) != len(self.shapes):
                names = tuple(dt.value if isinstance(dt, DType) else dt for dt in self.dtypes)
                check.add("dtypes", names,
                          f"needs one dtype per shape ({len(self.shapes)} shapes, {len(names)} dtypes)",
                          "pass as many dtypes as shapes")
        if not isinstance(self.variant, str) or not self.variant:
            check.add("variant", self.variant, "must be a non-empty name", f"use one of {list(STATE_VARIANTS)}")
        check.positive_int("chunk_size", self.chunk_size)
        check.non_negative_int("prefill_checkpoint_pages", self.prefill_checkpoint_pages)
        if self.prefill_checkpoint_alignment is not None:
            check.positive_int("prefill_checkpoint_alignment", self.prefill_checkpoint_alignment)
        if self.page_size_padded is not None and check.positive_int("page_size_padded", self.page_size_padded):
            if not check.problems and self.page_size_padded < self.real_page_size_bytes():
                check.add("page_size_padded", self.page_size_padded,
                          f"must be >= the real state size {self.real_page_size_bytes()} bytes",
                          "leave page_size_padded unset or raise it")
        if self.tp_split is not None and not check.problems:
            self._check_split(check)
        check.raise_if_any()

    def _check_split(self, check: Checker) -> None:
        if not isinstance(self.tp_split, StateSplit):
            check.add("tp_split", self.tp_split, "must be a StateSplit or None", "build it with StateSplit.<variant>(...)")
            return
        try:
            unsplit = self.tp_split.shapes_per_rank(1)
        except (SpecError, IndexError, TypeError):
            unsplit = None
        if unsplit != self.shapes:
            check.add("tp_split", unsplit, f"must describe shapes={self.shapes} at tp=1",
                      "build tp_split from the same sizes as shapes (StateSplit.<variant>(...))")

    def per_rank(self, tp_size: int) -> RankSpec:
        """The state one of ``tp_size`` ranks holds (shapes from :attr:`tp_split`; each rank its own
        heads, so ``replicas`` is 1). Raises :class:`SpecError` naming every count ``tp_size`` cannot
        split, or when the state declares no ``tp_split``."""
        if tp_size == 1:
            return RankSpec(spec=self)
        if self.tp_split is None:
            raise SpecError(Problem(field="MambaSpec.tp_split", value=None,
                                    limit=f"is needed to split the {self.variant} state {self.shapes} over tp={tp_size}",
                                    fix="declare tp_split=StateSplit.<variant>(...) with the unsplit head counts, or "
                                        "build the per-rank shapes yourself"))
        return RankSpec(spec=attrs.evolve(self, shapes=self.tp_split.shapes_per_rank(tp_size), tp_split=None))

    @property
    def uniform_type_key(self) -> None:
        """States group with equal states only (no per-layer slot sizes)."""
        return None

    def state_bytes(self) -> tuple[int, ...]:
        """Bytes of each state tensor."""
        return tuple(math.prod(s) * dt.itemsize for s, dt in zip(self.shapes, self.dtypes))

    def real_page_size_bytes(self, block_size: int = 0) -> int:
        """Unpadded bytes of one whole state (``block_size`` is ignored)."""
        return sum(self.state_bytes())

    def page_size_bytes(self, block_size: int = 0) -> int:
        """Bytes of one page as allocated (``block_size`` is ignored)."""
        real = self.real_page_size_bytes()
        return real if self.page_size_padded is None else self.page_size_padded

    def bytes_per_token(self) -> int:
        """A recurrent state does not grow per token."""
        return 0

    def max_pages(self, demand: PageDemand) -> int:
        """Pages per request: 1 (none), 2 + ``prefill_checkpoint_pages`` (align) or
        ``cdiv(max_model_len, block_size)`` (all), plus one per speculative block."""
        if demand.mamba_cache_mode is MambaCacheMode.ALL:
            base = cdiv(demand.max_model_len, demand.block_size)
        elif demand.mamba_cache_mode is MambaCacheMode.ALIGN:
            # vLLM 0.33: MambaSpec.max_memory_usage_bytes keeps 2 + num_prefill_checkpoint_blocks in align mode
            base = 2 + self.prefill_checkpoint_pages
        else:
            base = 1
        return base + demand.num_speculative_blocks

    def describe(self) -> str:
        """A short human description."""
        parts = " + ".join(f"{s}:{d.value}" for s, d in zip(self.shapes, self.dtypes))
        return f"{self.variant} state {parts}"

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready fields, ``kind`` first."""
        fields: dict[str, Any] = {"kind": self.kind.value, "variant": self.variant,
                                  "state_shapes": [list(s) for s in self.shapes],
                                  "state_dtypes": [d.value for d in self.dtypes], "chunk_size": self.chunk_size}
        if self.page_size_padded is not None:
            fields["page_size_padded"] = self.page_size_padded
        return fields
