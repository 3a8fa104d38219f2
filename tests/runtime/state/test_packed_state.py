"""Packed state ops (conv, gated delta, Mamba2 scan) against their token-by-token references.

Two steps of a real Step: requests of awkward lengths (1, 5, 54, 97, 17 tokens), first chunks and
continuations mixed, each request's state in its own page of a real pool. Every request's outputs
over both steps, and the state left in its page, must equal the reference run over its whole token
stream from a zero state.
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch

import graphkv
from graphkv.runtime.capture.graphs import capture
from graphkv.runtime import Batch, Step, allocate
from graphkv.runtime.ops.reference import causal_conv_ref, gated_delta_ref, ssd_ref
from graphkv.runtime.state.conv import packed_causal_conv
from graphkv.runtime.state.gated_delta import packed_gated_delta
from graphkv.runtime.state.rows import PackedRows
from graphkv.runtime.state.ssd import packed_ssd

HEADS, DK, DV, TAPS, CHANNELS = 2, 8, 12, 4, 12  # key and value head sizes differ (Qwen3-Next may)
# (request, query length, state page when it joins) per step; "a" and "b" continue in step 2.
STEPS = (
    (("a", 54, 1), ("b", 5, 2), ("c", 1, 3)),
    (("a", 1, None), ("b", 97, None), ("d", 17, 4)),
)


def state_pool(recurrent: tuple[int, ...] = (HEADS, DK, DV)) -> tuple[Step, tuple[torch.Tensor, ...]]:
    """A Step and the state views of a one-layer pool (conv (3, 12), ``recurrent`` (default (2, 8, 12)), float32)."""
    spec = graphkv.MambaSpec(shapes=((TAPS - 1, CHANNELS), recurrent), dtypes=("float32", "float32"))
    model = graphkv.ModelKV.from_specs("state", [(spec, "gdn")])
    plan = graphkv.compile(model, graphkv.Limits(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=160),
                           graphkv.Budget.kv_bytes("64KiB"))
    return Step(plan), allocate(plan).mamba_states("layers.0")


def run_steps(op: Callable[..., torch.Tensor], make_inputs: Callable[[int], tuple[torch.Tensor, ...]],
              recurrent: tuple[int, ...] = (HEADS, DK, DV),
              ) -> tuple[dict[str, list[torch.Tensor]], dict[str, list[tuple[torch.Tensor, ...]]], dict[str, int],
                         tuple[torch.Tensor, ...]]:
    """Run ``op(inputs, pages, rows)`` over :data:`STEPS` on a pool of ``recurrent`` states; per request its outputs
    and inputs per step, its state page, and the pool's state views."""
    step, states = state_pool(recurrent)
    outputs: dict[str, list[torch.Tensor]] = {}
    inputs: dict[str, list[tuple[torch.Tensor, ...]]] = {}
    pages: dict[str, int] = {}
    seen: dict[str, int] = {}
    for batch in STEPS:
        ids = tuple(r for r, _, _ in batch)
        qlens = tuple(n for _, n, _ in batch)
        seq = tuple(seen.get(r, 0) + n for r, n, _ in batch)
        new = tuple(((page,),) if page else None for _, _, page in batch)
        prepared = step.prepare(Batch(req_ids=ids, query_lens=qlens, seq_lens=seq, new_pages=new))
        num_tokens = prepared.num_tokens
        rows = PackedRows.from_context(step.context, num_tokens)
        packed = make_inputs(num_tokens)
        out = op(packed, step.context.state_indices[0], rows, states)
        start = 0
        for r, n, page in batch:
            outputs.setdefault(r, []).append(out[start:start + n])
            inputs.setdefault(r, []).append(tuple(t[start:start + n] for t in packed))
            start += n
            seen[r] = seen.get(r, 0) + n
            if page:
                pages[r] = page
    return outputs, inputs, pages, states


def whole(parts: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """A request's inputs over every step, concatenated per input."""
    return tuple(torch.cat(column) for column in zip(*parts))


def test_packed_conv_continues_each_request_from_its_state() -> None:
    """The packed causal conv equals one request's token-by-token conv, across chunks, state included."""
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(CHANNELS, TAPS, generator=gen), torch.randn(CHANNELS, generator=gen)

    def op(packed, pages, rows, states):
        return packed_causal_conv(packed[0], states[0], pages, rows, weight=weight, bias=bias)

    outputs, inputs, pages, states = run_steps(op, lambda n: (torch.randn(n, CHANNELS, generator=gen),))
    for r, parts in inputs.items():
        expected, final = causal_conv_ref(whole(parts)[0], torch.zeros(TAPS - 1, CHANNELS), weight, bias)
        torch.testing.assert_close(torch.cat(outputs[r]).double(), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states[0][pages[r]].double(), final, atol=1e-6, rtol=0)


def test_packed_gated_delta_continues_each_request_from_its_state() -> None:
    """The packed gated delta rule equals the per-token recurrence of every request, final state included; a state
    page holds the state transposed, [H, value_dim, key_dim] (the plan's layout, vLLM's), with key_dim != value_dim."""
    gen = torch.Generator().manual_seed(1)

    def make(n: int) -> tuple[torch.Tensor, ...]:
        q, k = (torch.nn.functional.normalize(torch.randn(n, HEADS, DK, generator=gen), dim=-1) for _ in range(2))
        return (q * DK ** -0.5, k, torch.randn(n, HEADS, DV, generator=gen),
                -torch.rand(n, HEADS, generator=gen) * 0.5, torch.rand(n, HEADS, generator=gen))

    def op(packed, pages, rows, states):
        return packed_gated_delta(*packed, states[1], pages, rows)

    outputs, inputs, pages, states = run_steps(op, make, recurrent=(HEADS, DV, DK))
    for r, parts in inputs.items():
        expected, final = gated_delta_ref(*whole(parts), torch.zeros(HEADS, DK, DV))
        torch.testing.assert_close(torch.cat(outputs[r]).double(), expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(states[1][pages[r]].double(), final.transpose(-1, -2), atol=1e-4, rtol=1e-4)


def test_packed_ssd_continues_each_request_from_its_state() -> None:
    """The packed Mamba2 scan equals the per-token recurrence of every request, final state included."""
    gen = torch.Generator().manual_seed(2)
    a = -torch.rand(HEADS, generator=gen) * 4

    def make(n: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(n, HEADS, DK, generator=gen), torch.rand(n, HEADS, generator=gen) * 0.2,
                torch.randn(n, HEADS, DV, generator=gen), torch.randn(n, HEADS, DV, generator=gen))

    def op(packed, pages, rows, states):
        x, dt, b, c = packed
        return packed_ssd(x, dt, a, b, c, states[1], pages, rows)

    outputs, inputs, pages, states = run_steps(op, make)
    for r, parts in inputs.items():
        x, dt, b, c = whole(parts)
        expected, final = ssd_ref(x, dt, a, b, c, torch.zeros(HEADS, DK, DV))
        torch.testing.assert_close(torch.cat(outputs[r]).double(), expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(states[1][pages[r]].double(), final, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_reqs", [1, 3])
def test_rows_mark_padding_tokens_and_empty_rows(num_reqs: int) -> None:
    """PackedRows of a decode step padded to its graph key: padding has row -1, in no row; later rows have no state."""
    step, _ = state_pool()
    fwd = capture(step.plan, static_inputs={"input_ids": step.input_ids})(lambda input_ids: input_ids)
    fwd.capture(progress=False, prepare=step.capture_context, rehearse=True)
    shape = step.prepare(Batch(req_ids=tuple(range(num_reqs)), query_lens=(1,) * num_reqs, seq_lens=(1,) * num_reqs,
                               new_pages=tuple(((1 + i,),) for i in range(num_reqs))), forward=fwd)
    padded = shape.num_tokens_padded
    assert (num_reqs, padded) in ((1, 1), (3, 4))  # decode keys 1, 2, 4: three requests run on four rows
    rows = PackedRows.from_context(step.context, padded)
    assert rows.row.tolist() == list(range(num_reqs)) + [-1] * (padded - num_reqs)
    assert rows.member.sum().item() == num_reqs and rows.causal.sum().item() == num_reqs
    assert rows.has_state.tolist() == [False] * 4 and rows.query_lens.tolist() == [1] * num_reqs + [0] * (4 - num_reqs)
