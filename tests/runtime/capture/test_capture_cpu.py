"""The capture wrapper on CPU: eager fallback, its statement, logging once per reason, padding and slicing."""

import contextlib
import logging

import attrs
import numpy as np
import pytest
import torch

from capture_toys import GraphEmulator, ToyModel, backend_with, make_plan, with_mode
from graphkv import Budget, CaptureError, CudaGraphMode, CudaGraphSupport, SpecError
from graphkv.distributed.plans import ConsensusPlan
from graphkv.plan.gpu_fit import GpuPlan
from graphkv.runtime import Batch, Step
from graphkv.runtime.capture.graphs import CPU_UNAVAILABLE, MODE_NONE, CapturedForward, _Captured, capture
from graphkv.runtime.capture.keys import GraphKey, dispatch

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


# ---- refusals: every wrong argument is a CaptureError naming it (never a raw TypeError, a silent cast, a hang) ----

SMALL = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=8, cudagraph_mode="FULL")  # 7 keys, 8 largest


def ids(n: int = 8) -> torch.Tensor:
    """An int64 token-id buffer of ``n`` rows."""
    return torch.zeros(n, dtype=torch.int64)


def column(input_ids):
    """A token-major forward: one output row per token."""
    return input_ids[:, None] * 10


def rehearsed(fn=column, plan=SMALL, **options) -> CapturedForward:
    """``fn`` wrapped under ``plan`` with an 8-row input_ids buffer, every key rehearsed."""
    options.setdefault("static_inputs", {"input_ids": ids()})
    fwd = capture(plan, **options)(fn)
    fwd.capture(progress=False, rehearse=True)
    return fwd


def shape_of(fwd: CapturedForward, num_tokens: int, num_reqs: int, uniform: bool):
    """The StepShape ``fwd`` decides for a step (as Step.prepare asks it)."""
    d = dispatch(fwd.plan.cudagraph, fwd.plan.limits, num_tokens=num_tokens, num_reqs=num_reqs, uniform=uniform)
    return fwd.shape_of(d, num_tokens, num_reqs, uniform)


def test_a_plan_of_another_kind_is_refused_naming_where_its_plan_is():
    """A GpuPlan, a ConsensusPlan, a dict or None as the plan is a CaptureError saying where the Plan is (was: a raw
    AttributeError on .limits)."""
    gpu = GpuPlan(plan=SMALL, budget=Budget.kv_bytes("1GiB"), reserve_is_auto=True, beside_bytes=0)
    with pytest.raises(CaptureError, match=r"^plan='GpuPlan': must be a graphkv Plan; pass its \.plan \(the Plan "
                                           r"compile_for_gpu sized to the GPU\): graphkv\.capture\(gpu_plan\.plan"):
        capture(gpu)
    consensus = ConsensusPlan(tensor_parallel_size=1, pipeline_parallel_size=1, num_blocks=SMALL.num_blocks,
                              max_model_len=SMALL.max_model_len, num_blocks_reason="", max_model_len_reason="",
                              ranks=(), stages=(SMALL,))
    with pytest.raises(CaptureError, match=r"^plan='ConsensusPlan': must be a graphkv Plan; pass this rank's stage "
                                           r"plan: consensus\.plan_for\(model\) \(that is consensus\.stages\["):
        capture(consensus, static_inputs={"input_ids": ids()})(column)
    for plan, kind in (({}, "dict"), (None, "NoneType")):
        with pytest.raises(CaptureError, match=rf"^plan='{kind}': must be a graphkv Plan; build it with graphkv\."
                                               r"compile\(model, limits, budget\)$"):
            CapturedForward(column, plan)


@pytest.mark.parametrize("static, message", [
    (ids(), r"^static_inputs='Tensor': must be a mapping of input name -> value \(or None\)"),
    ({"input_ids": [0] * 8}, r"^static_inputs\['input_ids'\]='list': must be a torch\.Tensor \(a persistent buffer"),
    ({"input_ids": np.zeros(8, np.int64)}, r"^static_inputs\['input_ids'\]='ndarray': must be a torch\.Tensor"),
    ({"input_ids": torch.tensor(0)}, r"^static_inputs\['input_ids'\]='a 0-dim tensor': must have a token dim"),
    ({0: ids()}, r"^static_inputs=0: names must be str \(got int\)"),
    ({"input_ids": torch.zeros(8, dtype=torch.int64, device="meta")},
     r"^static_inputs\['input_ids'\]='\(8,\) on meta': a meta tensor has no memory a forward could read"),
    ({"input_ids": torch.zeros(1, dtype=torch.int64).expand(8)},
     r"^static_inputs\['input_ids'\]='shape \(8,\) strides \(0,\)': its elements overlap in memory \(an expanded"),
])
def test_static_inputs_that_are_no_buffers_are_refused(static, message):
    """static_inputs must map str names to tensors with a token dim and memory of their own per element: a tensor, a
    list, an ndarray, a 0-dim tensor, an int name, a meta tensor or an expanded view is refused naming it (was: raw
    RuntimeError, AttributeError or IndexError at capture)."""
    with pytest.raises(CaptureError, match=message):
        capture(SMALL, static_inputs=static)(column)


@pytest.mark.parametrize("options, message", [
    ({"token_dims": {"input_ids": 5}}, r"^token_dims\['input_ids'\]=5: must be an int dim of the 1-dim buffer "
                                       r"\(8,\); pass the dim that counts tokens, 0 <= dim < 1$"),
    ({"token_dims": {"input_ids": "0"}}, r"^token_dims\['input_ids'\]='0': must be an int dim"),
    ({"token_dims": [0]}, r"^token_dims='list': must be a mapping of input name -> value"),
    ({"pad_values": {"input_ids": "a"}}, r"^pad_values\['input_ids'\]='a': must be a number \(an int or a float\)"),
    ({"pad_values": {"input_ids": 1e30}}, r"^pad_values\['input_ids'\]=1e\+30: a torch\.int64 buffer cannot hold "
                                          r"it: padding rows would hold another value"),
])
def test_token_dims_and_pad_values_of_the_wrong_kind_are_refused(options, message):
    """A token dim out of range or not an int, token_dims not a mapping, a pad value that is no number or overflows
    int64 are refused when wrapping (was: raw IndexError, TypeError or RuntimeError at capture)."""
    with pytest.raises(CaptureError, match=message):
        capture(SMALL, static_inputs={"input_ids": ids()}, **options)(column)


def test_pad_values_a_buffer_cannot_hold_are_refused():
    """PAD_SLOT_ID -1 (the default pad of a slot_mapping) in a uint8 buffer would become slot 255 and 2.7 in an
    int64 buffer 2: both refused when wrapping; -1 in int8, 0.1 in float32 and a negative token dim are taken and
    padded with."""
    with pytest.raises(CaptureError, match=r"^pad_values\['slot_mapping'\]=-1: the default pad value \(PAD_SLOT_ID "
                                           r"for names ending in slot_mapping\): a torch\.uint8 buffer cannot hold "
                                           r"it: padding rows would hold another value \(a real slot"):
        capture(SMALL, static_inputs={"slot_mapping": torch.zeros(8, dtype=torch.uint8)})(lambda slot_mapping: 0)
    with pytest.raises(CaptureError, match=r"^pad_values\['input_ids'\]=2\.7: a torch\.int64 buffer cannot hold it"):
        capture(SMALL, static_inputs={"input_ids": ids()}, pad_values={"input_ids": 2.7})(column)
    with pytest.raises(CaptureError, match=r"^pad_values\['h'\]=1e\+39: a torch\.float32 buffer cannot hold it"):
        capture(SMALL, static_inputs={"h": torch.zeros(8)}, pad_values={"h": 1e39})(lambda h: h)
    slots, h = torch.zeros(2, 8, dtype=torch.int8), torch.zeros(8, 3)
    fwd = rehearsed(lambda slot_mapping, h: h, static_inputs={"slot_mapping": slots, "h": h},
                    pad_values={"h": 0.1}, token_dims={"slot_mapping": -1})
    fwd(num_tokens=3, num_reqs=3, uniform=True, slot_mapping=torch.ones(2, 3, dtype=torch.int8), h=torch.ones(3, 3))
    assert slots[:, :4].tolist() == [[1, 1, 1, -1]] * 2 and h[3].tolist() == [torch.tensor(0.1).item()] * 3


def test_static_input_names_the_forward_does_not_take_are_refused():
    """Static inputs are passed as keyword arguments: a name that is no parameter of the forward is refused when
    wrapping, naming its parameters (was: a raw TypeError at capture); a forward taking **kwargs takes any name."""
    with pytest.raises(CaptureError, match=r"^static_inputs=\['ids'\]: name no parameter of the forward column"
                                           r"\(input_ids\), which is called with every static input as a keyword "
                                           r"argument; name the static inputs after the forward's parameters"):
        capture(SMALL, static_inputs={"ids": ids()})(column)
    assert list(rehearsed(lambda **kw: kw["ids"], static_inputs={"ids": ids()}).static_inputs) == ["ids"]


@pytest.mark.parametrize("error", [ValueError("no such head"), KeyError("layers.3"), TypeError("bad"),
                                   RuntimeError("CUDA error")])
def test_a_forward_that_raises_while_capturing_is_a_capture_error_naming_the_key(error):
    """Whatever the forward raises while warming up, or while its key is captured, is a CaptureError naming the key,
    with the forward's exception as its cause (was: only RuntimeError and AssertionError were wrapped)."""
    def raises(input_ids):
        raise error

    with pytest.raises(CaptureError, match=r"^forward='mixed\(num_tokens=8\)': warm-up failed: ") as info:
        rehearsed(raises)
    assert info.value.__cause__ is error
    calls = []

    def raises_at_capture(input_ids):  # 7 warm-ups, then the first capture
        calls.append(input_ids.shape[0])
        if len(calls) == 8:
            raise error
        return column(input_ids)

    with pytest.raises(CaptureError, match=r"^forward='mixed\(num_tokens=8\)': FULL capture failed: ") as info:
        rehearsed(raises_at_capture)
    assert info.value.__cause__ is error and calls == [8, 4, 4, 2, 2, 1, 1, 8]


def test_run_refuses_inputs_and_shapes_of_the_wrong_kind():
    """On a replayed (rehearsed) step a list, an ndarray, a meta tensor or a view overlapping the rows it would be
    copied into is refused naming the input; run() refuses inputs=None and a shape that is no StepShape (was: raw
    AttributeError, NotImplementedError, RuntimeError or TypeError)."""
    fwd = rehearsed()
    for given, kind in (([1, 2, 3], "'list'"), (np.arange(3), "'ndarray'"),
                        (torch.arange(3, device="meta"), r"'\(3,\) torch\.int64 on meta'")):
        with pytest.raises(CaptureError, match=rf"^input_ids={kind}: must be \(3,\) torch\.int64 for num_tokens=3; "
                                               r"pass a tensor of the static buffer's dtype"):
            fwd(num_tokens=3, num_reqs=3, uniform=True, input_ids=given)
    with pytest.raises(CaptureError, match=r"^input_ids='\(3,\) torch\.int64 on cpu': cannot be copied into its "
                                           r"static rows: "):
        fwd(num_tokens=3, num_reqs=3, uniform=True, input_ids=fwd.static_inputs["input_ids"][1:4])
    shape = shape_of(fwd, 3, 3, True)
    with pytest.raises(CaptureError, match=r"^inputs='NoneType': must be a mapping of input name -> tensor"):
        fwd.run(shape, inputs=None)
    with pytest.raises(CaptureError, match=r"^shape='NoneType': must be a StepShape; decide it with this forward"):
        fwd.run(None, inputs={})
    assert fwd.run(shape, inputs={"input_ids": torch.tensor([1, 2, 3])}).tolist() == [[10], [20], [30]]


def test_eager_steps_check_their_inputs_as_replays_do():
    """A step above every key runs eagerly and refuses what a replay refuses: 10 tokens with a 5-row input (was: 5
    rows returned) or a float input; an input left out above its buffer's 8 rows is refused too (was: a raw
    RuntimeError); 10 tokens with 10 rows run."""
    fwd = rehearsed()
    with pytest.raises(CaptureError, match=r"^input_ids='\(5,\) torch\.int64': must be \(10,\) torch\.int64 for "
                                           r"num_tokens=10"):
        fwd(num_tokens=10, num_reqs=2, uniform=False, input_ids=torch.arange(5))
    with pytest.raises(CaptureError, match=r"^input_ids='\(10,\) torch\.float32': must be \(10,\) torch\.int64"):
        fwd(num_tokens=10, num_reqs=2, uniform=False, input_ids=torch.zeros(10))
    with pytest.raises(CaptureError, match=r"^num_tokens=100: exceeds the static buffer 'input_ids' \(8 rows on its "
                                           r"token dim\), which an input left out is read from; pass input_ids= with "
                                           r"the step's 100 rows"):
        fwd(num_tokens=100, num_reqs=2, uniform=False)
    assert fwd(num_tokens=10, num_reqs=2, uniform=False, input_ids=torch.arange(10)).shape == (10, 1)
    assert shape_of(fwd, 10, 2, False).key is None


def test_run_refuses_a_shape_whose_padded_sizes_are_not_its_keys():
    """A hand-made StepShape naming the decode key of 4 tokens must carry that key's padded sizes: 8 padded tokens (a
    GPU replay would run 4 and cut 6 silently), 5 tokens, 8 padded requests or uniform=False are refused; an eager
    shape must be unpadded."""
    fwd = rehearsed()
    good = shape_of(fwd, 3, 3, True)
    assert good.key == GraphKey(num_tokens=4, num_reqs=4, uniform=True)
    for bad in (attrs.evolve(good, num_tokens=6, num_tokens_padded=8), attrs.evolve(good, num_tokens=5),
                attrs.evolve(good, num_reqs_padded=8), attrs.evolve(good, uniform=False)):
        with pytest.raises(CaptureError, match=r"^shape='num_tokens=\d, num_reqs=3, .*': does not fit its key: a step "
                                               r"on decode\(num_tokens=4, num_reqs=4\) has num_tokens_padded=4 and "
                                               r"num_reqs_padded=4, 1 <= num_tokens <= 4, 1 <= num_reqs <= 4 and "
                                               r"uniform=True"):
            fwd.run(bad, inputs={})
    eager = attrs.evolve(good, key=None, mode=CudaGraphMode.NONE)  # still padded to 4
    with pytest.raises(CaptureError, match=r"^shape='.*': an eager shape runs on its own sizes"):
        fwd.run(eager, inputs={})


def test_a_0_dim_output_is_refused_at_capture_and_on_a_padded_replay(monkeypatch):
    """A reduction over the tokens (a 0-dim output) would include a replay's padding rows (a mean of 1.5 for 2.0):
    refused at capture saying why, and on a padded step of a graph holding such an output."""
    def mean(input_ids):
        return input_ids.float().mean()

    with pytest.raises(CaptureError, match=r"^forward output='a 0-dim tensor': has no token or request dim to cut to "
                                           r"the step's tokens: computed over the 8 padded rows of "
                                           r"mixed\(num_tokens=8\) it includes the padding rows of every shorter step"):
        rehearsed(mean)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fwd = capture(SMALL, static_inputs={"input_ids": ids()})(mean)
    key = GraphKey(num_tokens=4, num_reqs=4, uniform=True)
    fwd._graphs[key] = _Captured(graph=ReplayOnCPU(mean, {"input_ids": fwd.static_inputs["input_ids"][:4]}),
                                 outputs=torch.tensor(1.5))
    with pytest.raises(CaptureError, match=r"^forward output='a 0-dim tensor': .* the 4 padded rows of decode"):
        fwd(num_tokens=3, num_reqs=3, uniform=True, input_ids=torch.tensor([1, 2, 3]))


def test_static_inputs_over_one_buffer_are_refused():
    """Two names over one buffer, or views of one tensor whose spans overlap, are refused (staging positions
    overwrote input_ids silently); disjoint rows of one tensor are taken and staged apart."""
    b = torch.zeros(2, 8, dtype=torch.int64)

    def both(input_ids, positions):
        return torch.stack([input_ids, positions], 1)

    for a, p in ((b[0], b[0]), (b.view(-1)[:9], b.view(-1)[8:])):
        with pytest.raises(CaptureError, match=r"^static_inputs=\['input_ids', 'positions'\]: lie in overlapping "
                                               r"memory \(one buffer twice, or views of one tensor whose spans "
                                               r"overlap\): staging one would overwrite the other's rows"):
            capture(SMALL, static_inputs={"input_ids": a, "positions": p})(both)
    fwd = rehearsed(both, static_inputs={"input_ids": b[0], "positions": b[1]})
    out = fwd(num_tokens=3, num_reqs=3, uniform=True, input_ids=torch.tensor([1, 2, 3]),
              positions=torch.tensor([10, 11, 12]))
    assert out.tolist() == [[1, 10], [2, 11], [3, 12]]


@pytest.mark.parametrize("options, message", [
    ({"prepare": 5}, r"^prepare='5': must be callable or None; pass a function of a GraphKey returning a context "
                     r"manager, e\.g\. prepare=step\.capture_context$"),
    ({"on_key": 1}, r"^on_key='1': must be callable or None"),
    ({"prepare": lambda key: None}, r"^prepare='prepare\(mixed\(num_tokens=8\)\) -> NoneType': must return a "
                                    r"context manager"),
    ({"prepare": lambda key: {}[key]}, r"^prepare='mixed\(num_tokens=8\)': prepare\(mixed\(num_tokens=8\)\) "
                                       r"failed: KeyError: "),
    ({"rehearse": "yes"}, r"^rehearse='yes': must be a bool"),
    ({"example_inputs": {"input_ids": ids(1)}}, r"^example_inputs=\['input_ids'\]: the forward has static_inputs "
                                                r"\['input_ids'\] already .*; drop example_inputs=$"),
])
def test_capture_arguments_of_the_wrong_kind_are_refused(options, message):
    """A prepare or on_key that is not callable, a prepare returning None or raising, a rehearse that is no bool and
    example_inputs beside static_inputs (was: silently ignored) are refused naming the argument (was: raw
    TypeError)."""
    fwd = capture(SMALL, static_inputs={"input_ids": ids()})(column)
    with pytest.raises(CaptureError, match=message):
        fwd.capture(progress=False, **{"rehearse": True, **options})


@pytest.mark.parametrize("examples, message", [
    (torch.ones(3), r"^example_inputs='Tensor': must be a mapping of input name -> value"),
    ({"input_ids": [1, 2]}, r"^example_inputs\['input_ids'\]='list': must be a torch\.Tensor"),
    ({"input_ids": torch.tensor(1)}, r"^example_inputs\['input_ids'\]='a 0-dim tensor': must have a token dim"),
])
def test_example_inputs_of_the_wrong_kind_are_refused(examples, message):
    """example_inputs that are no mapping, hold no tensor or a 0-dim one are refused (was: raw AttributeError or
    IndexError)."""
    with pytest.raises(CaptureError, match=message):
        capture(SMALL)(column).capture(progress=False, rehearse=True, example_inputs=examples)


def test_a_forward_planned_otherwise_than_its_step_is_refused_naming_both():
    """A forward planned for 8 requests captured with a Step of 4 (was: a raw numpy ValueError), or one planned for 2
    served by a Step of 4 (was: every decode step eager, "graphs not captured yet"), is refused naming the limit that
    differs; the Step refuses a key it cannot stage; a forward of an equal plan compiled apart runs."""
    step = Step(SMALL)
    wide = capture(make_plan("flash_attn", max_num_seqs=8, max_num_batched_tokens=8, cudagraph_mode="FULL"),
                   static_inputs={"input_ids": step.input_ids})(column)
    with pytest.raises(CaptureError, match=r"^prepare='Step\.capture_context': belongs to a Step of another plan "
                                           r"than the forward's \(forward's vs Step's: limits\.max_num_seqs: 8 vs 4\)"):
        wide.capture(progress=False, prepare=step.capture_context, rehearse=True)
    with pytest.raises(SpecError, match=r"^key='decode\(num_tokens=8, num_reqs=8\)': this Step cannot stage it: its "
                                        r"plan has max_num_seqs=4 and max_num_batched_tokens=8"):
        with step.capture_context(GraphKey(num_tokens=8, num_reqs=8, uniform=True)):
            pass
    narrow = rehearsed(plan=make_plan("flash_attn", max_num_seqs=2, max_num_batched_tokens=8, cudagraph_mode="FULL"),
                       static_inputs={"input_ids": step.input_ids})
    batch = Batch(req_ids=("a", "b", "c"), query_lens=(1, 1, 1), seq_lens=(1, 1, 1), new_pages=(((1,),), ((2,),),
                                                                                                  ((3,),)))
    with pytest.raises(SpecError, match=r"^forward=\"CapturedForward of plan 'toy'\": was built under another plan "
                                        r"than this Step's \(forward's vs Step's: limits\.max_num_seqs: 2 vs 4\)"):
        step.run(narrow, batch, input_ids=[1, 2, 3])
    assert step.active_requests == ()
    same = rehearsed(plan=make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=8, cudagraph_mode="FULL"),
                     static_inputs={"input_ids": step.input_ids})
    assert step.run(same, batch, input_ids=[1, 2, 3]).tolist() == [[10], [20], [30]]
    assert step.shape.key == GraphKey(num_tokens=4, num_reqs=4, uniform=True)


def test_capture_after_a_rehearsal_reports_what_the_forward_does():
    """capture() where no graph can be captured, after capture(rehearse=True), drops the rehearsal: its report (no
    keys, the reason) is what the forward does (was: the report said no keys while 7 rehearsed keys kept padding)."""
    fwd = rehearsed()
    assert len(fwd.keys) == 7 and fwd.rehearsed and shape_of(fwd, 3, 3, True).num_tokens_padded == 4
    report = fwd.capture(progress=False)
    assert report.keys == fwd.keys == () and not fwd.rehearsed and not report.rehearsed
    assert report.unavailable_reason is not None and report.unavailable_reason == fwd.unavailable_reason
    shape = shape_of(fwd, 3, 3, True)
    assert (shape.key, shape.num_tokens_padded, shape.eager_reason) == (None, 3, fwd.unavailable_reason)


def test_static_inputs_are_checked_at_capture_on_every_device_and_mode_none_says_so():
    """A buffer smaller than the largest key (8 tokens) is refused by capture() without rehearse, on a CPU as on a GPU
    (was: accepted on a CPU, failing on a GPU); a plan of mode NONE gives that reason, not the CPU's."""
    with pytest.raises(CaptureError, match=r"^static_inputs=\{'input_ids': 4\}: token dim must hold the largest "
                                           r"capture size 8"):
        capture(SMALL, static_inputs={"input_ids": ids(4)})(column).capture(progress=False)
    none = capture(make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=8, cudagraph_mode="NONE"),
                   static_inputs={"input_ids": ids()})(column)
    assert none.unavailable_reason == MODE_NONE == ("CUDA graphs disabled: the plan's cudagraph mode is NONE; running "
                                                    "eagerly")
    for rehearse in (False, True):
        report = none.capture(progress=False, rehearse=rehearse)
        assert report.keys == () and report.unavailable_reason == MODE_NONE
    assert CPU_UNAVAILABLE not in str(report)
