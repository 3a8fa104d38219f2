"""Fused pieces: pieces of the same structure share one Inductor compile (``piece_key``), read from the
trace's example values or, where a piece lacks them, by running the traced forward's fake inputs."""

import pytest
import torch

from capture_toys import ATTENTION_OP
from graphkv.runtime.capture.fuse import traced_args, compile_pieces, piece_key
from graphkv.runtime.capture.piecewise import piecewise_backend, split_at_attention


class LayeredToy(torch.nn.Module):
    """An embedding, then ``layers`` x (linear -> relu -> attention), then a head: the pieces between two
    attention ops have the same structure and differ only in their linear's weights (a model's middle
    layers). ``odd_layer``: the layer that adds 0.5 where the others add 0.25 (a piece of another structure)."""

    def __init__(self, layers: int = 4, hidden: int = 16, odd_layer: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(32, hidden)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, 8)
        self.odd_layer = odd_layer

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            h = layer(h).relu() + (0.5 if i == self.odd_layer else 0.25)
            h = torch.ops.graphkv_test.attention(h, h, h)
        return self.head(h)


def _traced_split(model: torch.nn.Module, num_tokens: int = 5):
    """``model``'s forward as Dynamo traces it (weights lifted to inputs, as under torch.compile), split at the
    toy attention op; with each graph piece's traced example arguments."""
    backend = piecewise_backend([ATTENTION_OP])
    ids = torch.arange(num_tokens)
    torch._dynamo.mark_dynamic(ids, 0)
    with torch.no_grad():
        torch.compile(model, backend=backend)(ids)
    (split,) = backend.splits
    return split, [traced_args(p.module) for p in split.graph_pieces]


def test_middle_pieces_have_one_key_and_first_and_last_their_own():
    """4 layers: 5 graph pieces; the 3 between attention ops share a key (names and weights differ, nothing
    else), the first (embedding) and the last (head) have keys of their own."""
    split, args = _traced_split(LayeredToy(layers=4))
    keys = [piece_key(p.module, a) for p, a in zip(split.graph_pieces, args)]
    assert len(keys) == 5
    assert keys[1] == keys[2] == keys[3]
    assert len({keys[0], keys[1], keys[4]}) == 3


def test_a_constant_a_shape_a_dtype_or_strides_make_another_key():
    """A piece that adds 0.5 where the others add 0.25 is another function; so is the same piece on an argument
    of another shape, dtype or strides, or with two arguments sharing storage. The values of the arguments do not
    matter."""
    split, args = _traced_split(LayeredToy(layers=4, odd_layer=2))
    pieces = [p.module for p in split.graph_pieces]
    keys = [piece_key(m, a) for m, a in zip(pieces, args)]
    assert keys[1] == keys[3] != keys[2]  # layer 2 (its add of 0.5) runs in the piece after the second attention
    middle = pieces[1]
    names = [n.name for n in middle.graph.nodes if n.op == "placeholder"]
    assert len(names) == 4, names  # the attention output, its token count, the layer's weight and bias

    def key(hidden: torch.Tensor, num_tokens: int = 5) -> tuple:
        return piece_key(middle, [hidden, num_tokens, torch.randn(16, 16), torch.randn(16)])

    base = key(torch.randn(5, 16))
    assert key(torch.randn(5, 16)) == base
    assert key(torch.randn(5, 16), num_tokens=6) != base
    assert key(torch.randn(6, 16)) != base
    assert key(torch.randn(5, 16, dtype=torch.float64)) != base
    assert key(torch.randn(16, 5).t()) != base
    assert key(torch.randn(5, 17)[:, :16]) != base  # same shape, other strides
    weight = torch.randn(16, 16)
    separate = piece_key(middle, [torch.randn(5, 16), 5, weight, torch.randn(16)])
    aliased = piece_key(middle, [torch.randn(5, 16), 5, weight, weight[0]])  # the bias a view of the weight
    assert separate == base and aliased != base


def test_a_piece_holding_its_weights_shares_with_no_other():
    """Traced by torch.fx (not Dynamo), a piece calls its layer as a submodule: the weights are not arguments,
    so no two pieces may share compiled code, whatever their structure."""
    split = split_at_attention(torch.fx.symbolic_trace(LayeredToy(layers=4)), [ATTENTION_OP])
    hidden = [torch.randn(5, 16)]
    keys = [piece_key(p.module, hidden) for p in split.graph_pieces[1:4]]
    assert len(set(keys)) == 3


@pytest.mark.slow
@pytest.mark.parametrize("traced", [True, False], ids=["example-values", "fake-run"])
def test_fused_toy_compiles_each_distinct_piece_once_and_matches_eager(traced, monkeypatch):
    """torch.compile with a fusing backend: 4 layers give 5 fused pieces from 3 Inductor compiles, and the
    compiled forward gives the eager result for several step sizes. ``fake-run``: the pieces' placeholders
    carry no example values, so the traced forward's fake inputs run through the split to find them (same
    compiles, same result)."""
    if not traced:
        import graphkv.runtime.capture.fuse as fuse

        monkeypatch.setattr(fuse, "traced_args", lambda module: None)
    model = LayeredToy(layers=4).eval()
    backend = piecewise_backend([ATTENTION_OP], fuse=True)
    fn = torch.compile(model, backend=backend)
    with torch.no_grad():
        for n in (3, 9, 17):
            ids = torch.randint(0, 32, (n,), generator=torch.Generator().manual_seed(n))
            torch._dynamo.mark_dynamic(ids, 0)  # one trace for every size, as graphkv.hf marks a step's tokens
            torch.testing.assert_close(fn(ids), model(ids), rtol=1e-5, atol=1e-6)
    assert len(backend.splits) == 1
    assert backend.num_fused == 5 and backend.num_compiles == 3
    runners = backend.runners
    # the middle pieces run one compiled callable; the first and last their own
    callables = [r.piece.fn for r in runners]
    assert callables[1] is callables[2] is callables[3]
    assert len({id(c) for c in callables}) == 3


def test_compile_pieces_refuses_a_forward_dynamo_did_not_trace():
    """A split of a forward traced by torch.fx carries no fake example values: compile_pieces is refused, naming
    compile='piecewise' as the way out."""
    from graphkv.errors import CaptureError

    gm = torch.fx.symbolic_trace(LayeredToy(layers=2))
    with pytest.raises(CaptureError, match="compile='piecewise'"):
        compile_pieces(split_at_attention(gm, [ATTENTION_OP]), gm)


class ScaledToy(torch.nn.Module):
    """``layers`` x (linear -> times ``scale`` plus ``eps`` -> attention): float attributes, which
    ``torch.compile(dynamic=True)`` passes as inputs read with ``.item()``, used in every layer's piece."""

    def __init__(self, layers: int = 3, hidden: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(layers))
        self.scale = 0.5
        self.eps = 1e-3

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = torch.ops.graphkv_test.attention(*(3 * [layer(h) * self.scale + self.eps]))
        return h


@pytest.mark.slow
def test_fused_dynamic_true_specialises_float_attributes_and_matches_eager():
    """``dynamic=True`` made the float attributes symbolic inputs whose ``.item()`` crosses from the first piece
    into the others: Inductor refused the piece and Dynamo fell back to eager (0 compiles). Now the forward is
    traced again with the floats as constants: one compile for the 3 equal pieces, eager's values at every size,
    and a changed float is a recompile (its value guarded), not a stale constant."""
    torch._dynamo.reset()
    model = ScaledToy().eval()
    backend = piecewise_backend([ATTENTION_OP], fuse=True)
    fn = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for n in (5, 7):
            x = torch.randn(n, 16, generator=torch.Generator().manual_seed(n))
            torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-6)
        assert (len(backend.splits), backend.num_fused, backend.num_compiles) == (1, 3, 1)
        model.scale = 0.25
        torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-6)
    assert (len(backend.splits), backend.num_compiles) == (2, 2)
    torch._dynamo.reset()


def test_specialize_float_inputs_leaves_a_forward_without_float_inputs_alone():
    """A traced forward with no float inputs (``split``'s placeholders: the token ids and weights) is not
    re-traced."""
    split, _ = _traced_split(LayeredToy(layers=2))
    from graphkv.runtime.capture.fuse import specialize_float_inputs

    assert specialize_float_inputs(split.module) is None


def test_specialize_float_inputs_refuses_a_float_dynamo_kept_after_being_asked():
    """A float input still symbolic after Dynamo was asked to specialise it (it is also used as a tensor) would
    restart the trace forever: refused, naming the symbol and ``dynamic=True``'s alternative."""
    from torch._dynamo.symbolic_convert import TensorifyState

    from graphkv.errors import CaptureError
    from graphkv.runtime.capture.fuse import specialize_float_inputs

    gm = torch.fx.symbolic_trace(ScaledToy(layers=1))
    shape_env = torch.fx.experimental.symbolic_shapes.ShapeEnv()
    with torch._subclasses.FakeTensorMode(shape_env=shape_env) as mode:
        scalar = mode.from_tensor(torch.tensor(0.5, dtype=torch.float64))
    scalar.item_memo = shape_env.create_unbacked_symfloat()
    (placeholder,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    placeholder.meta["example_value"] = scalar
    symbol = scalar.item_memo.node._expr.name
    try:
        TensorifyState.specialize(symbol)
        with pytest.raises(CaptureError, match=f"float input.*{symbol}.*mark_dynamic"):
            specialize_float_inputs(gm)
    finally:
        TensorifyState.clear()
