"""Every runtime kernel compiles to an sm_90 cubin with no GPU: the interpreter never type-checks
a kernel, so this catches what only a real compile would. Compiles run in a fresh process (with
TRITON_INTERPRET=1 in its environment Triton builds triton.language for the interpreter and
nothing compiles), and also after interpreted launches in that process, as on a GPU machine whose
tests run CPU and CUDA launches side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")
nvidia = pytest.importorskip("triton.backends.nvidia", reason="Triton was built without its NVIDIA backend")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from graphkv.kernels import block_tables, paged_attention, reshape_and_cache, small_matmul  # noqa: E402

PTXAS = os.path.join(os.path.dirname(nvidia.__file__), "bin", "ptxas")
pytestmark = pytest.mark.skipif(not os.path.exists(PTXAS), reason=f"no ptxas bundled with Triton at {PTXAS}")

SPLIT = {"query_ptr": "*bf16", "cache_ptr": "*bf16", "block_table_ptr": "*i32", "seq_lens_ptr": "*i32",
         "sinks_ptr": "*fp32", "out_ptr": "*bf16", "ws_ptr": "*fp32", "scale": "fp32", "softcap": "fp32"}
SPLIT_FP32 = {**SPLIT, "query_ptr": "*fp32", "cache_ptr": "*fp32", "out_ptr": "*fp32"}
SPLIT_FP16 = {**SPLIT, "query_ptr": "*fp16", "cache_ptr": "*fp16", "out_ptr": "*fp16", "sinks_ptr": "*bf16"}
COMBINE = {"ws_ptr": "*fp32", "sinks_ptr": "*bf16", "out_ptr": "*bf16"}
DECODE = {"QUERIES_PER_KV": 4, "KERNEL_BLOCK_SIZE": 16, "HEAD_SIZE": 128, "HAS_WINDOW": False, "HAS_SINKS": False,
          "HAS_SOFTCAP": False, "ONE_SPLIT": False, "DOT_PRECISION": "tf32", "UPCAST_DOT": False, "TILE_G": 16,
          "TILE_N": 64, "TILE_D": 128}
CASES = {
    "write_pages": (block_tables._write_pages_kernel, {"flat_ptr": "*i32", "staged_ptr": "*i64"},
                    {"TILE_E": 64, "MAX_BPK": 32}),
    "gather_rows": (block_tables._gather_rows_kernel,
                    {"src_ptr": "*i32", "dst_ptr": "*i32", "offsets_ptr": "*i64", "widths_ptr": "*i32",
                     "idx_mapping_ptr": "*i32"}, {"TILE": 256}),
    "reshape_and_cache": (reshape_and_cache._reshape_and_cache_kernel,
                          {"key_ptr": "*bf16", "value_ptr": "*bf16", "cache_ptr": "*bf16", "slot_mapping_ptr": "*i64",
                           "NUM_SLOTS": "i64"},
                          {"KERNEL_BLOCK_SIZE": 16, "HAS_VALUE": True, "TILE_H": 8, "TILE_D": 128}),
    "reshape_and_cache_latent": (reshape_and_cache._reshape_and_cache_kernel,
                                 {"key_ptr": "*fp16", "value_ptr": "*fp16", "cache_ptr": "*fp16",
                                  "slot_mapping_ptr": "*i64"},
                                 {"KERNEL_BLOCK_SIZE": 64, "HAS_VALUE": False, "TILE_H": 1, "TILE_D": 512}),
    "paged_decode_split_gqa4_kbs16": (paged_attention._paged_decode_split_kernel, SPLIT, DECODE),
    "paged_decode_split_window_sinks_softcap": (paged_attention._paged_decode_split_kernel, SPLIT,
                                                {**DECODE, "HAS_WINDOW": True, "HAS_SINKS": True,
                                                 "HAS_SOFTCAP": True}),
    "paged_decode_one_split_fp16_gqa5_kbs64_d80": (paged_attention._paged_decode_split_kernel, SPLIT_FP16,
                                                   {**DECODE, "QUERIES_PER_KV": 5, "KERNEL_BLOCK_SIZE": 64,
                                                    "HEAD_SIZE": 80, "ONE_SPLIT": True, "HAS_SINKS": True}),
    "paged_decode_one_split_fp32_mha_d64": (paged_attention._paged_decode_split_kernel, SPLIT_FP32,
                                            {**DECODE, "QUERIES_PER_KV": 1, "HEAD_SIZE": 64, "ONE_SPLIT": True,
                                             "DOT_PRECISION": "ieee", "TILE_N": 64, "TILE_D": 64}),
    "paged_decode_fp32_d16_kbs32": (paged_attention._paged_decode_split_kernel, SPLIT_FP32,
                                    {**DECODE, "KERNEL_BLOCK_SIZE": 32, "HEAD_SIZE": 16, "HAS_WINDOW": True,
                                     "DOT_PRECISION": "ieee", "TILE_N": 128, "TILE_D": 16}),
    "small_matmul_bf16_1row": (small_matmul._small_matmul_kernel,
                               {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16"},
                               {"HAS_BIAS": False, "TILE_M": 1, "TILE_N": 2, "TILE_K": 512}),
    "small_matmul_fp16_8rows_bias": (small_matmul._small_matmul_kernel,
                                     {"x_ptr": "*fp16", "w_ptr": "*fp16", "bias_ptr": "*fp16", "out_ptr": "*fp16"},
                                     {"HAS_BIAS": True, "TILE_M": 8, "TILE_N": 4, "TILE_K": 256}),
    "small_matmul_fp32_16rows": (small_matmul._small_matmul_kernel,
                                 {"x_ptr": "*fp32", "w_ptr": "*fp32", "bias_ptr": "*fp32", "out_ptr": "*fp32"},
                                 {"HAS_BIAS": True, "TILE_M": 16, "TILE_N": 16, "TILE_K": 32}),
    "paged_decode_combine": (paged_attention._paged_decode_combine_kernel, COMBINE,
                             {"HEAD_SIZE": 128, "HAS_SINKS": True, "TILE_SPLITS": 64, "TILE_S": 16, "TILE_D": 128}),
}


def interpret_each_kernel() -> None:
    """Launch the kernels once each on CPU tensors (Triton's interpreter; paged decode calls tl.zeros,
    tl.sum and tl.max, the interpreted @triton.jit functions whose patches used to outlive a launch)."""
    import torch

    from graphkv import CacheOrder, KVLayout

    block_tables.write_pages(torch.zeros(8, dtype=torch.int32), torch.tensor([0, 2, 2]), 1, 2)
    layout = KVLayout(order=CacheOrder.BLOCKS_FIRST)
    cache = torch.ones(2, 2, 16, 1, 8)
    reshape_and_cache.reshape_and_cache(torch.ones(1, 1, 8), torch.ones(1, 1, 8), cache, torch.tensor([3]),
                                        layout=layout)
    small_matmul.small_matmul(torch.ones(2, 8), torch.ones(3, 8))
    for num_splits in (1, 2):  # the split kernel alone, then with the combine kernel
        paged_attention.paged_decode_attention(torch.ones(1, 2, 8), cache, torch.tensor([[1]], dtype=torch.int32),
                                               torch.tensor([5], dtype=torch.int32), layout=layout,
                                               num_splits=num_splits)


def compile_all() -> dict[str, str]:
    """Compile every case; ``{name: "ok" | error text}``. Run without TRITON_INTERPRET (with it,
    triton.language is built for the interpreter and cannot compile)."""
    results = {}
    for name, (kernel, types, constexprs) in sorted(CASES.items()):
        fn = kernel if isinstance(kernel, JITFunction) else kernel.compiled
        signature = {a: "constexpr" if a in constexprs else types.get(a, "i32") for a in fn.arg_names}
        src = ASTSource(fn=fn, signature=signature,
                        constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
        try:
            results[name] = "ok" if triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["cubin"] else "empty"
        except Exception as e:  # noqa: BLE001 — reported per kernel by the test
            results[name] = f"{type(e).__name__}: {e}"[-2000:]
    return results


def unspecialized() -> dict[str, list[str]]:
    """Per kernel, the arguments its compiled ``JITFunction`` does not specialise on (run without TRITON_INTERPRET,
    where ``compiled`` is the real JITFunction)."""
    kernels = {name: kernel for name, (kernel, _, _) in CASES.items()}
    return {name: [p.name for p in kernel.compiled.params if p.do_not_specialize] for name, kernel in kernels.items()}


@pytest.mark.parametrize("interpret_first", [False, True])
def test_every_kernel_compiles_for_sm90(interpret_first, tmp_path):
    """Each kernel lowers through Triton, LLVM and ptxas for sm_90 without a device, also after interpreted launches."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # an empty cache: every case really compiles
    argv = [sys.executable, __file__, *(["--interpret-first"] if interpret_first else [])]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=os.path.dirname(__file__))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    results = out["compiled"]
    assert set(results) == set(CASES)
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, failed
    # the table kernels run per step outside any graph: a count first seen mid-serving must not compile a variant
    assert {k: v for k, v in out["unspecialized"].items() if v} == {"write_pages": ["NUM_ENTRIES"],
                                                                    "gather_rows": ["NUM_REQS"]}


if __name__ == "__main__":
    if "--interpret-first" in sys.argv:
        interpret_each_kernel()
    print(json.dumps({"compiled": compile_all(), "unspecialized": unspecialized()}))
