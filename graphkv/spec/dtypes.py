"""Cache dtypes by name, with their item sizes, without importing torch.

Planning must run on a laptop in milliseconds, so dtypes are plain names here; the runtime
maps them to ``torch.dtype`` with :func:`DType.to_torch`.
"""

from __future__ import annotations

import enum
from typing import Any

from graphkv.errors import Problem, SpecError

__all__ = ["DType", "parse_dtype"]


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
