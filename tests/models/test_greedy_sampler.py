"""GreedySampler: each step's argmax in one of two persistent device buffers, read on the host later."""

from __future__ import annotations

import pytest
import torch

from graphkv.models.greedy_sampler import GreedySampler


@pytest.mark.parametrize("rows", [range(3), [0, 1, 2], [4, 0, 2]])
def test_samples_are_the_argmax_of_the_chosen_rows(rows) -> None:
    """The first rows (a range or the same list) are read without an index; other rows through the index buffer;
    either way each token is its row's argmax (ties to the first maximum, as torch.argmax)."""
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 5.0, 0.0], [0.0, 0.0, 9.0], [1.0, 0.0, 0.0], [0.0, 2.0, 7.0]])
    sampled = GreedySampler(8).sample(logits, rows, owners=["a", "b", "c"])
    assert sampled.read() == [int(logits[r].argmax()) for r in rows]
    assert sampled.owners == ["a", "b", "c"] and sampled.ready is None  # a CPU: no event


def test_two_buffers_in_turn_keep_the_last_sample_while_the_next_is_written() -> None:
    """Sample k+1 writes the other buffer than sample k, so sample k's device tokens (the next step's input) and
    host copy stay intact; sample k+2 reuses sample k's buffer."""
    sampler = GreedySampler(4)
    first = sampler.sample(torch.eye(4)[[2, 0]], range(2), owners=[0, 1])
    second = sampler.sample(torch.eye(4)[[1, 3, 3]], range(3), owners=[0, 1, 2])
    assert first.read() == [2, 0] and first.tokens.tolist() == [2, 0]
    assert second.read() == [1, 3, 3]
    assert first.tokens.untyped_storage().data_ptr() != second.tokens.untyped_storage().data_ptr()
    third = sampler.sample(torch.eye(4)[[3]], range(1), owners=[0])
    assert third.tokens.untyped_storage().data_ptr() == first.tokens.untyped_storage().data_ptr()
    assert third.read() == [3] and second.read() == [1, 3, 3]
