"""Graph outputs shared by every key of a pool (weak views) and the staging arena PIECEWISE pieces read eager
outputs from."""

import collections
import contextlib

import pytest
import torch

from capture_toys import ATTENTION_OP, GraphEmulator, ToyModel, make_plan
from graphkv import CaptureError
from graphkv.runtime.capture.graphs import capture
from graphkv.runtime.capture.piecewise import piecewise_backend, split_at_attention
from graphkv.runtime.capture.staging import STAGING_ALIGN_BYTES, StagingArena
from graphkv.runtime.capture.weak import tree_map, weak_outputs, weak_view


def uses(t: torch.Tensor) -> int:
    """Owners of ``t``'s storage (the caching allocator frees it at 0)."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def test_weak_view_reads_the_same_memory_without_owning_it():
    """Same address, dtype, shape, strides and offset; writes through either side show in the other; no owner added."""
    base = torch.arange(30, dtype=torch.float32)
    t = base[3:27].view(4, 6)[:, 1:5]  # offset 4, strides (6, 1)
    owners = uses(base)
    w = weak_view(t)
    assert uses(base) == owners
    assert (w.data_ptr(), w.dtype, w.shape, w.stride(), w.storage_offset()) == \
        (t.data_ptr(), torch.float32, (4, 4), (6, 1), 4)
    assert torch.equal(w, t)
    t.fill_(-1.0)
    assert torch.equal(w, torch.full((4, 4), -1.0))
    w[0, 0] = 7.0
    assert base[4].item() == 7.0
    del t
    assert uses(base) == owners - 1  # only base owns the memory now, though the view still reads it
    assert w[0, 0].item() == 7.0


def test_weak_outputs_keep_the_nesting_and_leave_non_cuda_tensors_owned():
    """Tuples, lists and dicts keep their shape; non-tensors pass through; a CPU tensor is returned itself (no pool
    holds its memory: a weak view of an output that is its only owner would dangle)."""
    a, b = torch.zeros(3), torch.ones(2, 2)
    out = weak_outputs({"logits": a, "rest": (b, [a], 5)})
    assert out["rest"][2] == 5 and isinstance(out["rest"][1], list)
    assert out["logits"] is a and out["rest"][0] is b and out["rest"][1][0] is a
    assert tree_map(lambda t: t.numel(), (a, {"x": b})) == (3, {"x": 4})


def test_staging_views_of_one_call_are_aligned_disjoint_copies():
    """Each view starts on a 256-byte boundary after the previous one, holds its tensor's values and strides."""
    arena = StagingArena()
    x = torch.arange(10, dtype=torch.float32).view(2, 5)
    y = torch.arange(12, dtype=torch.float32).view(3, 4).t()  # strides (1, 4)
    z = torch.arange(3, dtype=torch.int64)
    vx, vy, vz = arena.stage([x, y, z])
    assert torch.equal(vx, x) and torch.equal(vy, y) and torch.equal(vz, z)
    assert vy.stride() == (1, 4) and vx.stride() == (5, 1)
    align = STAGING_ALIGN_BYTES // 4
    assert (vx.storage_offset(), vy.storage_offset(), vz.storage_offset()) == (0, align, 0)  # int64: its own buffer
    assert vx.untyped_storage().data_ptr() == vy.untyped_storage().data_ptr() != vz.untyped_storage().data_ptr()
    assert arena.nbytes == (align + 12) * 4 + 3 * 8


def test_staging_calls_share_the_buffer_and_grow_it_only_when_larger():
    """A second, smaller call reuses the first call's memory; a larger one gets a new buffer (old views stay valid)."""
    arena = StagingArena()
    (first,) = arena.stage([torch.ones(64)])
    (second,) = arena.stage([torch.full((16,), 2.0)])
    assert second.data_ptr() == first.data_ptr() and arena.nbytes == 64 * 4
    assert torch.equal(first[:16], torch.full((16,), 2.0))  # shared: the later call overwrote the start
    (bigger,) = arena.stage([torch.full((100,), 3.0)])
    assert arena.nbytes == 100 * 4 and bigger.data_ptr() != first.data_ptr()
    assert torch.equal(first[16:], torch.ones(48))  # the old buffer lives on while a view holds it


def test_eager_args_are_the_positions_fed_by_splitting_pieces():
    """ToyModel's pieces after each attention op read the op's output; the first piece reads only model inputs."""
    gm = torch.fx.symbolic_trace(ToyModel())
    split = split_at_attention(gm, [ATTENTION_OP])
    first, middle, last = split.graph_pieces
    assert split.eager_args(first) == frozenset()
    attention = [p.name for p in split.splitting_pieces]
    for piece, op in zip((middle, last), attention):
        call = next(n for n in split.module.graph.nodes if n.target == piece.name)
        (position,) = split.eager_args(piece)
        assert call.args[position].target == op  # the attention op right before it
        assert all(a.target != op for i, a in enumerate(call.args) if i != position)


def test_piecewise_pieces_of_every_key_stage_into_one_region(monkeypatch):
    """Emulated PIECEWISE capture of 7 keys: every piece after an attention op reads its staged input at the same
    address (one arena as large as the largest key's input), and replays still equal eager."""
    emulator = GraphEmulator().install(monkeypatch)
    model = ToyModel().eval()
    backend = piecewise_backend([ATTENTION_OP])
    fn = torch.compile(model, backend=backend)
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=32, cudagraph_mode="PIECEWISE")
    static = {"input_ids": torch.zeros(32, dtype=torch.int64), "positions": torch.zeros(32, dtype=torch.int64)}
    fwd = emulator.capture(plan, fn, static_inputs=static)
    fwd.capture(progress=False)
    staged = [graph.static_args[i] for runner in backend.runners for graph in runner._graphs.values()
              for i in runner.staged_args]
    assert len(staged) == 2 * 7  # two pieces after attention, 7 keys
    assert {t.data_ptr() for t in staged} == {staged[0].data_ptr()}
    assert fwd._staging.nbytes == 32 * 16 * 4  # the 32-token key's [32, 16] float32 attention output
    g = torch.Generator().manual_seed(3)
    for n in (1, 5, 17, 32, 9):
        ids, pos = torch.randint(0, 32, (n,), generator=g), torch.randint(0, 99, (n,), generator=g)
        out = fwd(num_tokens=n, num_reqs=min(n, 4), uniform=False, input_ids=ids, positions=pos)
        with torch.no_grad():
            torch.testing.assert_close(out, model(ids, pos), rtol=1e-5, atol=1e-6)


def test_weak_view_refuses_nothing_it_cannot_view():
    """An empty tensor and a 0-dim tensor have weak views too (graph outputs can be either)."""
    assert weak_view(torch.empty(0)).shape == (0,)
    s = torch.tensor(2.5)
    assert weak_view(s).item() == pytest.approx(2.5)


def record_graph_calls(monkeypatch) -> list:
    """Patch torch.cuda's CUDAGraph (capture_begin / capture_end) and stream() to append what is called to the list
    returned, on a CPU."""
    calls: list = []

    class Graph:
        def capture_begin(self, pool=None):
            calls.append(("begin", pool))

        def capture_end(self):
            calls.append(("end",))

    @contextlib.contextmanager
    def on(stream):
        calls.append(("stream", stream))
        try:
            yield
        finally:
            calls.append(("stream done",))

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "stream", on)
    return calls


def test_a_capture_releases_the_cached_blas_workspaces_unless_told_they_are_in_the_pool(monkeypatch):
    """capture_graph synchronizes and frees PyTorch's cached cuBLAS workspaces before it begins the capture, so the
    capture's matmuls take their workspace from the graph's pool (a workspace outside it was released under the
    graphs by torch's cudagraph trees on an H100); with ``release_workspaces=False`` (an earlier capture on the
    stream put them in the pool) it goes straight to the capture. On its own stream it begins and ends the capture
    itself: no empty_cache, no host cache release, no synchronize beyond the release's (torch.cuda.graph does all
    three before every capture, which dominated the set-up of 17-piece keys). Without a stream, torch.cuda.graph."""
    from graphkv.runtime.capture import piecewise

    calls = record_graph_calls(monkeypatch)

    class Capturing:
        def __init__(self, graph, pool=None, stream=None):
            calls.append(("enter", pool, stream))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            calls.append(("exit",))

    monkeypatch.setattr(torch.cuda, "graph", Capturing)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(("synchronize",)))
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append(("clear",)), raising=False)
    graph, outputs = piecewise.capture_graph(lambda: calls.append(("fn",)) or "out", "pool", "stream")
    assert isinstance(graph, torch.cuda.CUDAGraph) and outputs == "out"
    assert calls == [("synchronize",), ("clear",), ("stream", "stream"), ("begin", "pool"), ("fn",), ("end",),
                     ("stream done",)]
    calls.clear()
    piecewise.capture_graph(lambda: calls.append(("fn",)), "pool", "stream", release_workspaces=False)
    assert calls == [("stream", "stream"), ("begin", "pool"), ("fn",), ("end",), ("stream done",)]
    calls.clear()
    piecewise.capture_graph(lambda: calls.append(("fn",)), "pool")
    assert calls == [("synchronize",), ("clear",), ("enter", "pool", None), ("fn",), ("exit",)]
    calls.clear()

    def fails():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):  # the capture is ended whatever the forward did
        piecewise.capture_graph(fails, "pool", "stream", release_workspaces=False)
    assert calls == [("stream", "stream"), ("begin", "pool"), ("end",), ("stream done",)]


def test_priming_captures_matmuls_into_the_pool_on_the_stream_after_a_release(monkeypatch):
    """prime_blas_workspaces releases the cached workspaces, makes its inputs on the stream outside the capture, then
    captures a matmul and a linear with a bias (cuBLASLt's path) in float32 and bfloat16 into the pool on the stream;
    the capture ends even when a matmul raises."""
    from graphkv.runtime.capture import piecewise

    calls = record_graph_calls(monkeypatch)
    real_ones = torch.ones
    monkeypatch.setattr(piecewise, "release_blas_workspaces", lambda: calls.append(("release",)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch, "ones", lambda *shape, dtype, device: calls.append(("ones", dtype, str(device)))
                        or real_ones(*shape, dtype=dtype))
    monkeypatch.setattr(torch, "matmul", lambda a, b: calls.append(("matmul", a.dtype)) or a @ b)
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b: calls.append(("linear", x.dtype)) or x)
    graph = piecewise.prime_blas_workspaces("pool", "stream")
    assert isinstance(graph, torch.cuda.CUDAGraph)
    assert calls == [("release",), ("stream", "stream"), ("ones", torch.float32, "cuda:0"),
                     ("ones", torch.bfloat16, "cuda:0"), ("begin", "pool"), ("matmul", torch.float32),
                     ("linear", torch.float32), ("matmul", torch.bfloat16), ("linear", torch.bfloat16), ("end",),
                     ("stream done",)]
    calls.clear()
    monkeypatch.setattr(torch, "matmul", lambda a, b: (_ for _ in ()).throw(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED")))
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_ALLOC_FAILED"):
        piecewise.prime_blas_workspaces("pool", "stream")
    assert calls[-2:] == [("end",), ("stream done",)]


class LogitsOutput(collections.OrderedDict):
    """Stands in for transformers' ModelOutput: an OrderedDict whose items are attributes too (set together)."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        object.__setattr__(self, key, value)


Pair = collections.namedtuple("Pair", "logits hidden")


class Rows(list):
    """A list subclass."""


class TwoArgs(tuple):
    """A tuple subclass whose constructor takes two arguments: graphkv cannot rebuild it."""

    def __new__(cls, a, b):
        return super().__new__(cls, (a, b))


def test_tree_map_keeps_container_types():
    """A namedtuple, a torch.return_types result, a dict subclass (a ModelOutput stand-in, its attributes too) and a
    list subclass come back as their own types with every tensor mapped (a namedtuple raised TypeError, a dict
    subclass came back a plain dict); one that cannot be rebuilt is a CaptureError naming its type."""
    t = torch.arange(4.0)
    pair = tree_map(lambda x: x + 1, Pair(t, [t]))
    assert type(pair) is Pair and pair.logits.tolist() == [1.0, 2.0, 3.0, 4.0] and type(pair.hidden) is list
    top = tree_map(lambda x: x * 2, torch.max(t.view(2, 2), 0))
    assert type(top) is type(torch.max(t.view(2, 2), 0)) and top.values.tolist() == [4.0, 6.0]
    out = tree_map(lambda x: x[:2], LogitsOutput(logits=t, rows=Rows([t])))
    assert type(out) is LogitsOutput and list(out) == ["logits", "rows"] and out.logits.tolist() == [0.0, 1.0]
    assert out["logits"] is out.logits and type(out.rows) is Rows and out.rows[0].shape == (2,)
    with pytest.raises(CaptureError, match=r"^forward output='TwoArgs': a TwoArgs could not be rebuilt around its "
                                           r"cut tensors"):
        tree_map(lambda x: x, TwoArgs(t, t))


def test_replayed_and_eager_steps_return_the_forwards_own_containers():
    """A rehearsed forward returning a ModelOutput-like dict or a namedtuple gives the same type on a replayed step
    (cut to its 3 tokens) as on an eager one; a container it cannot rebuild is refused at capture."""
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=8, cudagraph_mode="FULL")

    def rehearsed(fn):
        fwd = capture(plan, static_inputs={"input_ids": torch.zeros(8, dtype=torch.int64)})(fn)
        fwd.capture(progress=False, rehearse=True)
        return fwd

    for fn, kind, logits in ((lambda input_ids: LogitsOutput(logits=input_ids[:, None] * 1.0), LogitsOutput,
                              [[1.0], [2.0], [3.0]]),
                             (lambda input_ids: Pair(input_ids * 2, input_ids), Pair, [2, 4, 6])):
        fwd = rehearsed(fn)
        replayed = fwd(num_tokens=3, num_reqs=3, uniform=True, input_ids=torch.tensor([1, 2, 3]))
        eager = fwd(num_tokens=10, num_reqs=2, uniform=False, input_ids=torch.arange(10))
        assert type(replayed) is kind and type(eager) is kind and replayed.logits.tolist() == logits
    with pytest.raises(CaptureError, match=r"^forward output='TwoArgs': a TwoArgs could not be rebuilt"):
        rehearsed(lambda input_ids: TwoArgs(input_ids, input_ids))
