"""The memory budget for the KV pool: explicit bytes, or a GPU with a utilization fraction."""

from __future__ import annotations

import math
import numbers
import re
import types
from typing import Mapping

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.spec._checks import Checker, as_int, is_bool

__all__ = ["ARCH_OF_GPU", "ASSUMED_ARCH", "DEFAULT_UTILIZATION", "GPU", "KNOWN_GPUS", "MAX_BYTES", "Budget", "arch_of",
           "format_bytes", "parse_bytes"]

_MiB = 1 << 20
DEFAULT_UTILIZATION = 0.9  # the share of GPU memory a budget takes unless told


@attrs.frozen(kw_only=True)
class GPU:
    """A GPU model: its name, the memory the driver reports as total and its compute capability
    (``arch``, e.g. ``"sm_90"``; ``None``: not known)."""

    name: str
    total_memory_bytes: int = attrs.field(converter=as_int)
    arch: str | None = None

    def __attrs_post_init__(self) -> None:
        check = Checker(f"GPU[{self.name}]")
        check.positive_int("total_memory_bytes", self.total_memory_bytes)
        check.raise_if_any()


KNOWN_GPUS: Mapping[str, GPU] = types.MappingProxyType({
    g.name.lower(): g
    for g in (
        GPU(name="H100", total_memory_bytes=81559 * _MiB, arch="sm_90"),  # H100 SXM 80GB HBM3, as nvidia-smi reports
        GPU(name="H200", total_memory_bytes=143771 * _MiB, arch="sm_90"),
        GPU(name="A100-80GB", total_memory_bytes=81920 * _MiB, arch="sm_80"),
        GPU(name="A100-40GB", total_memory_bytes=40960 * _MiB, arch="sm_80"),
        GPU(name="L40S", total_memory_bytes=46068 * _MiB, arch="sm_89"),
        GPU(name="RTX4090", total_memory_bytes=24564 * _MiB, arch="sm_89"),
    )
})


ASSUMED_ARCH = "sm_90"
"""The architecture a plan that names no GPU is made for: graphkv's target, an H100 (its backends, its cuBLAS
workspaces)."""

ARCH_OF_GPU: Mapping[str, str] = types.MappingProxyType({k: g.arch for k, g in KNOWN_GPUS.items() if g.arch})
"""The compute capability of each known GPU (lower-case names of :data:`KNOWN_GPUS`)."""


def arch_of(gpu: "GPU | str | None") -> str | None:
    """The compute capability (``"sm_90"``) of ``gpu`` (a :class:`GPU`, or a known GPU's name, any case);
    ``None`` for no GPU or one whose architecture graphkv does not know."""
    if isinstance(gpu, str):
        gpu = KNOWN_GPUS.get(gpu.strip().lower())
    return gpu.arch if isinstance(gpu, GPU) else None


def get_gpu(name: str) -> GPU:
    """Look up a known GPU by name (case-insensitive)."""
    try:
        return KNOWN_GPUS[name.strip().lower()]
    except (KeyError, AttributeError):
        raise SpecError(Problem(field="gpu", value=name, limit=f"must be one of {[g.name for g in KNOWN_GPUS.values()]}",
                                fix="pick a known GPU or give the KV memory directly (e.g. kv_cache_bytes / --kv-memory 40GiB)")) from None


def _gpu_or_raw(value: object) -> object:
    """attrs converter: a known GPU name becomes its :class:`GPU`; anything else is kept for validation."""
    if isinstance(value, str):
        return KNOWN_GPUS.get(value.strip().lower(), value)
    return value


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
MAX_BYTES = 1 << 50  # 1 PiB: more memory than any one machine has; larger sizes are typing mistakes
_MAX_SIZE_CHARS = 64


def parse_bytes(text: "str | int", *, field: str = "bytes") -> int:
    """Parse ``"40GiB"``, ``"512 MiB"``, ``"1.5GB"`` or a plain integer into bytes.

    Exact (decimal arithmetic, no float rounding or overflow). A count of bytes must be whole: a
    size in bytes with a fraction (``"1.5B"``, ``"1073741824.5"``) is refused naming the nearest
    whole sizes; with a larger unit the fraction is of that unit, and the byte it may leave over
    is dropped (``"24.42GiB"``, as graphkv's own advice prints sizes, is 26221201489 bytes). A
    number must be a whole count of bytes too: an int (numpy ints too) or an integral float
    (``4e9``); a bool, a float with a fraction (``1.5``), NaN or infinity is refused. Refuses
    empty text, negative numbers and sizes above :data:`MAX_BYTES` (1 PiB) with a
    :class:`SpecError` naming ``field``.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif isinstance(text, numbers.Number) or is_bool(text):
        value = _whole_bytes(text, field)
    else:
        raw = str(text)
        if len(raw) > _MAX_SIZE_CHARS:
            raise SpecError(Problem(field=field, value=raw[:24] + "…",
                                    limit=f"is {len(raw)} characters long; no size needs more than {_MAX_SIZE_CHARS}",
                                    fix="write a number followed by B, KiB, MiB, GiB, TiB, KB, MB, GB or TB, e.g. 40GiB"))
        match = re.fullmatch(r"\s*([0-9]*)(?:\.([0-9]*))?\s*([a-zA-Z]*)\s*", raw)
        if match is None or not (match.group(1) or match.group(2)) or match.group(3).lower() not in _UNITS:
            why = "is empty" if not raw.strip() else "must be a size like 40GiB, 512MiB, 1.5GB or a byte count"
            raise SpecError(Problem(field=field, value=text, limit=why,
                                    fix="write a number followed by B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"))
        whole, frac, unit = match.group(1) or "0", match.group(2) or "", _UNITS[match.group(3).lower()]
        value = (int(whole) * unit) + (int(frac) * unit // 10 ** len(frac) if frac else 0)
        if unit == 1 and frac.strip("0"):
            nearest = [f"{n}B" for n in (value, value + 1) if n > 0]
            raise SpecError(Problem(field=field, value=text, limit=f"is {whole}.{frac} bytes, not a whole number of "
                                                                   "bytes",
                                    fix=f"give a whole number of bytes, {' or '.join(nearest)}, or a size with a "
                                        "unit such as 1.5GiB"))
    if value > MAX_BYTES:
        raise SpecError(Problem(field=field, value=text, limit=f"is more than {format_bytes(MAX_BYTES)}, more memory "
                                                                "than any one machine has",
                                fix="check the number and its unit (e.g. 40GiB)"))
    return value


def _whole_bytes(number: "numbers.Number", field: str) -> int:
    """A byte count given as a number other than an int: a whole one as an int, else a :class:`SpecError`."""
    if isinstance(number, numbers.Integral) and not is_bool(number):
        return int(number)
    if isinstance(number, numbers.Real) and not is_bool(number) and math.isfinite(number) \
            and float(number).is_integer():
        return int(number)
    if is_bool(number):
        why, fix = "is a bool, not a byte count", "pass a byte count such as 1 << 30 or a size such as '1GiB'"
    elif isinstance(number, numbers.Real) and math.isfinite(number):
        why = "is not a whole number of bytes (a float with a fraction)"
        fix = f"pass a whole number of bytes, e.g. {max(math.ceil(number), 1)}, or a size string such as '1.5GiB'"
    else:
        why, fix = "is not a finite byte count", "pass a byte count such as 1 << 30 or a size such as '1GiB'"
    raise SpecError(Problem(field=field, value=number, limit=why, fix=fix))


def _fraction(value: object) -> object:
    """attrs converter: a real number of another type (a numpy float) becomes a float, read from its
    text (``np.float32(0.9)`` is 0.9, not 0.8999999761581421); anything else is kept for the check."""
    if isinstance(value, numbers.Real) and not isinstance(value, (int, float)) and not is_bool(value):
        try:
            return float(str(value))
        except ValueError:
            return float(value)
    return value


def format_bytes(n: int, *, rounding: str = "nearest") -> str:
    """Human-readable binary size, e.g. ``1.50 GiB``.

    ``rounding="up"`` / ``"down"`` for a bound a fix names: ``raise ... to >= 25.51 MiB`` must be
    enough and ``lower ... to <= 22.69 GiB`` must fit once :func:`parse_bytes` reads the text back.
    """
    assert rounding in ("nearest", "up", "down"), rounding
    value = float(n)
    for power, unit in enumerate(("B", "KiB", "MiB", "GiB", "TiB")):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)} B"
            if rounding == "nearest" or n < 0:
                return f"{value:.2f} {unit}"
            hundredths, rest = divmod(n * 100, 1 << (10 * power))  # exact: no float rounding either way
            hundredths += rounding == "up" and rest > 0
            return f"{hundredths // 100}.{hundredths % 100:02d} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@attrs.frozen(kw_only=True)
class Budget:
    """Bytes the KV pool may take.

    Either ``kv_cache_bytes`` directly, or ``gpu`` with ``utilization``: the pool gets
    ``total * utilization - weights_bytes - activation_bytes - graph_reserve_bytes``.
    Build with :meth:`kv_bytes` or :meth:`for_gpu`.
    """

    kv_cache_bytes: int | None = attrs.field(default=None, converter=as_int)
    gpu: GPU | None = attrs.field(default=None, converter=_gpu_or_raw)
    utilization: float = attrs.field(default=DEFAULT_UTILIZATION, converter=_fraction)
    weights_bytes: int = attrs.field(default=0, converter=as_int)
    activation_bytes: int = attrs.field(default=0, converter=as_int)
    graph_reserve_bytes: int = attrs.field(default=0, converter=as_int)

    def __attrs_post_init__(self) -> None:
        check = Checker("Budget")
        if (self.kv_cache_bytes is None) == (self.gpu is None):
            check.add("kv_cache_bytes", self.kv_cache_bytes, "give exactly one of kv_cache_bytes or gpu",
                      "use Budget.kv_bytes(n) or Budget.for_gpu(gpu, utilization=...)")
        if self.kv_cache_bytes is not None:
            check.positive_int("kv_cache_bytes", self.kv_cache_bytes)
        if self.gpu is not None and not isinstance(self.gpu, GPU):
            check.add("gpu", self.gpu, f"must be a GPU or one of {[g.name for g in KNOWN_GPUS.values()]}",
                      "pick a known GPU name, pass GPU(name=..., total_memory_bytes=...) or use Budget.kv_bytes(n)")
        if isinstance(self.utilization, bool) or not isinstance(self.utilization, (int, float)):
            check.add("utilization", self.utilization, f"must be a number in (0, 1], not a "
                      f"{type(self.utilization).__name__}", "use a fraction such as 0.9 (a float, not a string)")
        elif not 0 < self.utilization <= 1:
            check.add("utilization", self.utilization, "must be in (0, 1]", "use a fraction such as 0.9")
        for field in ("weights_bytes", "activation_bytes", "graph_reserve_bytes"):
            check.non_negative_int(field, getattr(self, field))
        if not check.problems and self.gpu is not None and self.kv_pool_bytes() <= 0:
            check.problems.append(self._does_not_fit())
        check.raise_if_any()

    def _does_not_fit(self) -> Problem:
        """The problem of a GPU budget that leaves nothing for the pool, with the fixes
        ``graphkv plan --gpu`` computes (:mod:`graphkv.spec.gpu_room`), in this class's field names."""
        from graphkv.spec.gpu_room import API_WORDS, GpuRoom, does_not_fit  # (it imports this module)

        assert self.gpu is not None
        room = GpuRoom(gpu=self.gpu, utilization=self.utilization, weights_bytes=self.weights_bytes,
                       activation_bytes=self.activation_bytes, graph_reserve_bytes=self.graph_reserve_bytes,
                       min_pool_bytes=0, default_utilization=DEFAULT_UTILIZATION,
                       typed={"gpu": self.gpu.name, "weights": self.weights_bytes or None,
                              "utilization": None if self.utilization == DEFAULT_UTILIZATION else self.utilization,
                              "activations": self.activation_bytes or None,
                              "reserve": self.graph_reserve_bytes or None})
        problem = does_not_fit(room, weights_from="weights_bytes", words=API_WORDS)
        return attrs.evolve(problem, field=f"Budget.{problem.field}")

    @classmethod
    def kv_bytes(cls, n: "int | str") -> "Budget":
        """A budget of exactly ``n`` bytes (``"40GiB"`` accepted) for the KV pool."""
        size = parse_bytes(n, field="kv_cache_bytes")
        if size == 0 and isinstance(n, str):  # name what was typed ('0.0001KiB'), not the 0 it gave
            raise SpecError(Problem(field="kv_cache_bytes", value=n, limit="is zero bytes",
                                    fix="give the KV pool a size above 0, e.g. '40GiB'"))
        return cls(kv_cache_bytes=size)

    @classmethod
    def for_gpu(cls, gpu: "GPU | str", *, utilization: float = 0.9, weights_bytes: "int | str" = 0,
                activation_bytes: "int | str" = 0, graph_reserve_bytes: "int | str" = 0) -> "Budget":
        """A budget of ``total * utilization`` minus weights, activations and graph reserve (each a
        byte count or a size such as ``"16GiB"``, read as :meth:`kv_bytes` reads its size)."""
        sizes = {name: parse_bytes(value, field=name) if isinstance(value, str) else value
                 for name, value in (("weights_bytes", weights_bytes), ("activation_bytes", activation_bytes),
                                     ("graph_reserve_bytes", graph_reserve_bytes))}
        return cls(gpu=get_gpu(gpu) if isinstance(gpu, str) else gpu, utilization=utilization, **sizes)

    def kv_pool_bytes(self) -> int:
        """Bytes available to the KV pool."""
        if self.kv_cache_bytes is not None:
            return self.kv_cache_bytes
        assert self.gpu is not None
        return (int(self.gpu.total_memory_bytes * self.utilization) - self.weights_bytes
                - self.activation_bytes - self.graph_reserve_bytes)

    def describe(self) -> str:
        """Where the KV bytes come from, in words."""
        if self.kv_cache_bytes is not None:
            return f"{format_bytes(self.kv_cache_bytes)} given for the KV pool"
        assert self.gpu is not None
        return (f"{self.gpu.name} {format_bytes(self.gpu.total_memory_bytes)} x {self.utilization} "
                f"- weights {format_bytes(self.weights_bytes)} - activations {format_bytes(self.activation_bytes)} "
                f"- graph reserve {format_bytes(self.graph_reserve_bytes)} = {format_bytes(self.kv_pool_bytes())}")
