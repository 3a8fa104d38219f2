"""The compile mode each --compile name selects, the GPU default and its environment override, the graph mode."""

from __future__ import annotations

import pytest

from graphkv.command.compile_flag import (COMPILE_BY_NAME, GPU_COMPILE_ENV, GPU_DEFAULT_COMPILE, check_compile,
                                          default_compile, gpu_default_compile, graph_mode_for)
from graphkv.errors import SpecError
from graphkv.spec.limits import CudaGraphMode


def test_the_gpu_default_is_the_constant_unless_the_environment_names_a_mode(monkeypatch) -> None:
    """Unset (or empty): GPU_DEFAULT_COMPILE (True, compiled attention regions). GRAPHKV_GPU_COMPILE=fused: 'fused'
    on a GPU, and its plans ask for FULL_AND_PIECEWISE; a CPU stays uncompiled either way."""
    monkeypatch.delenv(GPU_COMPILE_ENV, raising=False)
    assert GPU_DEFAULT_COMPILE is True and gpu_default_compile() is True and gpu_default_compile({}) is True
    assert gpu_default_compile({GPU_COMPILE_ENV: ""}) is True
    assert default_compile("cuda") is True and graph_mode_for(None) is CudaGraphMode.FULL_DECODE_ONLY
    monkeypatch.setenv(GPU_COMPILE_ENV, "fused")
    assert default_compile("cuda") == "fused" and default_compile("cpu") is False
    assert graph_mode_for(None) is CudaGraphMode.FULL_AND_PIECEWISE
    assert graph_mode_for(True) is CudaGraphMode.FULL_DECODE_ONLY  # an explicit mode is kept
    for name, mode in COMPILE_BY_NAME.items():
        if name != "auto":
            assert gpu_default_compile({GPU_COMPILE_ENV: name}) == mode
    assert gpu_default_compile({GPU_COMPILE_ENV: "none"}) is False


@pytest.mark.parametrize("value", ["auto", "Fused", "yes", "1"])
def test_a_bad_environment_value_names_the_variable_and_the_modes(value: str) -> None:
    """'auto' (which would mean itself), a wrong case or a flag value: SpecError naming $GRAPHKV_GPU_COMPILE."""
    with pytest.raises(SpecError) as info:
        gpu_default_compile({GPU_COMPILE_ENV: value})
    assert info.value.field == "$GRAPHKV_GPU_COMPILE" and info.value.value == value
    assert "must be one of attention, model, piecewise, fused, none" in str(info.value)


def test_check_compile_refuses_what_is_no_mode() -> None:
    """None and the five modes pass; a list or a wrong case is a SpecError naming compile."""
    assert [check_compile(m) for m in (None, True, False, "model", "piecewise", "fused")] == [
        None, True, False, "model", "piecewise", "fused"]
    for bad in (["fused"], "Fused", 1.5):
        with pytest.raises(SpecError, match="compile="):
            check_compile(bad)
