"""Cache dtypes by name, with their item sizes, without importing torch.

Planning must run on a laptop in milliseconds, so dtypes are plain names here; the runtime
maps them to ``torch.dtype`` with :func:`DType.to_torch`.
"""

from __future__ import annotations

import enum
from typing import Any

from graphkv.errors import Problem, SpecError

__all__ = ["DType", "parse_cache_dtype", "parse_dtype"]


class DType(enum.Enum):
    """A cache element type: ``value`` is the canonical torch name."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT8_E4M3 = "float8_e4m3fn"
    FLOAT8_E5M2 = "float8_e5m2"
    UINT8 = "uint8"
    INT32 = "int32"
    INT64 = "int64"
    # Runtime bookkeeping types (ledger entries of host arrays and masks); never a cache dtype, so no alias parses to them.
    INT16 = "int16"
    BOOL = "bool"

    @property
    def is_floating(self) -> bool:
        """Whether it holds floating-point values (what a K/V cache or a recurrent state stores)."""
        return "float" in self.value

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self]

    def to_torch(self) -> Any:
        """The matching ``torch.dtype`` (imports torch; runtime only)."""
        import torch

        return getattr(torch, self.value)


_ITEMSIZE = {
    DType.FLOAT32: 4,
    DType.BFLOAT16: 2,
    DType.FLOAT16: 2,
    DType.FLOAT8_E4M3: 1,
    DType.FLOAT8_E5M2: 1,
    DType.UINT8: 1,
    DType.INT32: 4,
    DType.INT64: 8,
    DType.INT16: 2,
    DType.BOOL: 1,
}

_ALIASES = {
    "float32": DType.FLOAT32,
    "fp32": DType.FLOAT32,
    "float": DType.FLOAT32,
    "bfloat16": DType.BFLOAT16,
    "bf16": DType.BFLOAT16,
    "float16": DType.FLOAT16,
    "fp16": DType.FLOAT16,
    "half": DType.FLOAT16,
    "float8_e4m3fn": DType.FLOAT8_E4M3,
    "fp8": DType.FLOAT8_E4M3,
    "fp8_e4m3": DType.FLOAT8_E4M3,
    "float8_e5m2": DType.FLOAT8_E5M2,
    "fp8_e5m2": DType.FLOAT8_E5M2,
    "uint8": DType.UINT8,
    "int32": DType.INT32,
    "int64": DType.INT64,
}


def parse_dtype(value: "DType | str", *, field: str = "dtype") -> DType:
    """Turn a dtype name (``"bf16"``, ``"torch.float16"``, ``"fp8"``) or a :class:`DType` into a DType.

    Raises :class:`SpecError` naming ``field`` and the accepted names for anything else.
    """
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        key = value.strip().lower().removeprefix("torch.")
        if key in _ALIASES:
            return _ALIASES[key]
    raise SpecError(
        Problem(
            field=field,
            value=value,
            limit=f"must be one of {sorted(_ALIASES)}",
            fix=f"pass a supported dtype name for {field}, e.g. 'bfloat16'",
        )
    )


_CACHE_ADVICE = {"kv_cache_dtype": "bfloat16, float16 or fp8", "mamba_ssm_dtype": "float32, bfloat16 or float16"}


def parse_cache_dtype(value: "DType | str", *, field: str) -> DType:
    """:func:`parse_dtype` for a dtype a user gives a cache (``kv_cache_dtype``, ``mamba_ssm_dtype``):
    an integer type (``uint8``, ``int32``, ``int64``) is refused too, since keys, values and recurrent
    states are floating-point (an integer cache would truncate them; only graphkv's own indexer keys are
    stored as uint8)."""
    dtype = parse_dtype(value, field=field)
    if not dtype.is_floating:
        what = "recurrent states are" if field == "mamba_ssm_dtype" else "keys and values are"
        raise SpecError(Problem(field=field, value=value, limit=f"is an integer type; {what} floating-point, so a "
                                                                  f"cache of {dtype.value} would truncate them",
                                fix=f"set {field} to the weights' floating-point type, e.g. bfloat16"
                                if field.startswith("config.") else
                                f"set {field} to {_CACHE_ADVICE.get(field, 'bfloat16')}, or leave it unset for "
                                "the model's"))
    return dtype
