"""Shared toys for the capture tests: plans for every capture mode, a causal 'attention' custom op
and a small model with two attention ops between linear layers."""

from __future__ import annotations

import contextlib
import sys
from unittest import mock

import attrs
import torch

from graphkv import (Backend, Budget, CacheOrder, CudaGraphSupport, FullAttentionSpec, KVLayout, Limits, ModelKV,
                     MultipleOf, Plan, compile_plan)

ATTENTION_OP = "graphkv_test::attention"
FULL = FullAttentionSpec(num_kv_heads=8, head_size=128)


def backend_with(support: CudaGraphSupport) -> Backend:
    """A full-attention backend descriptor with the given CUDA-graph support."""
    return Backend(name=f"toy_{support.name.lower()}", supported_kernel_block_sizes=(MultipleOf(16),),
                   cudagraph_support=support, kv_layout=KVLayout(order=CacheOrder.BLOCKS_FIRST))


def make_plan(backend: "str | Backend" = "flash_attn", **limits) -> Plan:
    """A two-layer full-attention plan on ``backend`` under ``limits``; steps are captured up to
    ``max_num_batched_tokens`` unless ``max_cudagraph_capture_size`` is given (vLLM's default,
    2 x ``max_num_seqs``, would leave these toys' larger steps uncaptured)."""
    model = ModelKV.from_specs("toy", [(FULL, backend)] * 2)
    limits.setdefault("max_model_len", 4096)
    limits.setdefault("max_cudagraph_capture_size", limits.get("max_num_batched_tokens"))
    return compile_plan(model, Limits(**limits), Budget.kv_bytes("1GiB"))


def with_mode(plan: Plan, mode) -> Plan:
    """``plan`` with its resolved capture mode forced to ``mode`` (what compile_plan would refuse)."""
    return attrs.evolve(plan, cudagraph=attrs.evolve(plan.cudagraph, mode=mode))


@torch.library.custom_op(ATTENTION_OP, mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal single-head attention over the token dim: padding tokens at the end change nothing before them."""
    scores = (q @ k.transpose(0, 1)) / q.shape[-1] ** 0.5
    mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


@attention.register_fake
def _(q, k, v):
    return torch.empty_like(q)


@torch.library.custom_op("graphkv_test::attention_into", mutates_args=("out",))
def attention_into(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    """The same attention, written into a caller-allocated ``out`` (how serving backends return results)."""
    out.copy_(attention(q, k, v))


class ToyModel(torch.nn.Module):
    """Embedding, then linear -> attention -> linear -> attention -> linear."""

    def __init__(self, vocab: int = 32, hidden: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.a, self.b, self.c = (torch.nn.Linear(hidden, hidden) for _ in range(3))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.a(self.embed(input_ids) + positions[:, None].to(torch.float32))
        h = torch.ops.graphkv_test.attention(h, h, h)
        h = self.b(h).relu()
        h = torch.ops.graphkv_test.attention(h, h, h)
        return self.c(h)


def _copy_into(static, fresh):
    if isinstance(static, torch.Tensor):
        static.copy_(fresh)
    elif isinstance(static, (tuple, list)):
        for s, f in zip(static, fresh):
            _copy_into(s, f)
    elif isinstance(static, dict):
        for k in static:
            _copy_into(static[k], fresh[k])


_ACTIVE = None


class _EmulatedGraph:
    def __init__(self, emulator, fn, outputs):
        self.emulator, self.fn, self.outputs = emulator, fn, outputs

    def replay(self):
        emulator = _ACTIVE or self.emulator  # count on the emulator installed now (graphs outlive tests)
        emulator.replays += 1
        emulator.capturing = True  # a real replay runs no Python: nested runners are part of this graph
        try:
            _copy_into(self.outputs, self.fn())
        finally:
            emulator.capturing = False


class GraphEmulator:
    """CUDA graphs emulated on CPU with the same contract: a capture runs the function once on static inputs
    and keeps its outputs; a replay re-runs it on the (updated) static inputs and copies into those outputs."""

    def __init__(self):
        self.captures = 0
        self.replays = 0
        self.capturing = False
        self.pools = set()
        self.capture_streams = []
        self.releases = []  # each capture's release_workspaces
        self.primes = []  # (pool, stream) of each prime_blas_workspaces
        self.current = None  # the current stream (torch.cuda.stream(s) sets it); None: the serving stream

    def capture_graph(self, fn, pool, stream=None, *, release_workspaces=True):
        """Stands in for graphkv.runtime.capture.piecewise.capture_graph."""
        self.releases.append(release_workspaces)
        self.pools.add(pool)
        self.capture_streams.append((stream, self.current))  # the stream asked for, the current one
        self.capturing = True
        try:
            outputs = fn()
        finally:
            self.capturing = False
        self.captures += 1
        return _EmulatedGraph(self, fn, outputs), outputs

    def install(self, monkeypatch):
        """Route graph capture through the emulator (torch.cuda.is_available stays False: dynamo reads it)."""
        from graphkv.runtime.capture import piecewise

        class Stream:
            def wait_stream(self, other):
                pass

        serving = Stream()

        @contextlib.contextmanager
        def on(stream):
            before, self.current = self.current, stream
            try:
                yield
            finally:
                self.current = before

        for name, value in {"graph_pool_handle": lambda: ("pool",), "Stream": Stream,
                            "current_stream": lambda: self.current or serving, "stream": on,
                            "synchronize": lambda: None}.items():
            monkeypatch.setattr(torch.cuda, name, value)
        monkeypatch.setattr(piecewise, "capture_graph", self.capture_graph)
        monkeypatch.setattr(piecewise, "prime_blas_workspaces",
                            lambda pool, stream: self.primes.append((pool, stream)) or ("priming", len(self.primes)))
        monkeypatch.setattr(piecewise, "_cuda_graphs_apply", lambda t: not self.capturing)
        monkeypatch.setattr(piecewise, "graph_device", lambda device: True)  # CPU tensors stand in for CUDA ones
        monkeypatch.setattr(sys.modules[__name__], "_ACTIVE", self)
        return self

    @staticmethod
    def capture(plan, fn, **options):
        """graphkv.runtime.capture.graphs(plan, **options)(fn), built while CUDA is reported present."""
        from graphkv.runtime.capture.graphs import capture

        from graphkv.runtime.capture import piecewise

        with mock.patch.object(torch.cuda, "is_available", lambda: True), \
                mock.patch.object(piecewise, "graph_device", lambda device: True):
            return capture(plan, **options)(fn)


class InPlaceToyModel(ToyModel):
    """ToyModel whose attention writes into buffers allocated by the piece before it."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.a(self.embed(input_ids) + positions[:, None].to(torch.float32))
        out = torch.empty_like(h)
        torch.ops.graphkv_test.attention_into(h, h, h, out)
        h = self.b(out).relu()
        out2 = torch.empty_like(h)
        torch.ops.graphkv_test.attention_into(h, h, h, out2)
        return self.c(out2 + h)
