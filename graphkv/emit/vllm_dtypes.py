"""The cache dtypes ``vllm serve`` takes, and graphkv's dtypes by the names it takes them.

vLLM 0.33 declares them in ``vllm/config/cache.py``: ``CacheDType`` for ``--kv-cache-dtype`` and
``MambaDType`` for ``--mamba-ssm-cache-dtype`` (pydantic refuses anything else at start-up). graphkv
plans with real element types (:class:`~graphkv.spec.dtypes.DType`), so a plan whose attention or
state dtype has no vLLM name (a float32 KV cache, an fp8 or integer state) cannot be emitted as a
``vllm serve`` command: :func:`vllm_kv_cache_dtype` / :func:`vllm_mamba_ssm_dtype` refuse it with
the values vLLM takes and the ones graphkv can plan, naming the option as typed.
"""

from __future__ import annotations

import types
from typing import Mapping

from graphkv.errors import Problem, SpecError
from graphkv.spec.dtypes import DType, parse_dtype

__all__ = ["VLLM_CACHE_DTYPES", "VLLM_MAMBA_DTYPES", "vllm_kv_cache_dtype", "vllm_mamba_ssm_dtype"]

VLLM_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                     "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                     "turboquant_3bit_nc", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit",
                     "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4",
                     "nvfp4_4over6")
"""``CacheDType`` of vLLM 0.33: what ``--kv-cache-dtype`` accepts ("auto": the model's dtype)."""

VLLM_MAMBA_DTYPES = ("auto", "float32", "float16", "bfloat16")
"""``MambaDType`` of vLLM 0.33: what ``--mamba-ssm-cache-dtype`` accepts."""

_KV_NAMES: Mapping[DType, str] = types.MappingProxyType({
    DType.BFLOAT16: "bfloat16", DType.FLOAT16: "float16", DType.FLOAT8_E4M3: "fp8", DType.FLOAT8_E5M2: "fp8_e5m2"})
_MAMBA_NAMES: Mapping[DType, str] = types.MappingProxyType({
    DType.FLOAT32: "float32", DType.FLOAT16: "float16", DType.BFLOAT16: "bfloat16"})


def vllm_kv_cache_dtype(typed: "str | DType", planned: DType | None = None) -> str:
    """The ``--kv-cache-dtype`` value for the attention cache graphkv planned (``planned``; else
    ``typed`` as :func:`parse_dtype` reads it). Raises :class:`SpecError` on ``kv_cache_dtype``
    when vLLM has no such cache dtype (float32, integers)."""
    dtype = planned if planned is not None else parse_dtype(typed, field="kv_cache_dtype")
    return _vllm_name(dtype, typed, _KV_NAMES, field="kv_cache_dtype", what="the attention cache",
                      flag="--kv-cache-dtype", accepted=f"{', '.join(VLLM_CACHE_DTYPES)} (float32 only as 'auto', the "
                                                        "dtype of a float32 model)",
                      fix="set kv_cache_dtype to bfloat16, float16, fp8 or fp8_e5m2 (graphkv plans them and vLLM "
                          "takes them), or leave it unset for the model's dtype")


def vllm_mamba_ssm_dtype(typed: "str | DType") -> str:
    """The ``--mamba-ssm-cache-dtype`` value for the state dtype ``typed``. Raises :class:`SpecError`
    on ``mamba_ssm_dtype`` for a dtype vLLM's ``MambaDType`` does not list (fp8, integers)."""
    dtype = parse_dtype(typed, field="mamba_ssm_dtype")
    return _vllm_name(dtype, typed, _MAMBA_NAMES, field="mamba_ssm_dtype", what="the states",
                      flag="--mamba-ssm-cache-dtype", accepted=", ".join(VLLM_MAMBA_DTYPES),
                      fix="set mamba_ssm_dtype to float32, bfloat16 or float16, or leave it unset for the model's")


def _vllm_name(dtype: DType, typed: "str | DType", names: Mapping[DType, str], *, field: str, what: str, flag: str,
               accepted: str, fix: str) -> str:
    """vLLM's name for ``dtype`` in ``names``, or a :class:`SpecError` on ``field`` listing what ``flag`` takes."""
    if dtype in names:
        return names[dtype]
    raise SpecError(Problem(field=field, value=typed,
                            limit=f"plans {what} in {dtype.value}, which vLLM 0.33 cannot hold: its {flag} takes "
                                  f"{accepted}", fix=fix))
