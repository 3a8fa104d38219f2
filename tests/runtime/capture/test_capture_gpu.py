"""Capture on a GPU: capture once, change inputs, replay many times, each replay equal to eager."""

import pytest
import torch

from capture_toys import ATTENTION_OP, ToyModel, make_plan
from graphkv import CudaGraphMode
from graphkv.runtime.capture.graphs import capture
from graphkv.runtime.capture.keys import GraphKey
from graphkv.runtime.capture.piecewise import piecewise_backend, release_blas_workspaces

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: CUDA graphs cannot be captured on CPU")

MAX_TOKENS = 32
STEPS = [(1, 1, True), (3, 3, True), (4, 4, True), (5, 2, False), (17, 3, False), (32, 4, False), (9, 4, False)]


def static_buffers():
    """Static input buffers for MAX_TOKENS tokens on the GPU."""
    return {"input_ids": torch.zeros(MAX_TOKENS, dtype=torch.int64, device="cuda"),
            "positions": torch.zeros(MAX_TOKENS, dtype=torch.int64, device="cuda")}


def model_and_buffers():
    """The toy model on the GPU and static input buffers for MAX_TOKENS tokens."""
    return ToyModel().cuda().eval(), static_buffers()


def check_replays_after_a_workspace_release(fwd, model, tolerance):
    """What cudagraph trees do (every cached cuBLAS workspace freed, the allocator's cache emptied), then every
    step of STEPS replayed: each equals eager within ``tolerance`` (bf16)."""
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    for n, r, uniform in STEPS:
        inputs = step_inputs(n, n)
        out = fwd(num_tokens=n, num_reqs=r, uniform=uniform, **inputs)
        with torch.no_grad():
            torch.testing.assert_close(out, model(**inputs), rtol=tolerance, atol=tolerance)
    torch.cuda.synchronize()


def step_inputs(num_tokens, seed):
    """Fresh random inputs for one step."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return {"input_ids": torch.randint(0, 32, (num_tokens,), device="cuda", generator=g),
            "positions": torch.randint(0, 100, (num_tokens,), device="cuda", generator=g)}


def check_replays_equal_eager(fwd, model, rounds=3):
    """Every step of STEPS, repeated with new inputs, equals the eager model on the real tokens."""
    for seed in range(rounds):
        for n, r, uniform in STEPS:
            inputs = step_inputs(n, seed * 100 + n)
            out = fwd(num_tokens=n, num_reqs=r, uniform=uniform, **inputs)
            with torch.no_grad():
                expected = model(**inputs)
            assert out.shape == expected.shape
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_full_graphs_replay_equal_to_eager():
    """FULL: every key is captured once, largest first; replays with changing inputs equal eager."""
    model, static = model_and_buffers()
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=MAX_TOKENS, cudagraph_mode="FULL")
    fwd = capture(plan, static_inputs=static)(model.forward)
    assert fwd.unavailable_reason is None
    report = fwd.capture(progress=False)
    assert report.keys == fwd.keys and len(fwd.keys) == 10  # decode 1, 2, 4 and mixed 1, 2, 4, 8, 16, 24, 32
    assert fwd.keys[0] == GraphKey(num_tokens=32, num_reqs=None, uniform=False)
    check_replays_equal_eager(fwd, model)
    assert torch.equal(static["input_ids"][9:16], torch.zeros(7, dtype=torch.int64, device="cuda"))  # padded tail


def test_replay_allocates_nothing():
    """Replays of captured keys leave torch.cuda.memory_allocated unchanged."""
    model, static = model_and_buffers()
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=MAX_TOKENS, cudagraph_mode="FULL")
    fwd = capture(plan, static_inputs=static)(model.forward)
    fwd.capture(progress=False)
    inputs = [(n, r, u, step_inputs(n, n)) for n, r, u in STEPS]
    for n, r, u, x in inputs:  # one replay of each key first
        fwd(num_tokens=n, num_reqs=r, uniform=u, **x)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(5):
        for n, r, u, x in inputs:
            fwd(num_tokens=n, num_reqs=r, uniform=u, **x)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


def test_outputs_alias_static_buffers_unless_copied():
    """Two replays of one key return views of the same static output; copy_outputs returns fresh tensors."""
    model, static = model_and_buffers()
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=MAX_TOKENS, cudagraph_mode="FULL")
    fwd = capture(plan, static_inputs=static)(model.forward)
    fwd.capture(progress=False)
    a = fwd(num_tokens=5, num_reqs=2, uniform=False, **step_inputs(5, 1))
    a_values = a.clone()
    b = fwd(num_tokens=6, num_reqs=2, uniform=False, **step_inputs(6, 2))  # same key: 8 tokens
    assert a.data_ptr() == b.data_ptr()
    assert not torch.equal(a, a_values)  # overwritten by the next replay
    copying = capture(plan, static_inputs=static, copy_outputs=True, pool=fwd.pool)(model.forward)
    copying.capture(progress=False)
    c = copying(num_tokens=5, num_reqs=2, uniform=False, **step_inputs(5, 1))
    d = copying(num_tokens=6, num_reqs=2, uniform=False, **step_inputs(6, 2))
    assert c.data_ptr() != d.data_ptr()
    torch.testing.assert_close(c, a_values)


def test_compiled_forward_full_capture_equals_eager():
    """A torch.compile'd (inductor) forward, compiled first and captured second, replays equal to eager."""
    model, static = model_and_buffers()
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=MAX_TOKENS, cudagraph_mode="FULL")
    fwd = capture(plan, static_inputs=static)(torch.compile(model))
    fwd.capture(progress=False)
    check_replays_equal_eager(fwd, model, rounds=2)


def test_piecewise_capture_runs_attention_eagerly_between_graph_pieces():
    """PIECEWISE: the piecewise-compiled forward captures its 3 graph pieces per size; replays equal eager."""
    model, static = model_and_buffers()
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=MAX_TOKENS, cudagraph_mode="PIECEWISE")
    assert plan.cudagraph.mode is CudaGraphMode.PIECEWISE
    backend = piecewise_backend([ATTENTION_OP])
    fwd = capture(plan, static_inputs=static)(torch.compile(model, backend=backend))
    report = fwd.capture(progress=False)
    assert report.skipped == () and len(fwd.keys) == 7  # mixed 1, 2, 4, 8, 16, 24, 32
    assert all(len(split.pieces) == 5 for split in backend.splits)
    assert sum(r.num_graphs for r in backend.runners) == 3 * 7
    check_replays_equal_eager(fwd, model)


def test_piecewise_mode_without_the_piecewise_backend_runs_mixed_steps_eagerly(caplog):
    """PIECEWISE on a forward not compiled with piecewise_backend captures nothing and says so."""
    model, static = model_and_buffers()
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=MAX_TOKENS, cudagraph_mode="PIECEWISE")
    fwd = capture(plan, static_inputs=static)(model.forward)
    report = fwd.capture(progress=False)
    assert fwd.keys == () and "no graphkv piecewise runners" in report.skipped[0]
    check_replays_equal_eager(fwd, model, rounds=1)


class WideHead(ToyModel):
    """ToyModel with a 65536-wide output head: 256 KiB of float32 output per token."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(16, 65536)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.head(super().forward(input_ids, positions))


@pytest.mark.parametrize("mode", ["FULL", "PIECEWISE"])
def test_keys_share_the_memory_of_their_outputs(mode):
    """Captured graphs keep weak views of their outputs (and PIECEWISE pieces stage attention outputs in one
    arena), so the keys' graphs hold less than one largest key's output after capture (kept as owned tensors:
    FULL 94 tokens, PIECEWISE 87 tokens of 256 KiB), and every key's replay still equals eager."""
    model, static = WideHead().cuda().eval(), static_buffers()
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=MAX_TOKENS, cudagraph_mode=mode)
    fn = model.forward if mode == "FULL" else torch.compile(model, backend=piecewise_backend([ATTENTION_OP]))
    fwd = capture(plan, static_inputs=static)(fn)
    # Capture primes cuBLAS workspaces inside its pool and releases every stream's cached workspace after its last
    # graph, so the window starts with none cached either: on the H100 a workspace warmed before it (33 MiB per
    # stream) was freed inside it and the window read -65 MiB.
    release_blas_workspaces()
    before = torch.cuda.memory_allocated()
    fwd.capture(progress=False)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    assert len(fwd.keys) == (10 if mode == "FULL" else 7)
    assert 0 <= kept < MAX_TOKENS * 65536 * 4, kept
    check_replays_equal_eager(fwd, model)


class WideMatmuls(torch.nn.Module):
    """Two 4096-wide bf16 linears: matmuls large enough that cuBLAS uses its workspace."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 4096)
        self.a, self.b = torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 4096)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(self.embed(input_ids) + positions[:, None].to(self.embed.weight.dtype)).relu())


def test_replays_survive_what_cudagraph_trees_do_to_cached_workspaces():
    """torch.compile(mode="reduce-overhead") frees every stream's cached cuBLAS workspace and empties the allocator's
    cache before it records; graphkv's graphs hold their workspace in their own pool, so replays after that still
    equal eager (on an H100 they faulted when the workspace had been warmed outside the pool)."""
    model = WideMatmuls().cuda().to(torch.bfloat16).eval()
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=MAX_TOKENS, cudagraph_mode="FULL")
    fwd = capture(plan, static_inputs=static_buffers())(model.forward)
    fwd.capture(progress=False)
    check_replays_after_a_workspace_release(fwd, model, 2e-2)


class NoMatmulFirst(torch.nn.Module):
    """A split forward whose first piece runs no matmul (an embedding and a scale, as a hybrid model's first piece
    before its mixer), whose splitting op runs matmuls eagerly between pieces (the toy attention's q @ k^T, at
    4096 wide bf16), and whose last piece runs two wide linears."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 4096)
        self.a, self.b = torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 4096)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids) * 0.5 + positions[:, None].to(self.embed.weight.dtype) * 1e-3
        h = torch.ops.graphkv_test.attention(h, h, h)
        return self.b(self.a(h).relu())


def test_piecewise_replays_survive_a_workspace_release_when_the_first_piece_has_no_matmul():
    """The capture stream's cuBLAS workspaces are primed into the graph pool before the first capture, so a split
    forward whose first piece runs no matmul (the eager op between pieces runs the stream's first matmuls) records
    the pool's workspace in every piece: after what cudagraph trees do (every cached workspace freed, the
    allocator's cache emptied) its replays still equal eager."""
    model = NoMatmulFirst().cuda().to(torch.bfloat16).eval()
    plan = make_plan("flash_attn", max_num_seqs=4, max_num_batched_tokens=MAX_TOKENS, cudagraph_mode="PIECEWISE")
    backend = piecewise_backend([ATTENTION_OP])
    fwd = capture(plan, static_inputs=static_buffers())(torch.compile(model, backend=backend))
    report = fwd.capture(progress=False)
    assert report.skipped == () and report.num_piece_graphs == 2 * len(fwd.keys)  # two graph pieces per key
    check_replays_after_a_workspace_release(fwd, model, 3e-2)
