"""One integer policy: numpy integers are taken as Python ints wherever an int is, bools of every kind never are."""

from __future__ import annotations

import pytest

from graphkv import Budget, FullAttentionSpec, Limits, MambaSpec, SlidingWindowSpec, SpecError
from graphkv.spec._checks import as_int, count_arg, is_bool, whole_int

np = pytest.importorskip("numpy", reason="numpy is an optional dependency (graphkv[runtime]); its types are checked "
                                         "where it is installed")


def test_is_bool_knows_every_kind_of_bool():
    """Python, numpy (scalar and array) and torch bools are bools; ints, numpy ints and floats are not."""
    assert all(map(is_bool, (True, np.True_, np.array([True, False]), np.bool_(False))))
    assert not any(map(is_bool, (1, np.int64(1), np.array([1]), 1.0, "True", None)))
    torch = pytest.importorskip("torch", reason="torch is optional; its bool tensors are checked where installed")
    assert is_bool(torch.tensor(True)) and is_bool(torch.tensor([True])) and not is_bool(torch.tensor(1))


def test_whole_int_takes_integers_of_any_kind_but_bools():
    """numpy ints and 0-d integer arrays become Python ints; bools, floats, strings and 1-d arrays do not."""
    for value in (3, np.int64(3), np.int32(3), np.uint8(3), np.array(3)):
        assert whole_int(value) == 3 and type(whole_int(value)) is int
    for value in (True, np.True_, 3.0, "3", None, np.array([3])):
        assert whole_int(value) is None
    assert as_int(np.int16(7)) == 7 and type(as_int(np.int16(7))) is int and as_int(2.5) == 2.5


def test_numpy_ints_are_accepted_and_stored_as_python_ints():
    """Limits(max_num_seqs=np.int32(8)) was refused while plan methods took numpy ints; now every descriptor takes
    them and stores Python ints (which JSON and arithmetic handle as ints)."""
    limits = Limits(max_model_len=np.int64(4096), max_num_seqs=np.int32(8), block_size=np.int64(16))
    assert (limits.max_model_len, limits.max_num_seqs, limits.block_size) == (4096, 8, 16)
    assert all(type(v) is int for v in (limits.max_model_len, limits.max_num_seqs, limits.block_size))
    spec = SlidingWindowSpec(num_kv_heads=np.int64(8), head_size=np.int32(128), window=np.int64(64))
    assert spec == SlidingWindowSpec(num_kv_heads=8, head_size=128, window=64)
    assert type(MambaSpec(shapes=((4, 16, 16),), dtypes=("float32",), chunk_size=np.int64(128)).chunk_size) is int
    budget = Budget.for_gpu("H100", utilization=np.float32(0.9), weights_bytes=np.int64(1 << 30))
    assert budget.utilization == 0.9 and type(budget.weights_bytes) is int
    assert count_arg("n", np.uint16(5), 1, "pass n") == 5


@pytest.mark.parametrize("build", [lambda: Limits(max_num_seqs=np.True_), lambda: Limits(block_size=np.False_),
                                   lambda: FullAttentionSpec(num_kv_heads=np.True_, head_size=128),
                                   lambda: Budget.kv_bytes(np.True_), lambda: count_arg("n", np.True_, 0, "pass n")],
                         ids=["max_num_seqs", "block_size", "num_kv_heads", "kv_bytes", "count_arg"])
def test_numpy_bools_are_refused(build):
    """A numpy bool is refused as a count wherever a Python bool is (numpy 2 names its type "bool", not "bool_")."""
    with pytest.raises(SpecError, match=r"bool"):
        build()
