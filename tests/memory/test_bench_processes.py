"""`graphkv bench memory --processes N`: the measurement repeated in fresh processes, compared row by row."""

from __future__ import annotations

import doctest
import json

import pytest

import graphkv.memory.repeat as repeat
from graphkv.cli import main
from graphkv.errors import MeasurementError
from graphkv.memory.repeat import compare_processes, repeat_in_processes


def _row(phase: str, **measured: int | None) -> dict:
    return {"model": "tiny-hybrid", "phase": phase, "predicted_bytes": 0, "method": "m", **measured}


def test_identical_processes_compare_every_measured_field() -> None:
    rows = [_row("kv_pool", measured_bytes=2_097_152), _row("graph_pool decode(8)", measured_bytes=49_664,
                                                          measured_kept_bytes=4_096, measured_peak_bytes=49_664,
                                                          measured_reserved_bytes=2 << 20),
            _row("graph_pool decode(1)", measured_bytes=None)]  # not measured anywhere: not compared
    report = compare_processes([rows, rows, rows])
    assert (report.processes, report.compared, report.identical) == (3, 5, True)
    assert report.verdict.startswith("repeated in 3 fresh processes: all 5 measured values identical")


def test_a_value_that_differs_or_is_missing_in_one_process_is_listed_with_its_range() -> None:
    first = [_row("graph_pool decode(8)", measured_bytes=49_664, measured_kept_bytes=4_096)]
    second = [_row("graph_pool decode(8)", measured_bytes=51_712, measured_kept_bytes=4_096)]
    third = [_row("graph_pool decode(8)", measured_bytes=None, measured_kept_bytes=4_096)]
    report = compare_processes([first, second, third])
    assert report.compared == 2 and not report.identical
    (spread,) = report.differing
    assert spread.values == (49_664, 51_712, None)
    assert spread.line == "tiny-hybrid graph_pool decode(8) measured_bytes: 49,664 .. 51,712 B (+2,048 B, not " \
                          "measured in 1)"
    assert report.verdict == "repeated in 3 fresh processes: 1 of 2 measured values differ:"
    assert report.to_dict()["differing"][0]["values"] == [49_664, 51_712, None]


def test_the_docstring_examples_pass() -> None:
    result = doctest.testmod(repeat)
    assert result.attempted > 0 and result.failed == 0


def test_two_fresh_processes_measure_the_demo_identically_on_a_cpu(tmp_path, capsys) -> None:
    """The CLI: the first process's table, a line per process, the verdict, repeat.json and each process's files."""
    out = tmp_path / "rep"
    assert main(["bench", "memory", "--model", "demo", "--device", "cpu", "--processes", "2", "--out", str(out),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "  kv_pool              2,097,152 B  2,097,152 B  +0.00%  live storages: torch tensors" in text
    assert text.count("kv_pool ") == 1  # the first process's tables only
    assert "process 2: 8 rows in " in text and str(out / "process-2") in text
    assert ("repeated in 2 fresh processes: all 4 measured values identical (measured_bytes, measured_kept_bytes, "
            "measured_peak_bytes, measured_reserved_bytes of every row)") in text
    assert json.loads((out / "repeat.json").read_text()) == {"processes": 2, "compared": 4, "identical": True,
                                                               "differing": []}
    assert (out / "process-1" / "memory.json").exists() and (out / "process-2" / "memory.json").exists()


def test_a_failing_process_is_one_error_naming_it_and_its_output() -> None:
    with pytest.raises(MeasurementError) as info:
        repeat_in_processes(["--model", "gpt-5"], 2, out_dir=None, progress=False)
    message = str(info.value)
    assert message.startswith("--processes=2: process 1 exited with status 2: graphkv: error: --model='gpt-5'")
    assert "run the same command without --processes to see the error" in message


@pytest.mark.parametrize("argv, message", [
    (["--processes", "11"], "--processes: '11' must be between 1 and 10"),
    (["--processes", "two"], "--processes: 'two' is not a whole number"),
])
def test_bad_process_counts_are_one_line_errors(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "memory", *argv])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"graphkv: error: {message}")
