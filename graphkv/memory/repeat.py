"""``graphkv bench memory --processes N``: the same measurement in N fresh processes, compared row by row.

Graph memory per capture key must not depend on the process that measured it (issue 21 asks for the
same bytes in three fresh processes). Each process runs ``graphkv bench memory`` with the same flags
and its own ``--out DIR/process-<i>``; their ``memory.json`` rows are compared by (model, phase) on
every measured byte count (measured, kept, peak, reserved). The first process's tables are printed in
full, then one line per process and the verdict: every measured row identical, or each row that
differs with its smallest and largest value. ``DIR/repeat.json`` keeps the comparison.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

import attrs

from graphkv.errors import MeasurementError, Problem

__all__ = ["COMPARED_FIELDS", "RepeatReport", "RowSpread", "compare_processes", "repeat_in_processes"]

COMPARED_FIELDS = ("measured_bytes", "measured_kept_bytes", "measured_peak_bytes", "measured_reserved_bytes")
MAX_PROCESSES = 10
_TIMEOUT_S = 3600  # one process: a GPU run that captures a preset's graphs at two depths takes minutes


@attrs.frozen(kw_only=True)
class RowSpread:
    """One (model, phase, field) whose value differs between processes: each process's value, in order."""

    model: str
    phase: str
    field: str
    values: tuple[int | None, ...]

    @property
    def line(self) -> str:
        """``model phase field: min..max B (spread)`` for the verdict."""
        seen = [v for v in self.values if v is not None]
        low, high = (min(seen), max(seen)) if seen else (0, 0)
        missing = sum(v is None for v in self.values)
        extra = f", not measured in {missing}" if missing else ""
        return f"{self.model} {self.phase} {self.field}: {low:,} .. {high:,} B ({high - low:+,} B{extra})"


@attrs.frozen(kw_only=True)
class RepeatReport:
    """The comparison of ``processes`` runs: how many (row, field) values were measured in every
    process and compared, and those that differ."""

    processes: int
    compared: int
    differing: tuple[RowSpread, ...]

    @property
    def identical(self) -> bool:
        """Whether every compared value was the same in every process."""
        return not self.differing

    @property
    def verdict(self) -> str:
        """One line: identical, or how many values differ."""
        if self.identical:
            return (f"repeated in {self.processes} fresh processes: all {self.compared} measured values identical "
                    f"({', '.join(COMPARED_FIELDS)} of every row)")
        return (f"repeated in {self.processes} fresh processes: {len(self.differing)} of {self.compared} measured "
                "values differ:")

    def to_dict(self) -> dict[str, Any]:
        """``repeat.json``'s content."""
        return {"processes": self.processes, "compared": self.compared, "identical": self.identical,
                "differing": [{**attrs.asdict(d), "values": list(d.values)} for d in self.differing]}


def compare_processes(rows_per_process: Sequence[Sequence[Mapping[str, Any]]]) -> RepeatReport:
    """Compare each process's ``memory.json`` rows by (model, phase) on :data:`COMPARED_FIELDS`. A value
    measured in some processes only (or a row missing from one) differs. Pure.

    >>> a = [{"model": "m", "phase": "kv_pool", "measured_bytes": 512}]
    >>> compare_processes([a, a, a]).identical
    True
    >>> b = [{"model": "m", "phase": "kv_pool", "measured_bytes": 1024}]
    >>> compare_processes([a, b, a]).differing[0].line
    'm kv_pool measured_bytes: 512 .. 1,024 B (+512 B)'
    """
    keyed = [{(r["model"], r["phase"]): r for r in rows} for rows in rows_per_process]
    order = list(dict.fromkeys(k for rows in keyed for k in rows))
    compared, differing = 0, []
    for model, phase in order:
        for field in COMPARED_FIELDS:
            values = tuple(rows.get((model, phase), {}).get(field) for rows in keyed)
            if all(v is None for v in values):
                continue
            compared += 1
            if len(set(values)) > 1:
                differing.append(RowSpread(model=model, phase=phase, field=field, values=values))
    return RepeatReport(processes=len(rows_per_process), compared=compared, differing=tuple(differing))


def repeat_in_processes(argv: Sequence[str], processes: int, *, out_dir: str | None, out: TextIO | None = None,
                        progress: bool = True) -> RepeatReport:
    """Run ``graphkv bench memory`` with ``argv`` (its flags, without ``--out`` and ``--processes``) in
    ``processes`` fresh Python processes, print the first one's tables and the comparison to ``out``
    (default stdout), and write ``repeat.json`` (with each process's files under ``process-<i>``) into
    ``out_dir`` when given. Raises :class:`MeasurementError` naming the process, its exit status and the
    end of its output when one fails."""
    out = out if out is not None else sys.stdout
    if not 2 <= processes <= MAX_PROCESSES:
        raise MeasurementError(Problem(field="--processes", value=processes, limit=f"must be 2..{MAX_PROCESSES} here",
                                       fix="pass --processes 3 to compare three fresh processes"))
    with tempfile.TemporaryDirectory(prefix="graphkv-repeat-") as scratch:
        root = Path(out_dir) if out_dir is not None else Path(scratch)
        rows_per_process = []
        for i in range(1, processes + 1):
            where = root / f"process-{i}"
            command = [sys.executable, "-m", "graphkv.cli", "bench", "memory", *argv, "--out", str(where),
                       "--no-progress"]
            if progress:
                sys.stderr.write(f"\rgraphkv: bench memory in fresh process {i}/{processes}".ljust(60))
                sys.stderr.flush()
            start = time.perf_counter()
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                raise MeasurementError(Problem(field="--processes", value=processes,
                                               limit=f"process {i} did not finish within {_TIMEOUT_S} s",
                                               fix="measure fewer models per run (--model)")) from None
            if done.returncode != 0:
                tail = " ".join((done.stderr or done.stdout).split())[-400:]
                raise MeasurementError(Problem(field="--processes", value=processes,
                                               limit=f"process {i} exited with status {done.returncode}: {tail}",
                                               fix="run the same command without --processes to see the error"))
            seconds = time.perf_counter() - start
            if i == 1:
                out.write(done.stdout)
            rows_per_process.append(json.loads((where / "memory.json").read_text(encoding="utf-8"))["rows"])
            print(f"process {i}: {len(rows_per_process[-1])} rows in {seconds:.1f} s"
                  + (f" ({where})" if out_dir is not None else ""), file=out)
        if progress:
            sys.stderr.write("\r".ljust(60) + "\r")
        report = compare_processes(rows_per_process)
        print(report.verdict, file=out)
        for spread in report.differing:
            print(f"  {spread.line}", file=out)
        if out_dir is not None:
            (root / "repeat.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
            print(f"wrote {root / 'repeat.json'}", file=out)
    return report
