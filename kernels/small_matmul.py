"""Small-batch matmul: ``out[M, N] = x[M, K] @ weight[N, K]^T (+ bias)`` for a few rows, read at memory speed.

Why: a decode step at a small batch multiplies a handful of token rows by every weight matrix of the model, so its
time is the time to read the weights. On an H100 (ninth session's profile of the 0.94B model at batch 1) cuBLAS read
them at about 2.0 TB/s, 0.7x of a device copy's rate, in tiles of 64 weight rows by 8 (padded) token rows: 860 us of
a 1.35 ms step. This kernel gives each program a few weight rows (``TILE_N``) and the whole of ``K``, so an
``N = 2048`` matrix is read by hundreds of programs at once, each streaming its rows in ``TILE_K`` pieces; the
token rows are multiplied in float32 registers (no tensor cores: at ``M <= 8`` a matmul is a sum of products), the
partial sums kept per lane across the loop and reduced once.

Launch configuration: :func:`small_matmul_config` (tile sizes from ``M``, ``N``, ``K`` and the SM count; every
value can be overridden for a sweep, ``benchmarks/gpu_linear.py``). Capture-safe: the launch reads only shapes on
the host and allocates nothing when ``out`` is given.
"""

from __future__ import annotations

import attrs
import torch
import triton
import triton.language as tl

from graphkv.errors import Problem, SpecError
from graphkv.kernels.decode_splits import DEFAULT_NUM_SMS
from graphkv.kernels.launch import device_kernel

__all__ = ["MAX_SMALL_MATMUL_ROWS", "MAX_SUMS_PER_THREAD", "SMALL_MATMUL_DTYPES", "SmallMatmulConfig",
           "check_small_matmul", "small_matmul", "small_matmul_config"]

MAX_SMALL_MATMUL_ROWS = 16
"""The most rows (tokens) :func:`small_matmul` takes; more rows are a real matmul, for cuBLAS."""

SMALL_MATMUL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""The dtypes :func:`small_matmul` multiplies (``x`` and the weight one of them, the same)."""
_PRODUCT_FLOATS = 4096  # TILE_M * TILE_N * TILE_K partial sums held per program (32 float32 a thread at 4 warps)
MAX_SUMS_PER_THREAD = 128
"""The most float32 partial sums a launch may keep per thread (``TILE_M * TILE_N * TILE_K / (32 * num_warps)``):
beyond it the registers spill (4 x 64 x 512 at 4 warps, 512 a thread, spilled 39 KB) and larger tiles fail to
compile."""


@device_kernel
def _small_matmul_kernel(
    x_ptr,  # [M, K] (any strides)
    w_ptr,  # [N, K] (any strides)
    bias_ptr,  # [N] (unused when HAS_BIAS is False)
    out_ptr,  # [M, N] (any strides)
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_b, stride_om, stride_on,
    HAS_BIAS: tl.constexpr,
    TILE_M: tl.constexpr,
    TILE_N: tl.constexpr,
    TILE_K: tl.constexpr,
):
    # One 2-D tile of TILE_M * TILE_N (token row, weight row) pairs by TILE_K: pair r multiplies token row
    # r // TILE_N by weight row r % TILE_N. The pairs of one weight row load the same bytes in the same iteration
    # (the cache serves all but the first), and every operand keeps the one layout its load has: a 3-D product
    # made Triton move each piece through shared memory, with a barrier, every iteration.
    r = tl.arange(0, TILE_M * TILE_N)
    m = (r // TILE_N).to(tl.int64)
    n = (tl.program_id(0) * TILE_N + r % TILE_N).to(tl.int64)
    k_base = tl.arange(0, TILE_K).to(tl.int64)
    in_m = m < M
    in_n = n < N
    w_rows = w_ptr + n[:, None] * stride_wn
    x_rows = x_ptr + m[:, None] * stride_xm
    # Products summed elementwise across the loop and reduced over K once at the end: the loop body is loads and
    # multiply-adds only (a reduction per piece would cost each iteration a cross-warp exchange and a barrier).
    partial = tl.zeros((TILE_M * TILE_N, TILE_K), dtype=tl.float32)
    for k0 in range(0, K, TILE_K):
        k = k0 + k_base
        in_k = (k < K)[None, :]
        w = tl.load(w_rows + k[None, :] * stride_wk, mask=in_n[:, None] & in_k, other=0.0)
        x = tl.load(x_rows + k[None, :] * stride_xk, mask=in_m[:, None] & in_k, other=0.0)
        partial += x.to(tl.float32) * w.to(tl.float32)
    acc = tl.sum(partial, axis=1)  # [TILE_M * TILE_N]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n * stride_b, mask=in_n, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + n * stride_on, acc.to(out_ptr.dtype.element_ty), mask=in_m & in_n)


@attrs.frozen(kw_only=True)
class SmallMatmulConfig:
    """One launch configuration of :func:`small_matmul`: weight rows per program (``tile_n``), the ``K`` piece
    read per iteration (``tile_k``), warps per program, and Triton's software-pipelining depth (passed on; Triton 3.9
    pipelines none of this loop's loads for sm_90, so today it changes nothing)."""

    tile_n: int
    tile_k: int
    num_warps: int = 4
    num_stages: int = 3

    def __attrs_post_init__(self) -> None:
        problems = [Problem(field=name, value=getattr(self, name), limit=f"must be a power of two in {low}..{high}",
                            fix=f"pass a power of two between {low} and {high}")
                    for name, low, high in (("tile_n", 1, 256), ("tile_k", 16, 4096), ("num_warps", 1, 16))
                    if not _power_of_two_in(getattr(self, name), low, high)]
        if isinstance(self.num_stages, bool) or not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            problems.append(Problem(field="num_stages", value=self.num_stages, limit="must be an int in 1..8",
                                    fix="pass 2-4 (Triton's software-pipelining depth)"))
        if problems:
            raise SpecError(*problems)

    def sums_per_thread(self, num_rows: int) -> int:
        """Float32 partial sums a thread keeps for ``num_rows`` rows: ``TILE_M * tile_n * tile_k / (32 * num_warps)``,
        ``TILE_M`` the rows rounded up to a power of two (at most :data:`MAX_SUMS_PER_THREAD` fit)."""
        return triton.next_power_of_2(max(num_rows, 1)) * self.tile_n * self.tile_k // (32 * self.num_warps)


def _power_of_two_in(value: object, low: int, high: int) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
            and value & (value - 1) == 0)


def small_matmul_config(num_rows: int, out_features: int, in_features: int, *,
                        num_sms: int = DEFAULT_NUM_SMS) -> SmallMatmulConfig:
    """The default launch of a ``[num_rows, in_features] x [out_features, in_features]^T`` product: the most weight
    rows per program (up to 16) that still give every SM at least four programs, and a ``K`` piece that keeps
    ``TILE_M * TILE_N * TILE_K`` at 4,096 float32 partial sums per program (at most 1,024, at least 16)."""
    tile_m = triton.next_power_of_2(max(num_rows, 1))
    tile_n = 16
    while tile_n > 1 and triton.cdiv(out_features, tile_n) < 4 * num_sms:
        tile_n //= 2
    tile_k = _PRODUCT_FLOATS // (tile_m * tile_n)
    tile_k = max(16, min(1024, tile_k, triton.next_power_of_2(max(in_features, 16))))
    return SmallMatmulConfig(tile_n=tile_n, tile_k=tile_k)


def check_small_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       out: torch.Tensor | None) -> list[Problem]:
    """Every problem with :func:`small_matmul`'s arguments (shapes, dtypes, devices), none with values."""
    problems = []
    if weight.dim() != 2 or weight.dtype not in SMALL_MATMUL_DTYPES:
        problems.append(Problem(field="weight", value=(tuple(weight.shape), str(weight.dtype)),
                                limit="must be [out_features, in_features] float16, bfloat16 or float32",
                                fix="pass the linear layer's weight"))
        return problems
    out_features, in_features = weight.shape
    if x.dim() != 2 or x.shape[1] != in_features or x.shape[0] > MAX_SMALL_MATMUL_ROWS:
        problems.append(Problem(field="x", value=tuple(x.shape),
                                limit=f"must be [num_rows <= {MAX_SMALL_MATMUL_ROWS}, {in_features}]",
                                fix="flatten the leading dimensions, and run larger batches through torch's matmul"))
    if x.dtype != weight.dtype or x.device != weight.device:
        problems.append(Problem(field="x.dtype", value=(str(x.dtype), str(x.device)),
                                limit=f"must be {weight.dtype} on {weight.device}, as the weight",
                                fix="cast x to the weight's dtype and device"))
    if bias is not None and (tuple(bias.shape) != (out_features,) or bias.device != weight.device
                             or not bias.dtype.is_floating_point):
        problems.append(Problem(field="bias", value=(tuple(bias.shape), str(bias.dtype), str(bias.device)),
                                limit=f"must be [{out_features}] floating point on {weight.device}",
                                fix="pass the linear layer's bias, or None"))
    num_rows = x.shape[0] if x.dim() == 2 else 0
    if out is not None and (tuple(out.shape) != (num_rows, out_features) or out.device != weight.device
                            or not out.dtype.is_floating_point):
        problems.append(Problem(field="out", value=(tuple(out.shape), str(out.dtype), str(out.device)),
                                limit=f"must be ({num_rows}, {out_features}) floating point on {weight.device}",
                                fix="allocate out as x.new_empty(x.shape[0], weight.shape[0])"))
    return problems


def small_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 out: torch.Tensor | None = None, config: SmallMatmulConfig | None = None,
                 num_sms: int = DEFAULT_NUM_SMS) -> torch.Tensor:
    """``x @ weight.T + bias`` (``torch.nn.functional.linear``) for ``x`` of at most
    :data:`MAX_SMALL_MATMUL_ROWS` rows, accumulated in float32, as one Triton launch of
    ``ceil(out_features / tile_n)`` programs. ``x`` ``[M, K]`` and ``weight`` ``[N, K]`` may have any strides (a
    merged projection's rows, a slice of a fused tensor); ``out`` ``[M, N]`` is allocated as ``x``'s dtype unless
    given. ``config`` overrides :func:`small_matmul_config` of the shapes and ``num_sms``. Raises
    :class:`~graphkv.errors.SpecError` naming every bad argument. CPU tensors run in Triton's interpreter.

    Example::

        y = small_matmul(hidden[:4], model.lm_head.weight)  # [4, vocab], hidden: [>= 4, hidden_size]
    """
    problems = check_small_matmul(x, weight, bias, out)
    if problems:
        raise SpecError(*problems)
    num_rows, in_features = x.shape
    out_features = weight.shape[0]
    if out is None:
        out = x.new_empty(num_rows, out_features)
    if num_rows == 0 or out_features == 0:
        return out
    if in_features == 0:
        return out.copy_(bias.expand_as(out)) if bias is not None else out.zero_()
    config = config or small_matmul_config(num_rows, out_features, in_features, num_sms=num_sms)
    tile_m = triton.next_power_of_2(num_rows)
    per_thread = config.sums_per_thread(num_rows)
    if per_thread > MAX_SUMS_PER_THREAD:
        raise SpecError(Problem(field="config", value=f"tile_n={config.tile_n}, tile_k={config.tile_k}, "
                                                      f"num_warps={config.num_warps} at {num_rows} rows",
                                limit=f"{per_thread} partial sums a thread; at most {MAX_SUMS_PER_THREAD} "
                                      f"(rows rounded up to {tile_m} x tile_n x tile_k / (32 x num_warps))",
                                fix="pass a smaller tile_n or tile_k, more warps, or config=None for the default"))
    _small_matmul_kernel[(triton.cdiv(out_features, config.tile_n),)](
        x, weight, weight if bias is None else bias, out, num_rows, out_features, in_features,
        *x.stride(), *weight.stride(), 0 if bias is None else bias.stride(0), *out.stride(),
        HAS_BIAS=bias is not None, TILE_M=tile_m, TILE_N=config.tile_n,
        TILE_K=config.tile_k, num_warps=config.num_warps, num_stages=config.num_stages)
    return out
