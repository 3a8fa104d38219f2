"""PIECEWISE: splitting a forward's FX graph at attention custom ops, and the piecewise compile backend."""

import pytest
import torch

from capture_toys import ATTENTION_OP, GraphEmulator, InPlaceToyModel, ToyModel, make_plan
from graphkv import CudaGraphMode
from graphkv.runtime.capture.piecewise import (SPLITTING_OPS, PiecewiseRunner, op_name, piecewise_backend, piecewise_capture,
                                       split_at_attention)


@pytest.fixture(scope="module")
def compiled():
    """The toy model, its piecewise backend and the one torch.compile of this test directory."""
    model = ToyModel().eval()
    backend = piecewise_backend([ATTENTION_OP])
    return model, backend, torch.compile(model, backend=backend)


def toy_inputs(num_tokens: int = 7):
    """Token ids and positions for the toy model."""
    g = torch.Generator().manual_seed(num_tokens)
    return torch.randint(0, 32, (num_tokens,), generator=g), torch.arange(num_tokens)


def test_op_name_normalizes_strings_and_op_objects():
    """'ns::op', 'ns.op', an op packet and its overload all name the same op."""
    assert op_name(ATTENTION_OP) == ATTENTION_OP
    assert op_name("graphkv_test.attention") == ATTENTION_OP
    assert op_name(torch.ops.graphkv_test.attention) == ATTENTION_OP
    assert op_name(torch.ops.graphkv_test.attention.default) == ATTENTION_OP
    assert op_name(torch.relu) is None
    assert SPLITTING_OPS == ("graphkv::attention",)


def test_two_attention_ops_split_into_five_pieces():
    """Linear layers around 2 attention ops split into 3 graph pieces and 2 attention pieces, in call order."""
    gm = torch.fx.symbolic_trace(ToyModel())
    split = split_at_attention(gm, [ATTENTION_OP])
    assert len(split.pieces) == 5
    assert [p.splitting_op for p in split.pieces] == [None, ATTENTION_OP, None, ATTENTION_OP, None]
    assert [p.index for p in split.graph_pieces] == [0, 2, 4]
    assert len(split.splitting_pieces) == 2
    for piece in split.splitting_pieces:  # an attention piece holds the op and nothing else
        calls = [n for n in piece.module.graph.nodes if n.op not in ("placeholder", "output")]
        assert [op_name(n.target) for n in calls] == [ATTENTION_OP]


def test_split_module_equals_the_unsplit_module_exactly():
    """The split module's output is bitwise equal to the unsplit graph's output."""
    gm = torch.fx.symbolic_trace(ToyModel())
    split = split_at_attention(gm, [torch.ops.graphkv_test.attention])
    for n in (1, 7, 33):
        ids, pos = toy_inputs(n)
        assert torch.equal(split.module(ids, pos), gm(ids, pos))


def test_in_place_attention_splits_and_matches():
    """Attention ops that write into a buffer from the previous piece split the same way and match exactly."""
    gm = torch.fx.symbolic_trace(InPlaceToyModel())
    split = split_at_attention(gm, ["graphkv_test::attention_into"])
    assert [p.splitting_op for p in split.pieces] == [None, "graphkv_test::attention_into", None,
                                                      "graphkv_test::attention_into", None]
    ids, pos = toy_inputs(11)
    assert torch.equal(split.module(ids, pos), gm(ids, pos))


def test_no_splitting_op_leaves_one_graph_piece():
    """A graph without splitting ops stays one graph piece."""
    gm = torch.fx.symbolic_trace(ToyModel())
    split = split_at_attention(gm, ["graphkv::something_else"])
    assert len(split.pieces) == len(split.graph_pieces) == 1
    ids, pos = toy_inputs()
    assert torch.equal(split.module(ids, pos), gm(ids, pos))


def test_piecewise_backend_compiles_to_the_eager_result(compiled):
    """torch.compile with the piecewise backend splits the dynamo graph into 5 pieces and matches eager exactly."""
    model, backend, fn = compiled
    ids, pos = toy_inputs(9)
    with torch.no_grad():
        expected = model(ids, pos)
        with piecewise_capture():  # on CPU a capture block changes nothing: runners run eagerly
            assert torch.equal(fn(ids, pos), expected)
        assert torch.equal(fn(ids, pos), expected)
    assert backend.splits and all(len(split.pieces) == 5 for split in backend.splits)
    assert len(backend.runners) == 3 * len(backend.splits)
    assert all(isinstance(r, PiecewiseRunner) for r in backend.runners)


def test_a_scope_on_a_stream_primes_the_workspaces_once_before_its_first_piece(compiled, monkeypatch):
    """A piecewise_capture block on a stream puts the stream's cuBLAS workspaces in the pool before its first piece's
    warm-up (that piece may run no matmul while the eager ops between pieces do) and keeps the priming graph with
    that piece; no piece releases them. A block told they are there primes nothing; on torch's own capture stream
    (no stream given) every capture releases them first, as torch.cuda.graph's captures did."""
    emulator = GraphEmulator().install(monkeypatch)
    model, backend, fn = compiled
    with torch.no_grad():
        with piecewise_capture(("pool",), stream="s") as scope:
            fn(*toy_inputs(13))
        assert emulator.primes == [(("pool",), "s")] and emulator.releases == [False] * 3
        assert scope.workspaces_in_pool and scope.priming == ("priming", 1) and scope.num_captured == 3
        kept = [g.keep for r in backend.runners for g in r._graphs.values() if g.keep is not None]
        assert kept == [("priming", 1)]
        with piecewise_capture(("pool",), stream="s", workspaces_in_pool=True) as told:
            fn(*toy_inputs(14))
        assert len(emulator.primes) == 1 and emulator.releases == [False] * 6 and told.priming is None
        with piecewise_capture(("pool",)):
            fn(*toy_inputs(15))
        assert len(emulator.primes) == 1 and emulator.releases == [False] * 6 + [True] * 3


def serve_and_compare(fwd, model, emulator, steps):
    """Run steps with fresh inputs; return replays per step; each output must equal eager."""
    g = torch.Generator().manual_seed(1)
    replays = []
    for n, r, uniform in steps:
        ids, pos = torch.randint(0, 32, (n,), generator=g), torch.randint(0, 99, (n,), generator=g)
        before = emulator.replays
        out = fwd(num_tokens=n, num_reqs=r, uniform=uniform, input_ids=ids, positions=pos)
        replays.append(emulator.replays - before)
        with torch.no_grad():
            torch.testing.assert_close(out, model(ids, pos), rtol=1e-5, atol=1e-6)
    return replays


def test_piecewise_capture_flow_with_emulated_graphs(compiled, monkeypatch):
    """PIECEWISE with emulated graphs: 3 graph pieces captured per mixed size, each step replays 3, equal to eager."""
    emulator = GraphEmulator().install(monkeypatch)
    model, backend, fn = compiled
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=32, cudagraph_mode="PIECEWISE")
    static = {"input_ids": torch.zeros(32, dtype=torch.int64), "positions": torch.zeros(32, dtype=torch.int64)}
    fwd = emulator.capture(plan, fn, static_inputs=static)
    report = fwd.capture(progress=False)
    assert report.skipped == () and len(report.keys) == 7  # mixed 32, 24, 16, 8, 4, 2, 1
    assert emulator.captures == 3 * 7 and emulator.pools == {("pool",)}
    # every piece captured on the capture stream, with the forward running on it (not on the serving stream)
    assert emulator.capture_streams == [(fwd.stream, fwd.stream)] * 21 and fwd.stream is not None
    # the stream's cuBLAS workspaces are primed into the pool once, before the first capture; no piece releases them
    assert emulator.primes == [(("pool",), fwd.stream)] and emulator.releases == [False] * 21
    assert report.num_piece_graphs == 21
    steps = [(1, 1, True), (3, 3, True), (5, 2, False), (17, 3, False), (32, 4, False), (9, 4, False)]
    assert serve_and_compare(fwd, model, emulator, steps) == [3] * len(steps)


def test_full_and_piecewise_with_emulated_graphs(compiled, monkeypatch):
    """FULL_AND_PIECEWISE: decode steps replay one FULL graph (pieces run inside it), mixed steps replay 3 pieces."""
    emulator = GraphEmulator().install(monkeypatch)
    model, backend, fn = compiled
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=16)
    assert plan.cudagraph.mode is CudaGraphMode.FULL_AND_PIECEWISE
    static = {"input_ids": torch.zeros(16, dtype=torch.int64), "positions": torch.zeros(16, dtype=torch.int64)}
    fwd = emulator.capture(plan, fn, static_inputs=static)
    report = fwd.capture(progress=False)
    assert [str(k) for k in report.keys[:3]] == ["mixed(num_tokens=16)", "mixed(num_tokens=8)",
                                                 "decode(num_tokens=4, num_reqs=4)"]
    assert len(report.keys) == 3 + 5 and report.skipped == ()
    assert len(emulator.primes) == 1 and not any(emulator.releases)  # primed once; FULL keys and pieces reuse them
    steps = [(1, 1, True), (3, 3, True), (3, 1, False), (11, 3, False), (4, 4, True)]
    assert serve_and_compare(fwd, model, emulator, steps) == [1, 1, 3, 3, 1]


def test_piecewise_backend_wraps_graph_pieces_with_capture_fn():
    """A custom capture_fn wraps exactly the graph pieces; attention pieces stay unwrapped."""
    gm = torch.fx.symbolic_trace(ToyModel())
    seen = []

    def capture_fn(piece, index):
        seen.append(index)
        return piece

    backend = piecewise_backend([ATTENTION_OP], capture_fn=capture_fn)
    fn = backend(gm, [])
    ids, pos = toy_inputs()
    assert seen == [0, 2, 4]
    assert torch.equal(fn(ids, pos), gm(ids, pos))
