"""PyTorch's lazy cuBLAS workspaces: the per-stream rule (CublasHandlePool.cpp) and the ledger entry that charges it."""

from __future__ import annotations

import pytest

from graphkv import Budget, FullAttentionSpec, Limits, ModelKV, compile_plan
from graphkv.errors import SpecError
from graphkv.plan.allocations.blas_workspaces import (WorkspaceSettings, blas_workspaces, cublas_workspace_bytes,
                                                       cublaslt_workspace_bytes, workspace_settings_from)
from graphkv.spec.budget import GPU, KNOWN_GPUS, arch_of

MIB, KIB = 1 << 20, 1 << 10
FULL = FullAttentionSpec(num_kv_heads=8, head_size=128)


@pytest.mark.parametrize("config, expected", [
    (None, 32 * MIB), (":4096:8", 32 * MIB), (":4096:2:16:8", 8 * MIB + 128 * KIB), (":0:0", 0),
    ("4096:8", 32 * MIB),  # no :SIZE:COUNT pair (":8" alone): PyTorch warns and keeps its default
])
def test_cublas_workspace_follows_cublas_workspace_config_on_hopper(config, expected) -> None:
    assert cublas_workspace_bytes("sm_90", WorkspaceSettings(cublas_workspace_config=config)) == expected


def test_other_architectures_default_to_8_mib_and_128_kib() -> None:
    assert [cublas_workspace_bytes(a) for a in ("sm_80", "sm_89", "sm_100")] == [8 * MIB + 128 * KIB] * 3
    assert cublas_workspace_bytes("sm_80", WorkspaceSettings(cublas_workspace_config="junk")) == 8 * MIB + 128 * KIB


def test_cublaslt_workspace_is_1_mib_capped_at_cublas_and_absent_when_unified() -> None:
    assert cublaslt_workspace_bytes("sm_90") == MIB
    assert cublaslt_workspace_bytes("sm_90", WorkspaceSettings(cublaslt_workspace_size="4096")) == 4 * MIB
    assert cublaslt_workspace_bytes("sm_90", WorkspaceSettings(cublaslt_workspace_size="lots")) == MIB  # as torch
    assert cublaslt_workspace_bytes("sm_90", WorkspaceSettings(cublaslt_workspace_size=" 2048KiB")) == 2 * MIB  # stoi
    assert cublaslt_workspace_bytes("sm_90", WorkspaceSettings(cublas_workspace_config=":0:0")) == 0
    assert cublaslt_workspace_bytes("sm_90", WorkspaceSettings(unified=True)) == 0


def test_settings_are_read_from_an_environment_as_pytorch_reads_them() -> None:
    assert workspace_settings_from({}) == WorkspaceSettings() and WorkspaceSettings().is_default
    got = workspace_settings_from({"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "64",
                                   "TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"})
    assert got == WorkspaceSettings(cublas_workspace_config=":16:8", cublaslt_workspace_size="64", unified=True)
    assert not got.is_default
    assert not workspace_settings_from({"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "true"}).unified  # PyTorch takes "1" only


@pytest.mark.parametrize("name, text, read", [("CUBLAS_WORKSPACE_CONFIG", ":4096:2147483648", ":4096:2147483647"),
                                              ("CUBLASLT_WORKSPACE_SIZE", "9" * 5000, "2147483647")])
def test_a_workspace_number_beyond_32_bits_is_refused_naming_the_variable(name: str, text: str, read: str) -> None:
    """A number PyTorch cannot read in its 32-bit std::stoi (5,000 digits raised a raw ValueError in int()) is a
    SpecError on the variable; 2**31 - 1 itself is read."""
    with pytest.raises(SpecError, match=rf"{name}=.*: holds a number above 2147483647") as info:
        workspace_settings_from({name: text})
    assert f"unset {name}" in str(info.value)
    assert workspace_settings_from({name: read}) != WorkspaceSettings()


def test_one_stream_on_hopper_allocates_what_an_h200_measured() -> None:
    """34,603,008 B: the lazy workspaces `graphkv bench memory` measured on an H200 (torch 2.11, 2026-11-25)."""
    w = blas_workspaces("sm_90", num_streams=1)
    assert w.allocated_bytes_per_stream == 34_603_008
    assert w.reserved_bytes_per_stream == 34 * MIB  # its own 32 MiB segment + a 2 MiB small segment
    a100 = blas_workspaces("sm_80", num_streams=1)  # 8.125 MiB: a 20 MiB large segment (under 10 MiB), + 2 MiB
    assert (a100.allocated_bytes_per_stream, a100.reserved_bytes_per_stream) == (9 * MIB + 128 * KIB, 22 * MIB)


def test_known_gpus_have_an_architecture() -> None:
    assert {name: arch_of(g) for name, g in KNOWN_GPUS.items()} == {
        "h100": "sm_90", "h200": "sm_90", "a100-80gb": "sm_80", "a100-40gb": "sm_80", "l40s": "sm_89",
        "rtx4090": "sm_89"}
    assert arch_of(GPU(name="B200", total_memory_bytes=1 << 30)) is None and arch_of(None) is None


def _plan(budget: Budget, mode: str = "FULL_AND_PIECEWISE"):
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")] * 2)
    return compile_plan(model, Limits(max_model_len=4096, max_num_seqs=8, cudagraph_mode=mode), budget)


def test_the_ledger_charges_one_set_per_stream_for_the_plans_gpu() -> None:
    """Graphs captured: the eager steps' stream and the capture stream; none: one. The GPU's architecture sets the
    size; a plan that names no GPU is charged for sm_90 (graphkv's target, PyTorch's largest default)."""
    entry = lambda plan: next(e for e in plan.ledger.other_entries if e.name == "lazy workspaces")  # noqa: E731
    graphs = entry(_plan(Budget.kv_bytes("1GiB")))
    assert graphs.nbytes == 2 * 34 * MIB and graphs.on_device and not graphs.in_kv_budget
    assert graphs.reason == ("cuBLAS 32 MiB + cuBLASLt 1 MiB allocated per stream at its first matmul (PyTorch's "
                             "defaults on sm_90, assumed: no GPU named) x 2 streams (eager steps, CUDA-graph capture), "
                             "34 MiB reserved each")
    eager = entry(_plan(Budget.kv_bytes("1GiB"), mode="NONE"))
    assert eager.nbytes == 34 * MIB and "x 1 stream, 34 MiB" in eager.reason
    a100 = entry(_plan(Budget.for_gpu("A100-80GB")))
    assert a100.nbytes == 2 * 22 * MIB and "(PyTorch's defaults on sm_80)" in a100.reason
    b200 = entry(_plan(Budget.for_gpu(GPU(name="B200", total_memory_bytes=180 << 30))))
    assert b200.nbytes == 2 * 34 * MIB and "(PyTorch's defaults on sm_90, assumed: B200's architecture is not known)" \
        in b200.reason
