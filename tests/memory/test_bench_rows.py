"""A GPU phase row carries reserved bytes beside allocated ones: in memory.json and as a note; a CPU row does not."""

from __future__ import annotations

from graphkv.memory.bench import PhaseRow


def test_a_gpu_row_writes_reserved_bytes_and_a_note():
    """predicted/measured_reserved_bytes go to memory.json and a one-line note with the difference."""
    row = PhaseRow(phase="static_buffers", predicted_bytes=43_520, measured_bytes=43_520, method="m",
                   predicted_reserved_bytes=2_097_152, measured_reserved_bytes=0)
    assert row.to_dict("tiny-hybrid") == {"model": "tiny-hybrid", "phase": "static_buffers", "predicted_bytes": 43_520,
                                          "measured_bytes": 43_520, "method": "m",
                                          "predicted_reserved_bytes": 2_097_152, "measured_reserved_bytes": 0}
    assert row.reserved_note == ("static_buffers reserved (torch.cuda.memory_reserved): 0 B measured, 2,097,152 B "
                                 "predicted (new allocator segments), -2,097,152 B")


def test_a_cpu_row_keeps_the_five_keys_and_no_note():
    """Without reserved bytes (a CPU, graph rows) the row is as before."""
    row = PhaseRow(phase="kv_pool", predicted_bytes=1, measured_bytes=1, method="live storages: torch tensors")
    assert set(row.to_dict("m")) == {"model", "phase", "predicted_bytes", "measured_bytes", "method"}
    assert row.reserved_note is None
