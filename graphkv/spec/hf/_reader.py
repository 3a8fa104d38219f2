"""Typed access to a Hugging Face config dict that records problems instead of raising.

Every problem is recorded once per field on one :class:`~graphkv.spec._checks.Checker` (config
fields are named ``config.<field>``, keyword overrides by their own name) and raised together
by :meth:`ConfigReader.raise_if_any` — never a ``KeyError`` or ``TypeError``. A config whose
layers cannot be understood at all stops at once with one problem (:meth:`ConfigReader.fail`).

Counts and sizes are checked against plausibility caps (:data:`CAPS`): no served model comes
near them, so a larger value is a typo or a corrupt file, and is refused with the cap in the
message rather than planned into absurd numbers.
"""

from __future__ import annotations

from typing import Any, Mapping, NoReturn

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec._checks import Checker
from graphkv.spec.budget import ASSUMED_ARCH, GPU
from graphkv.spec.dtypes import DType
from graphkv.spec.split_rules import Refusal, SplitRule, split_count

__all__ = ["CAPS", "MISSING", "ConfigReader", "Options"]


class _Missing:
    """Marks a field absent from the config (shown as ``<missing>`` in messages)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()

CAPS: Mapping[str, int] = {
    "layers": 16_384,  # decoder layers (largest served: ~130)
    "heads": 16_384,  # attention, KV, Mamba or linear-attention heads (largest: 256)
    "dim": 65_536,  # head dims, latent ranks, state sizes (largest: 640)
    "width": 1 << 20,  # hidden sizes and channel counts (largest: ~30k)
    "kernel": 1_024,  # convolution kernels (largest: 4)
    "positions": 1 << 24,  # context lengths, RoPE scaling included (largest served: 10_485_760, Llama 4 Scout)
}
"""Plausibility caps per kind of number (see the module docstring)."""


@attrs.frozen(kw_only=True)
class Options:
    """The keyword overrides of ``model_from_hf_config``, resolved against the config."""

    tp: int
    model_dtype: DType  # the checkpoint's dtype: conv states use it
    attention_dtype: DType  # attention / MLA cache
    ssm_dtype: DType | None  # recurrent state asked for by the user or config; None: the family's default
    attention_backend: str  # non-MLA attention layers ("auto": vLLM's pick on gpu_arch)
    mla_backend: str  # MLA layers ("auto": vLLM's pick on gpu_arch)
    state_checkpoint_tokens: int | None = None  # the family's prefill checkpoints in align mode, where it exports them
    gpu_arch: str = ASSUMED_ARCH  # the compute capability the backends are chosen for (graphkv.spec.hf.gpu_backends)
    gpu: Any = None  # the GPU as the user gave it (a GPU, a name, an architecture); None: gpu_arch is assumed

    @property
    def gpu_value(self) -> Any:
        """The GPU as the user gave it, as a problem on ``gpu`` shows it (a GPU by its name)."""
        return self.gpu.name if isinstance(self.gpu, GPU) else self.gpu

    @property
    def gpu_label(self) -> str:
        """How messages name the planned GPU: ``"L40S (sm_89)"``, ``"sm_89"`` for an architecture given as such,
        ``"sm_90 (assumed: no GPU named)"``."""
        if self.gpu is None:
            return f"{self.gpu_arch} (assumed: no GPU named)"
        name = str(self.gpu_value).strip()
        return self.gpu_arch if name.lower() == self.gpu_arch else f"{name} ({self.gpu_arch})"

    def state_dtype(self, default: DType | None = None) -> DType:
        """The recurrent-state dtype: the one asked for, else ``default``, else the model dtype."""
        if self.ssm_dtype is not None:
            return self.ssm_dtype
        return self.model_dtype if default is None else default


class ConfigReader:
    """Reads fields of one config; ``label`` (the family) appears in "is required" messages."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self.check = Checker("config")
        self.label = ""  # the family, once known
        self._reported: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value of ``key``; ``default`` when absent or ``null``."""
        value = self.config.get(key)
        return default if value is None else value

    def has(self, key: str) -> bool:
        """Whether ``key`` is present and not ``null``."""
        return self.config.get(key) is not None

    def present(self, key: str) -> bool:
        """Whether ``key`` is written at all, even as ``null``."""
        return key in self.config

    def first_present(self, *keys: str) -> str:
        """The first of ``keys`` the config sets (the first key if none): for renamed fields."""
        return next((key for key in keys if self.has(key)), keys[0])

    def problem(self, key: str, value: Any, limit: str, fix: str) -> None:
        """Record a problem on ``config.<key>`` (once per key)."""
        if key not in self._reported:
            self._reported.add(key)
            self.check.add(key, value, limit, fix)

    def argument_problem(self, field: str, value: Any, limit: str, fix: str) -> None:
        """Record a problem on a keyword argument (named without the ``config.`` prefix)."""
        if field not in self._reported:
            self._reported.add(field)
            self.check.problems.append(Problem(field=field, value=value, limit=limit, fix=fix))

    def fail(self, key: str, value: Any, limit: str, fix: str) -> NoReturn:
        """Stop reading: the layers cannot be understood; one problem, one line, naming ``key``."""
        raise SpecError(Problem(field=f"config.{key}", value=value, limit=limit, fix=fix))

    def raise_if_any(self) -> None:
        """Raise one SpecError with every problem recorded so far."""
        self.check.raise_if_any()

    def int_field(self, key: str, *, default: Any = MISSING, minimum: int = 1, cap: str | None = None,
                  why: str = "", also: tuple[str, ...] = ()) -> int | None:
        """An int >= ``minimum`` (and <= ``CAPS[cap]``) read from ``key`` or, when absent, the
        first of its older names ``also``; records a problem and returns ``None`` otherwise."""
        name = next((k for k in (key, *also) if self.has(k)), key)
        value = self.get(name, default)
        if value is MISSING:
            reason = why or (f"for {self.label} configs" if self.label else "")
            older = f" (or its older name {' / '.join(also)})" if also else ""
            self.problem(key, MISSING, f"is required{older} {reason}".rstrip(),
                         f"add {key} (an integer >= {minimum}) from the model's config.json")
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.problem(name, value, f"must be an integer >= {minimum}",
                         f"set {name} to the integer from the model's config.json")
            return None
        if cap is not None and value > CAPS[cap]:
            self.problem(name, value, f"must be <= {CAPS[cap]} (plausibility cap: no served model comes close, so "
                                      "this is a typo or a corrupt config)",
                         f"check {name} against the model's config.json")
            return None
        return value

    def optional_int(self, key: str, *, cap: str | None = None, also: tuple[str, ...] = ()) -> int | None:
        """A positive int when set, ``None`` when absent; a bad value records a problem."""
        if not any(self.has(k) for k in (key, *also)):
            return None
        return self.int_field(key, cap=cap, also=also)

    def flag(self, key: str, default: bool = False) -> bool:
        """A boolean field; anything else records a problem and reads as ``default``."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.problem(key, value, "must be true or false", f"set {key} to a boolean")
            return default
        return value

    def split(self, key: str, value: int | None, tp: int, rule: SplitRule = SplitRule.DIVIDE) -> int | None:
        """``value`` (the unsplit count) when ``tp`` ranks can split it by ``rule``; otherwise record
        a problem naming ``key`` and return ``None``. The reader builds every spec with unsplit
        counts and shards the model afterwards, with the same rules (:mod:`graphkv.spec.split_rules`)."""
        if value is None:
            return None
        result = split_count(value, tp, rule, name=key)
        if isinstance(result, Refusal):
            self.problem(key, value, result.limit, result.fix)
            return None
        return value
