"""The capture wrapper on CPU: eager fallback, its statement, logging once per reason, padding and slicing."""

import contextlib
import logging

import pytest
import torch

from capture_toys import GraphEmulator, ToyModel, backend_with, make_plan, with_mode
from graphkv import CaptureError, CudaGraphMode, CudaGraphSupport
from graphkv.runtime.capture.graphs import CPU_UNAVAILABLE, CapturedForward, _Captured, capture
from graphkv.runtime.capture.keys import GraphKey

PLAN = make_plan("flash_attn", max_num_seqs=16, max_num_batched_tokens=64, cudagraph_mode="FULL")
LOGGER = "graphkv.runtime.capture.graphs"
needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback; a GPU is present")


def messages(caplog):
    """Log messages of the capture module."""
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


@needs_cpu_only
def test_decorator_on_a_plain_function_runs_eagerly():
    """@capture(plan) on a plain function returns a CapturedForward that runs it eagerly on CPU."""
    @capture(PLAN)
    def double(x):
        return x * 2

    assert isinstance(double, CapturedForward) and double.__name__ == "double"
    assert double.support is CudaGraphSupport.ALWAYS and double.mode is CudaGraphMode.FULL
    x = torch.arange(5.0)
    assert torch.equal(double(num_tokens=5, num_reqs=5, uniform=True, x=x), x * 2)
    assert double.keys == ()


@needs_cpu_only
def test_capture_on_cpu_states_why_graphs_are_unavailable(caplog):
    """.capture() on CPU does not raise; it returns and logs that CUDA graphs are unavailable and why."""
    fwd = capture(PLAN)(torch.nn.Linear(4, 4).forward)
    assert fwd.unavailable_reason == CPU_UNAVAILABLE
    assert "torch.cuda.is_available() is False" in CPU_UNAVAILABLE and "running eagerly" in CPU_UNAVAILABLE
    with caplog.at_level(logging.INFO, logger=LOGGER):
        report = fwd.capture(progress=False)
        fwd.capture(progress=False)
    assert report.keys == () and report.unavailable_reason == CPU_UNAVAILABLE and str(report) == CPU_UNAVAILABLE
    assert [m for m in messages(caplog) if CPU_UNAVAILABLE in m] == [f"{CPU_UNAVAILABLE} (logged once per reason)"]


@needs_cpu_only
def test_every_cpu_call_is_eager_and_logged_once(caplog):
    """Every call runs the forward eagerly on the caller's tensors; the reason is logged once, not per call."""
    layer = torch.nn.Linear(4, 3)
    fwd = capture(PLAN)(lambda hidden: layer(hidden))
    with caplog.at_level(logging.INFO, logger=LOGGER), torch.no_grad():
        for n in (1, 3, 64, 65, 200):
            h = torch.randn(n, 4)
            assert torch.equal(fwd(num_tokens=n, num_reqs=1, uniform=False, hidden=h), layer(h))
    assert len(messages(caplog)) == 1 and messages(caplog)[0].startswith(CPU_UNAVAILABLE)


def test_out_of_range_steps_fall_back_eagerly_logged_once_per_reason(caplog, monkeypatch):
    """With CUDA reported present, steps above the ladder run eagerly; each distinct reason is logged once."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    calls = []
    fwd = capture(PLAN)(lambda x: calls.append(x.shape[0]) or x + 1)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for n in (65, 70, 100):  # above the largest mixed capture size 64
            assert torch.equal(fwd(num_tokens=n, num_reqs=2, uniform=False, x=torch.zeros(n)), torch.ones(n))
        for r in (17, 18):  # above max_num_seqs
            fwd(num_tokens=40, num_reqs=r, uniform=False, x=torch.zeros(40))
        fwd(num_tokens=3, num_reqs=3, uniform=True, x=torch.zeros(3))  # in range, but nothing captured
        fwd(num_tokens=5, num_reqs=1, uniform=False, x=torch.zeros(5))
    assert calls == [65, 70, 100, 40, 40, 3, 5]  # eager: the caller's sizes, unpadded
    assert messages(caplog) == [
        "running eagerly: num_tokens above the largest mixed capture size 64 (first at num_tokens=65, num_reqs=2, "
        "uniform=False) (logged once per reason)",
        "running eagerly: num_reqs above max_num_seqs=16 (first at num_tokens=40, num_reqs=17, uniform=False) "
        "(logged once per reason)",
        "running eagerly: graphs not captured yet (call .capture() first) (first at num_tokens=3, num_reqs=3, "
        "uniform=True) (logged once per reason)",
    ]


def test_full_capture_refuses_a_never_group():
    """A FULL plan whose group runs on a NEVER backend is refused at capture, naming the group."""
    plan = with_mode(make_plan(backend_with(CudaGraphSupport.NEVER), max_num_seqs=8, max_num_batched_tokens=32),
                     CudaGraphMode.FULL)
    fwd = capture(plan)(lambda x: x)
    with pytest.raises(CaptureError, match=r"group 0 \(layers layers.0, layers.1; backend toy_never\) has cudagraph "
                                           r"support NEVER.*cudagraph_mode='PIECEWISE'"):
        fwd.capture(progress=False)


def test_unknown_inputs_and_options_are_errors():
    """Inputs, pad values or token dims naming no static buffer raise CaptureError naming them."""
    ids = torch.zeros(64, dtype=torch.int64)
    with pytest.raises(CaptureError, match=r"pad_values/token_dims=\['slots'\]"):
        capture(PLAN, static_inputs={"input_ids": ids}, pad_values={"slots": -1})(lambda input_ids: input_ids)
    fwd = capture(PLAN, static_inputs={"input_ids": ids})(lambda input_ids: input_ids)
    with pytest.raises(CaptureError, match=r"inputs=\['positions'\]: have no static buffer"):
        fwd(num_tokens=2, num_reqs=1, uniform=False, input_ids=ids[:2], positions=ids[:2])


class ReplayOnCPU:
    """Stands in for a torch.cuda.CUDAGraph: replay() recomputes the forward into its static outputs."""

    def __init__(self, fn, views):
        self.fn, self.views = fn, views
        self.outputs = fn(**views)
        self.num_replays = 0

    def replay(self):
        self.outputs.copy_(self.fn(**self.views))
        self.num_replays += 1


def emulated(monkeypatch, copy_outputs=False):
    """A CapturedForward with one FULL key of 16 tokens whose 'graph' replays on CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    static = {"input_ids": torch.full((64,), 7), "slot_mapping": torch.full((2, 64), 7)}

    def forward(input_ids, slot_mapping):
        return torch.stack([input_ids, slot_mapping[0], slot_mapping[1]], dim=1) * 10

    fwd = capture(PLAN, static_inputs=static, token_dims={"slot_mapping": 1}, copy_outputs=copy_outputs)(forward)
    key = GraphKey(num_tokens=16, num_reqs=None, uniform=False)
    views = {"input_ids": static["input_ids"][:16], "slot_mapping": static["slot_mapping"][:, :16]}
    graph = ReplayOnCPU(forward, views)
    fwd._graphs[key] = _Captured(graph=graph, outputs=graph.outputs)
    return fwd, static, graph


def test_replay_copies_pads_and_slices(monkeypatch):
    """A 10-token step is copied into the static rows, padded to 16 (ids 0, slots -1) and sliced back to 10."""
    fwd, static, graph = emulated(monkeypatch)
    ids, slots = torch.arange(10), torch.arange(20).reshape(2, 10)
    out = fwd(num_tokens=10, num_reqs=3, uniform=False, input_ids=ids, slot_mapping=slots)
    assert graph.num_replays == 1
    assert torch.equal(out, torch.stack([ids, slots[0], slots[1]], dim=1) * 10)
    assert torch.equal(static["input_ids"][:16], torch.cat([ids, torch.zeros(6, dtype=torch.int64)]))
    assert torch.equal(static["slot_mapping"][:, 10:16], torch.full((2, 6), -1))
    assert torch.equal(static["input_ids"][16:], torch.full((48,), 7))  # rows past the key are untouched
    assert torch.equal(graph.outputs[10:, 1], torch.full((6,), -10))  # padded rows computed from pad values


def test_replay_outputs_alias_static_buffers_unless_copied(monkeypatch):
    """Replayed outputs are views of the graph's static outputs (overwritten next step); copy_outputs clones."""
    slots = torch.zeros(2, 12, dtype=torch.int64)
    fwd, _, graph = emulated(monkeypatch)
    first = fwd(num_tokens=12, num_reqs=1, uniform=False, input_ids=torch.arange(12), slot_mapping=slots)
    assert first.data_ptr() == graph.outputs.data_ptr()
    fwd(num_tokens=12, num_reqs=1, uniform=False, input_ids=torch.arange(12) + 1, slot_mapping=slots)
    assert torch.equal(first[:, 0], (torch.arange(12) + 1) * 10)  # overwritten by the next replay
    fwd, _, graph = emulated(monkeypatch, copy_outputs=True)
    kept = fwd(num_tokens=12, num_reqs=1, uniform=False, input_ids=torch.arange(12), slot_mapping=slots)
    assert graph.num_replays == 1 and kept.data_ptr() != graph.outputs.data_ptr()


def test_inputs_filled_in_place_are_not_copied(monkeypatch):
    """Inputs left out (or passed as the static rows themselves) are read from the static buffers in place."""
    fwd, static, graph = emulated(monkeypatch)
    static["input_ids"][:9] = torch.arange(1, 10)
    static["slot_mapping"][:, :9] = 5
    out = fwd(num_tokens=9, num_reqs=9, uniform=False, input_ids=static["input_ids"][:9])
    assert graph.num_replays == 1
    assert torch.equal(out[:, 0], torch.arange(1, 10) * 10) and torch.equal(out[:, 1], torch.full((9,), 50))


def test_wrong_input_dtype_or_size_is_an_error(monkeypatch):
    """A replayed input whose dtype or token count does not match its static buffer raises CaptureError."""
    fwd, _, _ = emulated(monkeypatch)
    with pytest.raises(CaptureError, match=r"input_ids='\(11,\) torch.float32': must be \(11,\) torch.int64"):
        fwd(num_tokens=11, num_reqs=1, uniform=False, input_ids=torch.zeros(11))
    with pytest.raises(CaptureError, match=r"must be \(2, 11\) torch.int64 for num_tokens=11"):
        fwd(num_tokens=11, num_reqs=1, uniform=False, slot_mapping=torch.zeros(2, 12, dtype=torch.int64))


class FakeCuda:
    """Stands in for the torch.cuda capture API on CPU and records what capture() asks of it."""

    def __init__(self):
        self.events = []
        self.pools = set()
        self.capturing = None
        self.streams = []  # every side stream made (torch.cuda.Stream())
        self.used = []  # the stream of each warm-up and capture (torch.cuda.stream(s), or torch.cuda.graph(stream=s))

    def install(self, monkeypatch):
        """Patch the torch.cuda functions capture() uses."""
        fake = self

        class Graph:
            def replay(self):
                fake.events.append(("replay",))

            def capture_begin(self, pool=None):  # graphkv captures on its own stream (torch.cuda.stream, below)
                fake.pools.add(pool)
                fake.capturing = self

            def capture_end(self):
                fake.capturing = None

        class Stream:
            def __init__(self):
                fake.streams.append(self)

            def wait_stream(self, other):
                pass

        @contextlib.contextmanager
        def graph(g, pool=None, stream=None):
            fake.pools.add(pool)
            fake.used.append(stream)
            fake.capturing = g
            yield
            fake.capturing = None

        def on(s):
            fake.used.append(s)
            return contextlib.nullcontext()

        current = Stream()  # the serving stream, not a side stream
        fake.streams.remove(current)

        for name, value in {"is_available": lambda: True, "graph_pool_handle": lambda: ("pool",),
                            "Stream": Stream, "current_stream": lambda: current, "stream": on,
                            "CUDAGraph": Graph, "graph": graph, "synchronize": lambda: None}.items():
            monkeypatch.setattr(torch.cuda, name, value)
        from graphkv.runtime.capture import piecewise

        monkeypatch.setattr(piecewise, "graph_device", lambda device: True)  # CPU tensors stand in for CUDA ones


def test_a_cpu_forward_on_a_machine_with_cuda_captures_nothing_and_runs_eagerly(monkeypatch, caplog):
    """With CUDA present, static inputs on the CPU get no (empty) CUDA graph: every step runs eagerly, said once."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=8, cudagraph_mode="FULL")
    fwd = capture(plan, static_inputs={"input_ids": torch.zeros(8, dtype=torch.int64)})(lambda input_ids: input_ids * 2)
    assert fwd.unavailable_reason == ("CUDA graphs need CUDA tensors: the forward's static inputs are on cpu; "
                                      "running eagerly")
    report = fwd.capture(progress=False)
    assert report.keys == () and report.unavailable_reason == fwd.unavailable_reason
    late = capture(plan)(lambda input_ids: input_ids)  # buffers made at capture from CPU example inputs
    assert late.capture(progress=False, example_inputs={"input_ids": torch.ones(3, dtype=torch.int64)}).keys == ()
    assert fwd(num_tokens=3, num_reqs=3, uniform=True, input_ids=torch.tensor([1, 2, 3])).tolist() == [2, 4, 6]


def test_capture_warms_up_every_key_then_captures_largest_first_into_one_pool(monkeypatch, capsys):
    """capture() warms up all keys, then captures them largest first into one pool, with a progress line."""
    from graphkv.runtime.capture import piecewise

    cuda = FakeCuda()
    cuda.install(monkeypatch)
    released, primed = [], []  # events seen when the cuBLAS workspaces were released / primed into the pool
    monkeypatch.setattr(piecewise, "release_blas_workspaces", lambda: released.append(len(cuda.events)))
    monkeypatch.setattr(piecewise, "prime_blas_workspaces",
                        lambda pool, stream: primed.append((len(cuda.events), pool, stream)) or "priming graph")
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=8, cudagraph_mode="FULL")

    def forward(input_ids):
        cuda.events.append(("capture" if cuda.capturing else "warm-up", input_ids.shape[0], input_ids.sum().item()))
        return input_ids * 2

    prepared = []
    fwd = capture(plan)(forward)
    report = fwd.capture(prepare=lambda key: prepared.append(key) or contextlib.nullcontext(),
                         example_inputs={"input_ids": torch.ones(3, dtype=torch.int64)})
    sizes = [8, 4, 4, 2, 2, 1, 1]  # mixed 8; decode 4 before mixed 4; ...
    assert [k.num_tokens for k in report.keys] == sizes and [k.uniform for k in report.keys][1:3] == [True, False]
    assert cuda.events == [("warm-up", n, 0) for n in sizes] + [("capture", n, 0) for n in sizes]  # all-padding
    assert cuda.pools == {("pool",)} and fwd.pool == ("pool",)
    # one side stream for every warm-up and capture: PyTorch allocates cuBLAS workspaces per stream (33 MiB on Hopper)
    assert len(cuda.streams) == 1 and fwd.stream is cuda.streams[0] and cuda.used == [fwd.stream] * 14
    assert prepared == list(report.keys) * 2
    # after the 7 warm-ups the stream's workspaces are primed into the pool (the warm-ups' released), all 7 captures
    # reuse them, and they go back to the pool after the last: one release at the end, not one per capture
    assert primed == [(7, ("pool",), fwd.stream)] and released == [14]
    assert fwd.static_inputs["input_ids"].shape == (8,)
    err = capsys.readouterr().err
    assert "graphkv: warming up 1/7 mixed(num_tokens=8)" in err
    assert "graphkv: capturing CUDA graphs 6/7 decode(num_tokens=1, num_reqs=1)" in err
    assert err.endswith("\n") and err.rstrip().endswith(
        f"graphkv: captured 7 CUDA graphs in {report.seconds:.1f} s (warm-up {report.warm_up_seconds:.1f} s, "
        f"capture {report.capture_seconds:.1f} s)")
    assert 0 <= report.warm_up_seconds + report.capture_seconds <= report.seconds and report.num_piece_graphs == 0
    out = fwd(num_tokens=3, num_reqs=3, uniform=True, input_ids=torch.tensor([1, 2, 3]))
    assert cuda.events[-1] == ("replay",) and out.shape == (3,)
    # capturing again would release the workspaces the graphs share: refused, naming what to do instead
    with pytest.raises(CaptureError, match="a forward captures once") as info:
        fwd.capture(progress=False)
    assert info.value.field == "capture" and "build a new forward" in str(info.value)
    assert primed == [(7, ("pool",), fwd.stream)] and released == [14]  # nothing primed or released again


def test_a_capture_that_fails_releases_the_primed_workspaces_and_names_the_key(monkeypatch):
    """A forward that syncs the host inside the capture (here: raises as torch does) fails at the first key captured:
    CaptureError naming the key and the fix, and the workspaces primed into the pool are released all the same."""
    from graphkv.runtime.capture import piecewise

    cuda = FakeCuda()
    cuda.install(monkeypatch)
    released = []
    monkeypatch.setattr(piecewise, "release_blas_workspaces", lambda: released.append(len(cuda.events)))
    monkeypatch.setattr(piecewise, "prime_blas_workspaces", lambda pool, stream: "priming graph")
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=8, cudagraph_mode="FULL")

    def forward(input_ids):
        cuda.events.append("call")
        if cuda.capturing:
            raise RuntimeError("operation not permitted when stream is capturing")
        return input_ids * 2

    fwd = capture(plan, static_inputs={"input_ids": torch.zeros(8, dtype=torch.int64)})(forward)
    with pytest.raises(CaptureError, match="FULL capture failed: operation not permitted") as info:
        fwd.capture(progress=False)
    assert info.value.field == "forward" and info.value.value == "mixed(num_tokens=8)"
    assert released == [8]  # 7 warm-ups and the failed capture, then the release


def test_full_capture_flow_with_emulated_graphs_equals_eager(monkeypatch):
    """With CUDA graphs emulated on CPU, capture then replay steps of every kind: one replay each, equal to eager."""
    emulator = GraphEmulator().install(monkeypatch)
    model = ToyModel().eval()
    static = {"input_ids": torch.zeros(32, dtype=torch.int64), "positions": torch.zeros(32, dtype=torch.int64)}
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=32, cudagraph_mode="FULL")
    fwd = emulator.capture(plan, model.forward, static_inputs=static)
    report = fwd.capture(progress=False)
    assert len(report.keys) == emulator.captures == 10 and emulator.pools == {("pool",)}
    g = torch.Generator().manual_seed(0)
    for n, r, uniform in [(1, 1, True), (3, 3, True), (5, 2, False), (17, 3, False), (32, 4, False), (9, 4, False)]:
        inputs = {"input_ids": torch.randint(0, 32, (n,), generator=g), "positions": torch.randint(0, 99, (n,),
                                                                                                  generator=g)}
        before = emulator.replays
        out = fwd(num_tokens=n, num_reqs=r, uniform=uniform, **inputs)
        assert emulator.replays == before + 1
        with torch.no_grad():
            torch.testing.assert_close(out, model(**inputs), rtol=1e-5, atol=1e-6)
