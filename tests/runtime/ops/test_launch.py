"""device_kernel: compiled on CUDA tensors, interpreted on CPU tensors, in one process and without TRITON_INTERPRET."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from graphkv import CacheOrder, KVLayout, SpecError
from graphkv.kernels import block_tables
from graphkv.kernels.launch import DeviceKernel, device_kernel
from graphkv.kernels.paged_attention import paged_decode_attention

# Runs every launcher on CPU tensors in a fresh interpreter; prints one JSON line.
SCRIPT = textwrap.dedent("""
    import json, os
    import torch, triton
    from graphkv import CacheOrder, KVLayout
    from graphkv.kernels.block_tables import PackedTables, gather_rows, write_pages
    from graphkv.kernels.paged_attention import paged_decode_attention
    from graphkv.runtime.ops.choice import write_kv
    from graphkv.runtime.ops.reference import (gather_ref, paged_decode_attention_ref, reshape_and_cache_ref,
                                               write_pages_ref)

    results = {"env": "TRITON_INTERPRET" in os.environ, "knob": bool(triton.knobs.runtime.interpret)}
    flat = torch.full((64,), -7, dtype=torch.int32)
    dst, first, bpk = [0, 5, 40], [3, -1, 34], [1, 2, 17]
    got = flat.clone()
    write_pages(got, torch.tensor(dst + first + bpk), 3, 17)
    results["write_pages"] = torch.equal(got, write_pages_ref(flat, dst, first, bpk))
    src, rows = PackedTables.zeros(4, [3, 2], "cpu"), PackedTables.zeros(4, [3, 2], "cpu")
    src.flat.copy_(torch.arange(20, dtype=torch.int32))
    idx = torch.tensor([2, 0], dtype=torch.int32)
    gather_rows(src, rows, idx, 3)
    results["gather_rows"] = all(torch.equal(a[:3], b) for a, b in zip(rows.tables, gather_ref(src.tables, idx, 3)))
    layout = KVLayout(order=CacheOrder.BLOCKS_FIRST)
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(4, 2, 16, 2, 8, generator=gen)
    key, value = torch.randn(5, 2, 8, generator=gen), torch.randn(5, 2, 8, generator=gen)
    slots = torch.tensor([0, 17, -1, 63, 30])
    want = cache.clone()
    reshape_and_cache_ref(key, value, want, slots, layout=layout)
    write_kv(key, value, cache, slots, layout=layout, kernels="triton")
    results["reshape_and_cache"] = torch.equal(cache, want)
    table = torch.tensor([[3, 1, 0, 2], [2, 0, 0, 0]], dtype=torch.int32)
    seq_lens = torch.tensor([54, 1], dtype=torch.int32)
    query = torch.randn(2, 4, 8, generator=gen)
    out = paged_decode_attention(query, cache, table, seq_lens, layout=layout)
    ref = paged_decode_attention_ref(query, cache, table, seq_lens, layout=layout)
    results["paged_decode_attention"] = torch.allclose(out.double(), ref, atol=1e-5, rtol=1e-5)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    out = paged_decode_attention(query, cache, table, seq_lens, layout=layout, sinks=sinks, softcap=3.0, num_splits=3)
    ref = paged_decode_attention_ref(query, cache, table, seq_lens, layout=layout, sinks=sinks, softcap=3.0)
    results["split_decode_attention"] = torch.allclose(out.double(), ref, atol=1e-5, rtol=1e-5)
    print(json.dumps(results))
""")


@triton.jit
def _scaled_sum(x, scale):
    """A helper of one's own: ``scale * sum(x)``."""
    return tl.sum(x, axis=0) * scale


@device_kernel
def _helpers_kernel(
    x_ptr,  # [N] float32
    out_ptr,  # [4] float32: sum * 2, max, x.sum() method call, sum of zeros + 1
    N: tl.constexpr,
):
    x = tl.load(x_ptr + tl.arange(0, N))
    tl.store(out_ptr, _scaled_sum(x, 2.0))
    tl.store(out_ptr + 1, tl.max(x, axis=0))
    tl.store(out_ptr + 2, x.sum(axis=0))
    tl.store(out_ptr + 3, tl.sum(tl.zeros([N], tl.float32) + 1.0, axis=0))


def _language_attributes() -> dict:
    """Every attribute of triton.language, its core module and tensor class, and JITFunction, by identity."""
    return {(owner.__name__, name): id(value)
            for owner in (tl, tl.core, tl.standard, tl.core.tensor, tl.core.dtype, JITFunction)
            for name, value in vars(owner).items()}


@pytest.mark.parametrize("interpret_env", [None, "1"])
def test_kernel_launchers_run_on_cpu_whatever_the_environment_says(interpret_env):
    """A fresh process with or without TRITON_INTERPRET runs every Triton launcher on CPU tensors as the reference."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret_env is not None:
        env["TRITON_INTERPRET"] = interpret_env
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    in_env = interpret_env is not None
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "env": in_env, "knob": in_env, "write_pages": True, "gather_rows": True, "reshape_and_cache": True,
        "paged_decode_attention": True, "split_decode_attention": True}


def test_helpers_and_triton_language_jit_functions_run_on_every_device(device):
    """A kernel calling a @triton.jit helper, tl.sum, tl.max, tl.zeros and x.sum() gives the same numbers everywhere."""
    x = torch.tensor([3.0, -1.0, 4.0, 1.5, -5.0, 9.0, 2.0, 0.5], device=device)
    out = torch.zeros(4, device=device)
    _helpers_kernel[(1,)](x, out, N=8)
    assert out.tolist() == [28.0, 9.0, 14.0, 8.0]


def test_an_interpreted_launch_leaves_triton_language_as_it_was():
    """After a CPU launch calling helpers, triton.language and JITFunction are as before (so later compiles work)."""
    before = _language_attributes()
    _helpers_kernel[(1,)](torch.ones(8), torch.zeros(4), N=8)
    after = _language_attributes()
    assert {k: v for k, v in after.items() if k in before} == before
    assert [k for k in after if k not in before and k[0] != "triton.language.standard"] == []


@pytest.mark.skipif(isinstance(tl.zeros, InterpretedFunction),
                    reason="TRITON_INTERPRET=1 was set before Triton was imported: triton.language is built for the "
                           "interpreter and no kernel can compile in this process")
def test_a_cpu_launch_builds_only_the_interpreted_kernel_even_with_triton_interpret_set(monkeypatch):
    """CPU launches never build the compiled kernel; the compiled form is a JITFunction whatever TRITON_INTERPRET says."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = DeviceKernel(_helpers_kernel.fn)
    out = torch.zeros(4)
    kernel[(1,)](torch.arange(8, dtype=torch.float32), out, N=8)
    assert out.tolist() == [56.0, 7.0, 28.0, 8.0]
    assert kernel._compiled is None
    assert isinstance(kernel.compiled, JITFunction) and not isinstance(triton.jit(_helpers_kernel.fn), JITFunction)


def test_mixed_devices_on_the_interpreter_path_are_spec_errors():
    """A CPU tensor first and one elsewhere later: SpecError naming the kernel, each argument's device and the fix."""
    flat = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(SpecError, match=r"_write_pages_kernel devices=\{'flat_ptr': 'cpu', 'staged_ptr': 'meta'\}: "
                                        r"every tensor argument of one launch must be on one device .*; "
                                        r"move staged_ptr to cpu \(where flat_ptr is\)"):
        block_tables._write_pages_kernel[(1,)](flat, torch.zeros(9, dtype=torch.int64, device="meta"), 3, TILE_E=64,
                                               MAX_BPK=32)
    assert (flat == 0).all()
    layout = KVLayout(order=CacheOrder.BLOCKS_FIRST)
    table = torch.zeros(2, 4, dtype=torch.int32, device="meta")  # the launcher does not check the table's device
    with pytest.raises(SpecError, match=r"'block_table_ptr': 'meta'.*move block_table_ptr to cpu"):
        paged_decode_attention(torch.ones(2, 4, 8), torch.ones(4, 2, 16, 2, 8), table,
                               torch.ones(2, dtype=torch.int32), layout=layout)


@device_kernel
def _old_interpreter_kernel(x_ptr, MESSAGE: tl.constexpr):  # what Triton 3.6's interpreter raises under numpy 2.4
    raise TypeError(MESSAGE)


@pytest.mark.parametrize("numpy_version, triton_version, named", [
    ("2.4.6", "3.6.0", True), ("2.5.0", "3.8.1", True), ("2.3.5", "3.6.0", False), ("2.4.6", "3.9.0", False)])
def test_an_interpreter_that_numpy_refuses_is_named_with_the_fix(monkeypatch, numpy_version, triton_version,
                                                                 named):
    """Triton 3.6's interpreter under numpy 2.4 fails every launch with a loop over a scalar argument ("only
    0-dimensional arrays can be converted to Python scalars"): with numpy 2.4+ and a Triton before 3.9, a GraphkvError
    naming numpy's version, Triton's, the kernel and the fixes, chained to the interpreter's error; with other
    versions, or another error, the interpreter's error stays as it was."""
    import numpy

    from graphkv.errors import GraphkvError

    monkeypatch.setattr(numpy, "__version__", numpy_version)
    monkeypatch.setattr(triton, "__version__", triton_version)
    x = torch.zeros(4)
    message = "only 0-dimensional arrays can be converted to Python scalars"
    with pytest.raises(Exception, match=message if not named else None) as info:
        _old_interpreter_kernel[(1,)](x, MESSAGE=message)
    assert isinstance(info.value, GraphkvError) == named
    if named:
        assert str(info.value) == (
            f"numpy='{numpy_version}': Triton {triton_version}'s interpreter (how _old_interpreter_kernel runs on "
            f"CPU tensors) reads scalar arguments with int() of a one-element array, which numpy 2.4 and later "
            f"refuse; pip install 'numpy<2.4', or a newer Triton (3.9 works), or kernels='torch' on a CPU")
        assert message in str(info.value.__cause__)
    with pytest.raises(Exception, match="something else") as other:
        _old_interpreter_kernel[(1,)](x, MESSAGE="something else")
    assert not isinstance(other.value, GraphkvError)


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="with a GPU a meta tensor would be compiled for; test_cuda_and_cpu_tensors_in_one_launch "
                           "covers the compiled path there")
def test_mixed_devices_on_a_failed_compiled_launch_are_spec_errors():
    """A non-CPU tensor first takes the compiled path; its failure with a CPU tensor later is a chained SpecError."""
    staged = torch.zeros(9, dtype=torch.int64)
    with pytest.raises(SpecError, match=r"'flat_ptr': 'meta', 'staged_ptr': 'cpu'.*move staged_ptr to meta") as info:
        block_tables._write_pages_kernel[(1,)](torch.zeros(64, dtype=torch.int32, device="meta"), staged, 3,
                                               TILE_E=64, MAX_BPK=32)
    assert info.value.__cause__ is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU to put CUDA and CPU tensors in one launch")
def test_cuda_and_cpu_tensors_in_one_launch_are_spec_errors():
    """CUDA then CPU tensors (compiled path) or CPU then CUDA (interpreter path): SpecError, nothing written."""
    flat_gpu, staged_gpu = torch.zeros(64, dtype=torch.int32, device="cuda"), torch.zeros(9, dtype=torch.int64,
                                                                                          device="cuda")
    with pytest.raises(SpecError, match=r"'flat_ptr': 'cuda:0', 'staged_ptr': 'cpu'.*move staged_ptr to cuda:0"):
        block_tables._write_pages_kernel[(1,)](flat_gpu, staged_gpu.cpu(), 3, TILE_E=64, MAX_BPK=32)
    with pytest.raises(SpecError, match=r"'flat_ptr': 'cpu', 'staged_ptr': 'cuda:0'.*move staged_ptr to cpu"):
        block_tables._write_pages_kernel[(1,)](flat_gpu.cpu(), staged_gpu, 3, TILE_E=64, MAX_BPK=32)
    assert (flat_gpu == 0).all()
