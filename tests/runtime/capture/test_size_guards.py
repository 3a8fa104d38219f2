"""The shape guard 0/1 specialisation writes, dropped so one trace serves 1-token steps (size_guards)."""

from __future__ import annotations

import logging

import torch

from graphkv.runtime.capture.size_guards import droppable_shape_guard, step_size_guard_filter

IDS, POS, KEEP = "L['kwargs']['input_ids']", "L['kwargs']['position_ids']", "L['kwargs']['logits_to_keep']"


def test_lower_bounds_and_equalities_of_inputs_built_together_are_droppable():
    """The guard of a 16-layer Qwen3's trace at 5 tokens (torch 2.13): lower bounds of 2 and equalities among the ids
    and positions; a rows-vs-tokens equality (duck sizing unified them), a bound other than 2, a ``!= 1`` from a
    branch, or an equality with an input not named keep it; an empty guard is not droppable."""
    seen = [f"{IDS}.stride()[0] == {IDS}.size()[1]", f"{POS}.size()[1] == {IDS}.size()[1]",
            f"{POS}.stride()[0] == {IDS}.size()[1]", f"2 <= {IDS}.size()[1]", f"2 <= {POS}.storage_offset()",
            f"2 <= {KEEP}.size()[0]"]
    built = ("input_ids", "position_ids")
    assert droppable_shape_guard(seen, built)
    assert droppable_shape_guard(["2 <= L['x'].size()[0]"], ())
    assert not droppable_shape_guard([*seen, f"{KEEP}.size()[0] == {IDS}.size()[1]"], built)
    assert not droppable_shape_guard([f"{POS}.size()[1] == {IDS}.size()[1]"], ("input_ids",))
    assert not droppable_shape_guard([f"3 <= {IDS}.size()[1]"], built)
    assert not droppable_shape_guard([f"{IDS}.size()[1] != 1"], built)
    assert not droppable_shape_guard([f"{IDS}.size()[1] <= 512"], built)
    assert not droppable_shape_guard([], built)
    # upper bounds: only on a step-sized input's size, holding at max_step, one size per expression
    sized = {"step_sized": ("input_ids",), "max_step": 8192}
    assert droppable_shape_guard([f"64*{IDS}.size()[1] <= 2147483647", f"{IDS}.size()[1] <= 8192"], (), **sized)
    assert droppable_shape_guard([f"2 <= {IDS}.size()[1] and {IDS}.size()[1] <= 2147483647"], (), **sized)
    assert not droppable_shape_guard([f"64*{IDS}.size()[1] <= 2147483647"], ())  # no max_step: kept
    assert not droppable_shape_guard([f"{IDS}.size()[1] <= 8191"], (), **sized)  # fails at the largest step
    assert not droppable_shape_guard([f"64*{POS}.size()[1] <= 2147483647"], (), **sized)  # not step-sized
    assert not droppable_shape_guard([f"2 <= {IDS}.size()[1] and {IDS}.size()[0] <= 2147483647"], (), **sized)
    assert not droppable_shape_guard([f"64*{IDS}.size()[1] + 64 <= 2147483647"], (), **sized)
    assert not droppable_shape_guard([f"64*{IDS}.stride()[0] <= 2147483647"], (), **sized)


HIDDEN, COS, SIN = ("L['kwargs']['hidden_states']", "L['kwargs']['position_embeddings'][0]",
                    "L['kwargs']['position_embeddings'][1]")


def test_a_decoder_layers_guard_names_tuple_elements_by_their_tuple_and_strides_as_multiples_of_sizes():
    """The guard of one Qwen3 decoder layer traced at 5 tokens (trace_layers, torch 2.11, hidden 64, head 16): the
    hidden states' token stride is 64 x tokens, the rotary tables' 16 x tokens, each table an element of the
    ``position_embeddings`` tuple. Droppable with those inputs named; an input not named, a constant times a size on
    the left-hand side of an equality, or a size (not a stride) equal to a constant times a size keeps it."""
    seen = [f"{HIDDEN}.stride()[0] == 64*{HIDDEN}.size()[1]", f"{COS}.size()[1] == {HIDDEN}.size()[1]",
            f"{COS}.stride()[0] == 16*{HIDDEN}.size()[1]", f"{SIN}.size()[1] == {HIDDEN}.size()[1]",
            f"{SIN}.stride()[0] == 16*{HIDDEN}.size()[1]", f"2 <= {HIDDEN}.size()[1]"]
    built = ("hidden_states", "position_embeddings")
    assert droppable_shape_guard(seen, built)
    assert not droppable_shape_guard(seen, ("hidden_states",))
    assert not droppable_shape_guard([f"64*{HIDDEN}.size()[1] == {HIDDEN}.stride()[0]"], built)
    # a size equal to a constant times a size holds by no construction
    assert not droppable_shape_guard([f"{HIDDEN}.size()[1] == 2*{COS}.size()[1]"], built)
    assert not droppable_shape_guard([f"{HIDDEN}.stride()[0] == 64*{HIDDEN}.size()[1] + 64"], built)
    # the GPU's 32-bit indexing bound on a tuple element's size, at the largest step
    sized = {"step_sized": built, "max_step": 8192}
    assert droppable_shape_guard([f"16*{SIN}.size()[1] <= 2147483647"], (), **sized)
    assert not droppable_shape_guard([f"16*{SIN}.size()[1] <= 2147483647"], (), step_sized=("hidden_states",),
                                     max_step=8192)


def _counting_backend(graphs: list[torch.fx.GraphModule]):
    def backend(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w).sum(-1)


def test_one_trace_serves_one_token_and_keeps_every_other_guard():
    """A function of a step's tokens [T, 8], T marked dynamic, first called at 5 tokens: with the filter a 1-token
    call runs the same trace (1 graph) and gives eager's values; without it Dynamo traces again (2 graphs). A
    dtype change still retraces with the filter: only the shape guard is dropped."""
    w = torch.linspace(0.5, 1.5, 8)

    def serve(guard_filter, tokens: tuple[int, ...]):
        torch._dynamo.reset()
        graphs: list[torch.fx.GraphModule] = []
        compiled = torch.compile(_rms, backend=_counting_backend(graphs), options={"guard_filter_fn": guard_filter})
        for n in tokens:
            x = torch.arange(n * 8, dtype=torch.float32).reshape(n, 8) / 7
            torch._dynamo.maybe_mark_dynamic(x, 0)
            torch.testing.assert_close(compiled(x, w), _rms(x, w), rtol=0, atol=0)
        return compiled, graphs

    assert len(serve(None, (5, 1, 3))[1]) == 2
    compiled, graphs = serve(step_size_guard_filter(("x",)), (5, 1, 3))
    assert len(graphs) == 1
    x = torch.ones(2, 8, dtype=torch.float64)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    assert compiled(x, w.double()).dtype == torch.float64 and len(graphs) == 2


def _capped(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] <= 512:  # a bound from the code, not from 0/1 specialisation
        return x * 2
    return x


def test_a_kept_shape_guard_is_recorded_and_logged(caplog):
    """A shape guard with a bound the code wrote (``size <= 512``) is kept: the filter records its expressions (one
    tuple per trace) and logs the bound at INFO, so a retrace says why; a droppable one records nothing."""
    torch._dynamo.reset()
    keep = step_size_guard_filter(("x",))
    compiled = torch.compile(_capped, backend=_counting_backend([]), options={"guard_filter_fn": keep})
    x = torch.ones(5, 8)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    with caplog.at_level(logging.INFO, logger="graphkv.runtime.capture.size_guards"):
        compiled(x)
    # Dynamo writes the range as one expression, its lower bound from 0/1 specialisation with the code's bound
    assert keep.kept == [("2 <= L['x'].size()[0] and L['x'].size()[0] <= 512",)]
    logged = [r.getMessage() for r in caplog.records if "keeps its shape guard" in r.getMessage()]
    assert len(logged) == 1 and logged[0].endswith("beyond the droppable: 2 <= L['x'].size()[0] and L['x'].size()[0] "
                                                   "<= 512")
    torch._dynamo.reset()
    dropped = step_size_guard_filter(("x",))
    torch.compile(_rms, backend=_counting_backend([]), options={"guard_filter_fn": dropped})(x, torch.ones(8))
    assert dropped.kept == []


W64 = torch.linspace(-1.0, 1.0, 64 * 64).reshape(64, 64)


def _step(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    x = ids.float().unsqueeze(-1) * W64[0] + pos.float().unsqueeze(-1)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return torch.nn.functional.silu(x @ W64)


def test_the_gpus_triton_kernels_bound_the_step_and_the_filter_drops_what_the_largest_step_holds():
    """Inductor's Triton code generator (the GPU's, here on a CPU: ``cpu_backend="triton"``; Triton's own compile
    then fails for want of a GPU driver, after the guards are written, and the piece runs eagerly) proves 32-bit
    indexing with guards ``c*tokens <= 2147483647``. Without ``max_step`` they keep the shape guard and a 1-token step
    traces again (2 traces: the H100's 2026-11-27 retrace); with the plan's largest step (8192) they are dropped and
    5-, 1- and 3-token steps run one trace with eager's values; with a largest step whose indices would pass 2**31
    (2**26 tokens x 64) the guard is kept."""
    from torch._inductor.compile_fx import compile_fx

    def inductor_or_eager(graphs: list[torch.fx.GraphModule]):
        def backend(gm: torch.fx.GraphModule, example_inputs):
            graphs.append(gm)
            try:
                return compile_fx(gm, example_inputs)
            except Exception:  # noqa: BLE001 - no GPU driver: Triton cannot compile here
                return gm.forward
        return backend

    traces, kept = {}, {}
    with torch._inductor.config.patch(cpu_backend="triton"):
        for max_step in (None, 8192, 2 ** 26):
            torch._dynamo.reset()
            graphs: list[torch.fx.GraphModule] = []
            guards = step_size_guard_filter(("ids", "pos"), step_sized=("ids", "pos"), max_step=max_step)
            compiled = torch.compile(_step, backend=inductor_or_eager(graphs), options={"guard_filter_fn": guards})
            for n in (5, 1, 3):
                ids, pos = torch.arange(n).view(1, n), torch.arange(n).view(1, n) + 7
                for t in (ids, pos):
                    torch._dynamo.maybe_mark_dynamic(t, 1)
                torch.testing.assert_close(compiled(ids, pos), _step(ids, pos))
            traces[max_step], kept[max_step] = len(graphs), guards.kept
    torch._dynamo.reset()
    assert traces == {None: 2, 8192: 1, 2 ** 26: 2}
    assert "64*L['ids'].size()[1] <= 2147483647" in kept[None][0] and kept[8192] == []
    assert "64*L['ids'].size()[1] <= 2147483647" in kept[2 ** 26][0]
