"""GreedySampler: each step's argmax in one of two persistent device buffers, read on the host later."""

from __future__ import annotations

import pytest
import torch

from graphkv import SpecError
from graphkv.models.greedy_sampler import GreedySampler


@pytest.mark.parametrize("rows, expected", [(range(3), [1, 0, 2]), ([0, 1, 2], [1, 0, 2]), ([4, 0, 2], [2, 1, 2])])
def test_samples_are_the_argmax_of_the_chosen_rows(rows, expected, device: str) -> None:
    """The first rows (a range or the same list) are read without an index; other rows through the index buffer
    (pinned on a GPU); either way each token is its row's argmax (ties to the first maximum, as torch.argmax)."""
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 5.0, 0.0], [0.0, 0.0, 9.0], [1.0, 0.0, 0.0], [0.0, 2.0, 7.0]],
                          device=device)
    sampled = GreedySampler(8).sample(logits, rows, owners=["a", "b", "c"])
    assert sampled.read() == expected and sampled.tokens.device.type == device
    assert sampled.owners == ["a", "b", "c"] and (sampled.ready is None) == (device == "cpu")  # an event on a GPU


@pytest.mark.parametrize("rows, owners, text", [
    ([], [], r"rows='0 rows, 0 owners': must be 1..4 rows \(max_rows\), one owner each"),
    (range(5), list(range(5)), r"rows='5 rows, 5 owners': must be 1..4 rows"),
    ([0, 1], ["a"], r"rows='2 rows, 1 owners'"),
    ([3, 1], ["a", "b"], r"rows=\[3\]: must be row indices of the logits \(0..2\); pass the rows"),
])
def test_rows_the_sampler_cannot_take_are_refused(rows, owners, text) -> None:
    """No rows, more than max_rows, an owner count that differs, a row past the logits: SpecError, nothing sampled."""
    with pytest.raises(SpecError, match=text):
        GreedySampler(4).sample(torch.zeros(3, 5), rows, owners=owners)


def test_two_buffers_in_turn_keep_the_last_sample_while_the_next_is_written(device: str) -> None:
    """Sample k+1 writes the other buffer than sample k, so sample k's device tokens (the next step's input) and
    host copy stay intact; sample k+2 reuses sample k's buffer."""
    sampler = GreedySampler(4)
    eye = torch.eye(4, device=device)
    first = sampler.sample(eye[[2, 0]], range(2), owners=[0, 1])
    second = sampler.sample(eye[[1, 3, 3]], range(3), owners=[0, 1, 2])
    assert first.read() == [2, 0] and first.tokens.tolist() == [2, 0]
    assert second.read() == [1, 3, 3]
    assert first.tokens.untyped_storage().data_ptr() != second.tokens.untyped_storage().data_ptr()
    third = sampler.sample(eye[[3]], range(1), owners=[0])
    assert third.tokens.untyped_storage().data_ptr() == first.tokens.untyped_storage().data_ptr()
    assert third.read() == [3] and second.read() == [1, 3, 3]
