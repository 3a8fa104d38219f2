"""dedupe_linears: a matmul repeated with the same arguments is kept once, never across a write into a tensor."""

import torch

import capture_toys  # noqa: F401 - registers graphkv_test::attention_into
from graphkv.runtime.capture.dedupe import dedupe_linears


def _calls(gm: torch.fx.GraphModule, target) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


class Group(torch.nn.Module):
    """q, k and v as one weight: each 'projection' is the whole matmul, then its columns (merged projections)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(12, 8))
        self.other = torch.nn.Parameter(torch.randn(12, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linear = torch.nn.functional.linear
        q, k, v = linear(x, self.w)[..., :4], linear(x, self.w)[..., 4:8], linear(x, self.w)[..., 8:]
        o = linear(x, self.other)[..., :4]  # another weight: kept
        return q * k + v - o


def test_three_calls_of_one_matmul_become_one_and_compute_the_same():
    """linear(x, w) three times and linear(x, other) once: 2 removed, 2 left, same output exactly."""
    gm = torch.fx.symbolic_trace(Group())
    x = torch.randn(5, 8)
    expected = gm(x)
    assert _calls(gm, torch.nn.functional.linear) == 4
    assert dedupe_linears(gm) == 2
    assert _calls(gm, torch.nn.functional.linear) == 2
    assert torch.equal(gm(x), expected)
    assert dedupe_linears(gm) == 0  # nothing left to merge


class Written(torch.nn.Module):
    """The same matmul before and after an in-place write into its input: two different values."""

    def __init__(self, write: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 4))
        self.write = write

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.nn.functional.linear(x, self.w)
        if self.write == "method":
            x.add_(1.0)
        else:  # a custom op that writes its ``out`` argument
            torch.ops.graphkv_test.attention_into(a, a, a, x)
        b = torch.nn.functional.linear(x, self.w)
        return a + b


def test_a_write_between_two_calls_keeps_both():
    """x.add_(1), or a custom op writing into x, between two linear(x, w): both calls stay, the output is the
    traced one's."""
    for write in ("method", "op"):
        gm = torch.fx.symbolic_trace(Written(write))
        expected = gm(torch.ones(3, 4))
        assert dedupe_linears(gm) == 0, write
        assert _calls(gm, torch.nn.functional.linear) == 2
        assert torch.equal(gm(torch.ones(3, 4)), expected)


class Autocast(torch.nn.Module):
    """The same matmul outside and inside an autocast region: float32, then bfloat16."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.nn.functional.linear(x, self.w)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b = torch.nn.functional.linear(x, self.w)
        return a, b


def test_a_matmul_under_autocast_is_not_merged_with_one_outside():
    """Traced by Dynamo, linear(x, w) before and inside torch.autocast(bfloat16) are two calls: the backend's
    dedupe keeps both, and the compiled forward returns float32 and bfloat16 as eager does."""
    removed = []

    def backend(gm, example_inputs):
        removed.append(dedupe_linears(gm))
        return gm

    model = Autocast()
    x = torch.randn(3, 4)
    with torch.no_grad():
        a, b = torch.compile(model, backend=backend, fullgraph=True)(x)
    assert removed == [0]
    assert (a.dtype, b.dtype) == (torch.float32, torch.bfloat16)
