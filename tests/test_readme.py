"""README.md stays true: every code block runs as written and prints what the README shows.

- ``python`` blocks run in a fresh interpreter; when a ``text`` block follows, stdout must equal it.
- ``text`` blocks of ``$ graphkv …`` / ``$ python …`` sessions are run and compared line by line (the demo's
  plan-report placeholder and its timing line are the only lines not compared to the character).
- The quick-start ``bash`` block must be exactly what ``.ci/run`` runs on a clean clone, and the
  benchmark block is run and its deterministic columns compared with the table shown.
- Each block and command has its own time limit (:data:`BLOCK_TIMEOUT_S`): a hang fails that block, naming it,
  instead of stalling the file.
- A block whose shown output only a machine without CUDA prints (:data:`CPU_MACHINE_TEXT`) runs with the GPU
  hidden (``CUDA_VISIBLE_DEVICES=""``), so a GPU machine checks the same text; the GPU side of those commands is
  ``tests/test_cli.py::test_demo_serves_requests_and_says_what_capture_did[cuda]`` and ``tests/hf/test_demo_hf.py``.
- A block that serves a transformers model skips, saying why, under a transformers older than the hf extra's floor.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from graphkv.presets import list_presets

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)
DEMO_PLACEHOLDER = "  ...the plan report..."
BLOCK_TIMEOUT_S = 120  # each block and command; the slowest takes ~7 s on a 2-core CPU
CPU_MACHINE_TEXT = ("torch.cuda.is_available() is False", "\ndevice          cpu\n")


def skip_below_the_hf_floor(text: str) -> None:
    """Skip a block or command that serves a transformers model (graphkv.hf) when the installed transformers is
    older than the hf extra's floor."""
    if "graphkv.hf" in text or "--hf " in f"{text} ":
        from transformers_types import below_the_hf_floor

        reason = below_the_hf_floor()
        if reason is not None:
            pytest.skip(reason)


def shows_a_cpu_machine(output: str) -> bool:
    """Whether ``output`` (a block's shown output) is what only a machine without CUDA prints."""
    return any(text in f"\n{output}\n" for text in CPU_MACHINE_TEXT)


def run_block(argv: list[str], *, what: str, cpu_machine: bool) -> subprocess.CompletedProcess:
    """Run ``argv`` in the repository root within :data:`BLOCK_TIMEOUT_S` (a hang fails ``what``, with the output
    so far); ``cpu_machine`` hides any GPU from it, so it runs as on a machine without CUDA."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""} if cpu_machine else None
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=BLOCK_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired as expired:
        so_far = [text.decode(errors="replace") if isinstance(text, bytes) else text or ""
                  for text in (expired.stdout, expired.stderr)]
    pytest.fail(f"{what} did not finish within {BLOCK_TIMEOUT_S} s (GPU hidden: {cpu_machine}); stdout so far:\n"
                f"{so_far[0][-2000:]}\nstderr so far:\n{so_far[1][-2000:]}")


def blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block in README.md, in order."""
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer((ROOT / "README.md").read_text(encoding="utf-8"))]


def python_blocks() -> list[tuple[str, str | None]]:
    """Each python block with the text block right after it (its expected output), if any."""
    found = blocks()
    return [(code, found[i + 1][1] if i + 1 < len(found) and found[i + 1][0] == "text" else None)
            for i, (lang, code) in enumerate(found) if lang == "python"]


def sessions() -> list[list[tuple[str, list[str]]]]:
    """Text blocks that show `$ command` sessions: a list of (command, expected output lines)."""
    result = []
    for lang, text in blocks():
        if lang != "text" or not text.startswith("$ "):
            continue
        session: list[tuple[str, list[str]]] = []
        for line in text.rstrip("\n").split("\n"):
            if line.startswith("$ "):
                session.append((line[2:], []))
            else:
                session[-1][1].append(line)
        result.append(session)
    return result


def run_shell(command: str, *, cpu_machine: bool = False) -> tuple[int, str]:
    """Run a README command (simple forms, no pipes) in the repository root: its exit status and stdout (stderr
    when it failed); ``cpu_machine`` as in :func:`run_block`."""
    if command == "echo $?":
        raise AssertionError("handled by the caller")
    argv = shlex.split(command)
    if argv[0] == "graphkv":
        argv = [sys.executable, "-m", "graphkv.cli", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    proc = run_block(argv, what=f"`$ {command}`", cpu_machine=cpu_machine)
    return proc.returncode, proc.stdout if proc.returncode == 0 else proc.stderr  # what a terminal shows of each


def test_readme_has_the_blocks_this_test_checks() -> None:
    """The README has python blocks, $-sessions and the quick start (a vacuous pass would hide a rename)."""
    assert len(python_blocks()) >= 3
    assert len(sessions()) >= 5


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_block_runs_and_prints_what_is_shown(index: int) -> None:
    """The python block runs in a fresh interpreter and prints exactly the text block that follows it."""
    code, expected = python_blocks()[index]
    skip_below_the_hf_floor(code)
    proc = run_block([sys.executable, "-W", "ignore", "-c", code], what=f"README python block {index}",
                     cpu_machine=expected is not None and shows_a_cpu_machine(expected))
    assert proc.returncode == 0, proc.stderr[-3000:]
    if expected is not None:
        assert proc.stdout == expected


def _matches(actual: list[str], expected: list[str]) -> None:
    i = 0
    for want in expected:
        if want == DEMO_PLACEHOLDER:
            while i < len(actual) and not actual[i].startswith("device "):
                i += 1
            continue
        assert i < len(actual), f"missing line: {want!r}"
        if want.startswith("time "):
            assert actual[i].startswith("time ") and "tokens/s" in actual[i]
        else:
            assert actual[i] == want
        i += 1
    assert i == len(actual), f"unexpected lines: {actual[i:]}"


@pytest.mark.parametrize("index", range(len(sessions())))
def test_shell_session_prints_what_is_shown(index: int) -> None:
    """Each `$ graphkv …` session prints what the README shows (and `echo $?` the exit status)."""
    last_code = None
    for command, _ in sessions()[index]:
        skip_below_the_hf_floor(command)
    for command, expected in sessions()[index]:
        if command == "echo $?":
            assert expected == [str(last_code)]
            continue
        last_code, output = run_shell(command, cpu_machine=shows_a_cpu_machine("\n".join(expected)))
        _matches(output.rstrip("\n").split("\n"), expected)


def test_quick_start_is_what_ci_runs() -> None:
    """The README's first bash block is exactly the two commands .ci/run runs on a clean clone."""
    quick = next(text for lang, text in blocks() if lang == "bash")
    commands = [line for line in quick.splitlines() if line and not line.startswith("#")]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci_commands = [line.replace("python3 -m pip install -q", "pip install").replace("python3 -m pytest", "python -m pytest")
                   for line in ci.splitlines() if line and not line.startswith("#") and "torch" not in line
                   and not line.startswith(("set ", "cd "))]
    assert commands == ci_commands


def test_plan_speed_block_runs_and_matches_its_table(tmp_path: Path) -> None:
    """`python benchmarks/plan_speed.py` runs and prints the README's rows (timings aside)."""
    shown = next(text for lang, text in blocks() if lang == "text" and text.startswith("graphkv.compile"))
    proc = run_block([sys.executable, "benchmarks/plan_speed.py", "--out", str(tmp_path / "out.json")],
                     what="`python benchmarks/plan_speed.py`", cpu_machine=False)
    assert proc.returncode in (0, 1), proc.stderr  # 1: a plan above the 5 ms target, a timing this test leaves out
    assert "not planned" not in proc.stderr, proc.stderr

    def rows(text: str) -> list[list[str]]:
        """preset, variant, groups, num_blocks, max_model_len of each table row (timings dropped)."""
        return [line.split()[:-3] for line in text.splitlines() if line.split()[:1] and line.split()[0] in presets]

    presets = set(list_presets())
    assert rows(proc.stdout) == rows(shown) != []
