"""The small-matmul kernel (few rows times a weight matrix) against the shared reference, on every device present;
the ``graphkv::small_linear`` op that picks it per call; the pass that routes a traced forward's linear calls."""

from __future__ import annotations

import pytest
import torch

import graphkv.runtime.ops.small_linear_op as small_linear_op
from graphkv.errors import SpecError
from graphkv.kernels.small_matmul import SmallMatmulConfig, small_matmul, small_matmul_config
from graphkv.runtime.capture.piecewise import piecewise_backend
from graphkv.runtime.capture.small_matmuls import route_small_matmuls
from graphkv.runtime.ops.reference import linear_ref
from graphkv.runtime.ops.small_linear_op import SMALL_LINEAR_ROWS, small_linear

EPS = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def assert_matches_reference(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None = None) -> None:
    """Each output within one rounding to its dtype of the float64 product, plus float32 accumulation error
    (``K * 2^-23`` of the sum of the products' magnitudes)."""
    want = linear_ref(x, weight, bias)
    magnitude = linear_ref(x.abs(), weight.abs(), None if bias is None else bias.abs())
    bound = 2 * EPS[out.dtype] * want.abs() + x.shape[1] * 2.0 ** -23 * magnitude + 1e-30
    error = (out.cpu().double() - want).abs()
    assert bool((error <= bound).all()), f"largest error {float(error.max()):.3g} over bound at {error.argmax()}"


def _operands(rows: int, out_features: int, in_features: int, dtype: torch.dtype, seed: int, device: str):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=gen).to(dtype).to(device)
    weight = torch.randn(out_features, in_features, generator=gen).to(dtype).to(device)
    bias = torch.randn(out_features, generator=gen).to(dtype).to(device)
    return x, weight, bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,out_features,in_features", [(1, 1, 1), (1, 7, 17), (3, 33, 130), (5, 100, 257),
                                                           (8, 64, 1000), (16, 19, 48)])
def test_matches_the_reference_over_awkward_sizes(rows, out_features, in_features, dtype, device):
    """Rows 1-16, output and input widths that fill no tile, three dtypes, with and without a bias."""
    x, weight, bias = _operands(rows, out_features, in_features, dtype, seed=rows * out_features, device=device)
    out = small_matmul(x, weight, bias)
    assert out.shape == (rows, out_features) and out.dtype == dtype and out.device.type == device
    assert_matches_reference(out, x, weight, bias)
    assert_matches_reference(small_matmul(x, weight), x, weight)


@pytest.mark.parametrize("config", [SmallMatmulConfig(tile_n=1, tile_k=16), SmallMatmulConfig(tile_n=4, tile_k=64),
                                    SmallMatmulConfig(tile_n=64, tile_k=64, num_warps=8, num_stages=2)])
def test_every_tiling_gives_the_same_product(config, device):
    """Tiles narrower and wider than the output (masked tails in both directions) give the reference's values."""
    x, weight, bias = _operands(3, 70, 150, torch.float32, seed=7, device=device)
    assert_matches_reference(small_matmul(x, weight, bias, config=config), x, weight, bias)


def test_strided_operands_and_output_are_read_through_their_strides(device):
    """``x`` every other column of a wider tensor, the weight some rows of a merged weight (a projection's view), the
    output a column slice of a wider tensor: the kernel writes only its slice."""
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(4, 2 * 40, generator=gen).to(device)
    merged = torch.randn(3 * 24, 40, generator=gen).to(device)
    x, weight = wide[:, ::2], merged[24:48]
    canvas = torch.full((4, 50), 7.0, device=device)
    out = canvas[:, 10:34]
    small_matmul(x, weight, out=out)
    assert_matches_reference(out, x, weight)
    assert bool((canvas[:, :10] == 7).all()) and bool((canvas[:, 34:] == 7).all())


def test_a_strided_or_expanded_bias_is_read_through_its_stride(device):
    """A bias taken as every other element of a wider tensor, and one expanded from a single value (stride 0)."""
    x, weight, _ = _operands(2, 6, 16, torch.float32, seed=8, device=device)
    wide = torch.randn(6, 2, generator=torch.Generator().manual_seed(9)).to(device)
    for bias in (wide[:, 1], wide[:1, 0].expand(6)):
        assert bias.stride(0) != 1
        assert_matches_reference(small_matmul(x, weight, bias), x, weight, bias)


def test_empty_shapes(device):
    """No rows: an empty output; no input features: the bias (or zeros), as torch's linear gives."""
    x, weight, bias = _operands(2, 5, 0, torch.float32, seed=1, device=device)
    assert torch.equal(small_matmul(x, weight, bias).cpu(), bias.cpu().expand(2, 5))
    assert torch.equal(small_matmul(x, weight).cpu(), torch.zeros(2, 5))
    assert small_matmul(x[:0], weight).shape == (0, 5)


def test_bad_arguments_are_refused_naming_each():
    """Too many rows, a mismatched width, dtype, bias and output: one error naming every field, value and fix."""
    x, weight, bias = _operands(17, 6, 8, torch.float32, seed=2, device="cpu")
    with pytest.raises(SpecError, match=r"x=\(17, 8\).*num_rows <= 16.*torch's matmul"):
        small_matmul(x, weight)
    with pytest.raises(SpecError) as error:
        small_matmul(x[:2, :7].half(), weight, bias[:5], out=torch.empty(2, 5))
    assert [p.field for p in error.value.problems] == ["x", "x.dtype", "bias", "out"]
    with pytest.raises(SpecError, match=r"weight=\(\(8,\)"):
        small_matmul(x[:2], weight[0])
    with pytest.raises(SpecError) as error:
        SmallMatmulConfig(tile_n=3, tile_k=8, num_warps=4, num_stages=0)
    assert [p.field for p in error.value.problems] == ["tile_n", "tile_k", "num_stages"]
    with pytest.raises(SpecError, match=r"config='tile_n=64, tile_k=512, num_warps=4 at 3 rows': 1024 partial sums "
                                        r"a thread; at most 128 .*smaller tile_n or tile_k"):
        small_matmul(x[:3], weight, config=SmallMatmulConfig(tile_n=64, tile_k=512))


def test_default_configuration_fills_the_gpu():
    """The widest tiles (up to 16 weight rows) that still give each SM four programs; K pieces holding 4,096 partial
    sums per program, 16-1,024 wide."""
    assert small_matmul_config(1, 2048, 2048, num_sms=132) == SmallMatmulConfig(tile_n=2, tile_k=1024)
    assert small_matmul_config(1, 12288, 2048, num_sms=132) == SmallMatmulConfig(tile_n=16, tile_k=256)
    assert small_matmul_config(8, 4096, 2048, num_sms=132) == SmallMatmulConfig(tile_n=4, tile_k=128)
    assert small_matmul_config(16, 151936, 2048, num_sms=132) == SmallMatmulConfig(tile_n=16, tile_k=16)
    assert small_matmul_config(1, 7, 17, num_sms=132) == SmallMatmulConfig(tile_n=1, tile_k=32)
    assert small_matmul_config(3, 96, 64, num_sms=1) == SmallMatmulConfig(tile_n=16, tile_k=64)


def test_small_linear_picks_the_kernel_for_few_rows(monkeypatch):
    """Up to 8 rows with kernels resolving to Triton run the kernel (leading dimensions flattened); 9 rows,
    ``kernels="torch"`` / ``"auto"`` on a CPU, float64 or mismatched dtypes run torch's linear, bit for bit (or
    raising as it does)."""
    launched = []

    def counting(x, *args, **kwargs):
        launched.append(tuple(x.shape))
        return small_matmul(x, *args, **kwargs)

    monkeypatch.setattr(small_linear_op, "small_matmul", counting)
    x, weight, bias = _operands(9, 24, 40, torch.float32, seed=5, device="cpu")
    out = small_linear(x[:8].reshape(2, 4, 40), weight, bias, kernels="triton")
    assert launched == [(8, 40)] and out.shape == (2, 4, 24)
    assert_matches_reference(out.reshape(8, 24), x[:8], weight, bias)
    assert SMALL_LINEAR_ROWS == 8
    assert torch.equal(small_linear(x, weight, bias, kernels="triton"), torch.nn.functional.linear(x, weight, bias))
    for kernels in ("torch", "auto"):
        assert torch.equal(small_linear(x[:2], weight, kernels=kernels), torch.nn.functional.linear(x[:2], weight))
    double = x[:2].double(), weight.double(), bias.double()  # a dtype the kernel does not take: torch's, exactly
    assert torch.equal(small_linear(*double, kernels="triton"), torch.nn.functional.linear(*double))
    with pytest.raises(RuntimeError):  # mismatched dtypes: torch's own error, as without graphkv
        small_linear(x[:2], weight.half(), kernels="triton")
    assert len(launched) == 1
    with pytest.raises(SpecError, match="kernels=.cuda."):
        small_linear(x, weight, kernels="cuda")


def test_the_custom_op_passes_torch_checks():
    """``graphkv::small_linear``'s schema and fake implementation agree with the real one (torch.library.opcheck)."""
    x, weight, bias = _operands(3, 20, 16, torch.float32, seed=4, device="cpu")
    torch.library.opcheck(torch.ops.graphkv.small_linear.default, (x, weight, bias, "triton"),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.graphkv.small_linear.default, (x.reshape(1, 3, 16), weight, None, "torch"),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("fuse", [False, True])
def test_compiled_forward_routes_its_linears(fuse, monkeypatch):
    """A two-linear toy compiled with the piecewise backend: both calls become the op; at 3 rows both run the kernel
    and the output equals eager torch's within float32 rounding; at 11 torch's matmul runs (exactly eager's,
    unfused)."""
    launched = []
    kernel = small_linear_op.small_matmul
    monkeypatch.setattr(small_linear_op, "small_matmul", lambda x, *a, **k: launched.append(x.shape[0]) or
                        kernel(x, *a, **k))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.SiLU(), torch.nn.Linear(40, 12, bias=False))
    backend = piecewise_backend(fuse=fuse, small_matmul_kernels="triton")
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for rows in (3, 11):
            x = torch.randn(rows, 24)
            want = model(x)
            got = compiled(x)
            if rows > SMALL_LINEAR_ROWS and not fuse:  # Inductor's SiLU may round differently from eager's
                assert torch.equal(got, want)
            else:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert backend.num_small_matmuls == 2 and launched == [3, 3]


def test_autocast_and_float64_linears_are_not_routed():
    """Under autocast (the linear casts its operands) and in float64 the pass leaves the linear to torch: the
    compiled result has eager's dtype and values; a float32 model routes."""
    model = torch.nn.Linear(16, 8)
    x = torch.randn(2, 16)
    with torch.no_grad():
        for dtype, autocast in ((torch.float32, True), (torch.float64, False), (torch.float32, False)):
            backend = piecewise_backend(small_matmul_kernels="triton")
            layer, inputs = model.to(dtype), x.to(dtype)
            compiled = torch.compile(layer, backend=backend)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                want, got = layer(inputs), compiled(inputs)
            assert got.dtype == want.dtype and torch.allclose(got.double(), want.double(), rtol=1e-5, atol=1e-5)
            assert backend.num_small_matmuls == (1 if (dtype, autocast) == (torch.float32, False) else 0)
            torch._dynamo.reset()


def test_torch_kernels_route_nothing():
    """With ``small_matmul_kernels="torch"`` (graphkv.hf passes its resolved kernels: torch's on a CPU by default) the
    linears stay torch's: nothing is routed, the output is eager's exactly."""
    model = torch.nn.Linear(16, 8)
    backend = piecewise_backend(small_matmul_kernels="torch")
    x = torch.randn(2, 16)
    with torch.no_grad():
        assert torch.equal(torch.compile(model, backend=backend)(x), model(x))
    assert backend.num_small_matmuls == 0


def test_routing_leaves_what_it_cannot_run():
    """A linear whose output needs a gradient (training) is not routed, the same call without one is; so is one of an
    aten graph (its values under ``val``); a bad kernels choice is refused at once."""
    model = torch.nn.Linear(8, 4)

    def traced(needs_grad: bool, key: str = "example_value") -> torch.fx.GraphModule:
        gm = torch.fx.symbolic_trace(lambda x, w, b: torch.nn.functional.linear(x, w, b))
        for node in gm.graph.nodes:  # symbolic_trace records no values: give them as Dynamo (or AOT) would
            node.meta[key] = {"x": torch.empty(2, 8), "w": model.weight.detach(), "b": model.bias.detach()}.get(
                node.name, torch.empty(2, 4, requires_grad=needs_grad) if node.op == "call_function" else None)
        return gm

    assert route_small_matmuls(traced(needs_grad=True), "triton") == 0
    routed = traced(needs_grad=False)
    assert route_small_matmuls(routed, "triton") == 1
    assert [n.target for n in routed.graph.nodes if n.op == "call_function"] == [
        torch.ops.graphkv.small_linear.default]
    assert route_small_matmuls(traced(needs_grad=False, key="val"), "triton") == 1
    with pytest.raises(SpecError, match="kernels=.gpu."):
        piecewise_backend(small_matmul_kernels="gpu")


_COMPILE_LOOP = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from graphkv.kernels.small_matmul import _small_matmul_kernel
fn = _small_matmul_kernel.compiled
found = {}
for tile_m, tile_n, tile_k in json.loads(sys.argv[1]):
    # as the JIT specializes a launch on contiguous bf16 tensors: unit strides constant, 16-byte aligned pointers
    const = {"HAS_BIAS": False, "TILE_M": tile_m, "TILE_N": tile_n, "TILE_K": tile_k, "stride_xk": 1,
             "stride_wk": 1, "stride_on": 1}
    pointers = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16"}
    signature = {a: "constexpr" if a in const else pointers.get(a, "i32") for a in fn.arg_names}
    aligned = ("x_ptr", "w_ptr", "out_ptr", "K", "stride_xm", "stride_wn", "stride_om")
    src = ASTSource(fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
                    attrs={(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned})
    asm = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm
    loop = asm["ttgir"][asm["ttgir"].index("scf.for"):asm["ttgir"].index("scf.yield")]
    found[f"{tile_m}x{tile_n}x{tile_k}"] = [loop.count("convert_layout"), asm["ptx"].count("ld.global.v4.b32"),
                                            asm["ptx"].count("ld.global.b16")]
print(json.dumps(found))
"""


def test_the_compiled_loop_only_streams():
    """Compiled for sm_90 as a launch on contiguous bf16 tensors specializes it (no GPU needed): at the default
    tiles of 1 and 8 rows the loop moves no operand between layouts (a 3-D product did, through shared memory with a
    barrier, every iteration) and reads with 16-byte loads only, none of single elements."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia", reason="Triton was built without its NVIDIA backend")
    tiles = [(1, 2, 1024), (1, 16, 256), (8, 4, 128)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_LOOP, json.dumps(tiles)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"1x2x1024": [0, 4, 0], "1x16x256": [0, 8, 0], "8x4x128": [0, 8, 0]}
