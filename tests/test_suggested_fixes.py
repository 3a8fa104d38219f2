"""Every fix an error suggests works: applied, the input plans (or builds), or its next error names another field.

The cases are tests/test_errors_catalogue.py's, all of them. A Python API case builds ``case.fixed()``, the input
with the suggested fix applied. A command-line case is run, and the advice its error line actually prints is read
with a small grammar (:func:`advice`) and applied to the command, each alternative on its own: the test uses the
advice printed, not a hand-written copy. Where the advice is not a flag value (a file to replace, a config field to
correct) the case's ``fixed`` command runs instead; a case with ``fixed`` also runs it, so what the catalogue claims
holds too. A case with neither fails with a message asking for ``fixed``, unless :data:`NO_FIX` lists it with the
reason. Commands run in this process through :func:`graphkv.cli.main` (tests/test_errors_catalogue.py already runs
each in a fresh interpreter).
"""

from __future__ import annotations

import contextlib
import io
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs
import pytest

from graphkv import GraphkvError
from graphkv.cli import main
from test_errors_catalogue import CASES, CLI_CASES, Case, CliCase, _prepare

# Cases whose suggested fix no test can apply, each with the reason. Keep it short: a fix that is "pass a
# regular file" is applied by writing a valid one (``fixed``), not listed here.
NO_FIX: Mapping[str, str] = {}

_FLAG = r"--[a-z][a-z0-9-]*"
_SIZE = r"\d+(?:\.\d+)?\s?(?:B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b"
_WORD = r"[\w.+-]*\w(?:,[\w.+-]*\w)*"  # 16, H200, cpu, 0.96, 40GiB, 16,16,16 (no trailing dot or comma)
_VALUE = rf"(?:{_SIZE}|{_WORD})"
_VERBS = r"(?:drop|use|lower|raise|add|leave|give|pass|set|list|run|check|pick|choose|no)\b"
_CHOICES = rf"{_VALUE}(?:,\s+{_VALUE})*(?:,?\s+or\s+(?!{_VERBS}){_VALUE})?"
_NOT_VALUES = frozenset({"a", "an", "the", "it", "to", "with", "and", "or", "for", "only", "at"})
# One pattern per form of advice; each match is an edit of the command (no value: drop the flag). A value that is
# all capitals (SIZE, NAME) is a placeholder, not advice to apply.
_ADVICE = re.compile("|".join((
    rf"\b(?:use|add|set)\s+(?P<set>{_FLAG})\s+(?:to\s+)?(?:(?:<=|>=)\s*)?(?P<choices>{_CHOICES})",
    rf"\b(?:lower|raise)\s+(?P<bound>{_FLAG})\s+to\s+(?:<=|>=)\s*(?P<limit>{_VALUE})",
    rf"(?<![\w-])(?P<cmp>{_FLAG})\s+(?:<=|>=)\s+(?P<cmp_value>{_VALUE})",
    rf"\be\.g\.\s+(?P<eg>{_FLAG})\s+(?P<eg_value>{_VALUE})",
    r"\be\.g\.\s+(?P<bare>\d[\w.,]*\w|\d)",
    rf"\b(?:drop|remove)\s+(?P<drop>{_FLAG})",
    rf"\bleave\s+(?P<unset>{_FLAG}|it)\s+unset",
)))


@attrs.frozen
class Edit:
    """Set ``flag`` to one of ``values`` (the one nearest the command's own), or drop it (``values`` empty)."""

    flag: str
    values: tuple[str, ...]


def _field(line: str) -> str:
    """The flag (or field) an error line names first: ``--tp`` of ``graphkv: error: --tp=3: ...``."""
    match = re.match(r"graphkv: error: ([^\s=:]+)", line)
    assert match, f"not a graphkv error line: {line!r}"
    return match.group(1)


def advice(line: str) -> list[tuple[Edit, ...]]:
    """The alternatives an error line offers, each the edits of the command it asks for. Alternatives are the
    clauses between ``;`` and ``, or``; an ``e.g.`` without a flag sets the flag the clause last named (else the
    error's own), and within a clause a later edit of a flag (an example) replaces an earlier one (a bound)."""
    body = line.removeprefix("graphkv: error: ")
    own = _field(line)
    alternatives = []
    for clause in re.split(r";\s+|,\s+or\s+", body):
        edits: dict[str, Edit] = {}
        for m in _ADVICE.finditer(clause):
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
            if "set" in groups:
                flag, values = groups["set"], tuple(re.split(r",\s+|,?\s+or\s+", groups["choices"]))
            elif "bound" in groups:
                flag, values = groups["bound"], (groups["limit"],)
            elif "cmp" in groups:
                flag, values = groups["cmp"], (groups["cmp_value"],)
            elif "eg" in groups:
                flag, values = groups["eg"], (groups["eg_value"],)
            elif "bare" in groups:
                named = re.findall(_FLAG, clause[:m.start()])
                flag, values = (named[-1] if named else own), (groups["bare"],)
            elif "drop" in groups:
                flag, values = groups["drop"], ()
            else:
                flag, values = (own if groups["unset"] == "it" else groups["unset"]), ()
            if any(re.fullmatch("[A-Z]+", v) or v.lower() in _NOT_VALUES for v in values):  # SIZE, NAME: no value
                continue
            edits.pop(flag, None)
            edits[flag] = Edit(flag, values)
        if edits:
            alternatives.append(tuple(edits.values()))
    return alternatives


def _number(text: str) -> Decimal | None:
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def _apply(argv: Sequence[str], edits: Sequence[Edit]) -> tuple[str, ...]:
    """``argv`` with each edit applied: the flag's value replaced (or the flag added, or dropped)."""
    args = list(argv)
    for edit in edits:
        at = next((i for i, a in enumerate(args) if a == edit.flag or a.startswith(edit.flag + "=")), len(args))
        typed = None
        if at < len(args):  # take the flag out, keeping what it was set to (a switch has no value)
            joined, switch = "=" in args[at], at + 1 == len(args) or args[at + 1].startswith("--")
            typed = args[at].partition("=")[2] if joined else None if switch else args[at + 1]
            del args[at:at + (1 if joined or switch else 2)]
        if not edit.values:
            continue
        value, here = edit.values[0], _number(typed) if typed is not None else None
        if here is not None and all(_number(v) is not None for v in edit.values):
            value = min(edit.values, key=lambda v: abs(_number(v) - here))  # ties: the first listed
        args[at:at] = [edit.flag, value]
    return tuple(args)


def _run(argv: Sequence[str]) -> tuple[int, str]:
    """Run ``graphkv argv`` here: the exit status and its last error line ("" when none)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code
    lines = [line for line in err.getvalue().splitlines() if line.startswith("graphkv: error: ")]
    return code, (lines[-1] if lines else "")


def _files(argv: Sequence[str], tmp_path: Path) -> tuple[str, ...]:
    """``argv`` with each ``config:<json>`` / ``raw:<text>`` item written to a file and replaced by its path."""
    args = []
    for i, arg in enumerate(argv):
        kind, _, text = arg.partition(":")
        if kind in ("config", "raw") and text:
            path = tmp_path / f"fixed-{i}" / "config.json"
            path.parent.mkdir()
            path.write_text(text)
            arg = str(path)
        args.append(arg)
    return tuple(args)


def _moves_on(argv: Sequence[str], field: str, how: str, edited: Sequence[str] = ()) -> None:
    """``graphkv argv`` succeeds, or ends in one error line naming another field than ``field`` and than the
    ``edited`` flags (a value the advice gave that is refused in turn is advice that does not work)."""
    code, line = _run(argv)
    if code == 0:
        return
    assert code == 2 and line, f"{how}: `graphkv {' '.join(argv)}` exited {code} without an error line"
    assert _field(line) not in (field, *edited), (f"{how}: `graphkv {' '.join(argv)}` fails on {_field(line)}, so "
                                                  f"the advice does not work: {line}")


def _unwrap(case: Any) -> Any:
    return case.values[0] if hasattr(case, "values") else case


def _marks(case: Any) -> Any:
    return case.marks if hasattr(case, "marks") else ()


CLI_PARAMS = [pytest.param(_unwrap(c), id=_unwrap(c).id, marks=_marks(c)) for c in CLI_CASES]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_api_fix_builds_or_fails_on_another_field(case: Case):
    """The input with the suggested fix applied builds (or plans), or its error names another field."""
    with pytest.raises(GraphkvError) as info:
        case.build()
    field = next(p for p in info.value.problems if case.field in p.field).field
    if case.fixed is None:
        assert case.id in NO_FIX, (f"{case.id}: add fixed=lambda: <the input with the fix the message suggests "
                                   f"applied> to the case in tests/test_errors_catalogue.py ({info.value})")
        return
    try:
        case.fixed()
    except GraphkvError as error:
        assert field not in [p.field for p in error.problems], (
            f"{case.id}: the fix suggested by {info.value} still fails on {field}: {error}")


@pytest.mark.parametrize("case", CLI_PARAMS)
def test_cli_advice_applied_succeeds_or_fails_on_another_flag(case: CliCase, tmp_path: Path):
    """Each alternative the error line advises, applied to the command (and the case's ``fixed`` command), plans
    or ends in an error naming another flag."""
    argv = _prepare(case, tmp_path)
    code, line = _run(argv)
    assert code == 2 and line, f"{case.id}: `graphkv {' '.join(argv)}` did not fail"
    field = _field(line)
    alternatives = advice(line)
    applied = {_apply(argv, edits) for edits in alternatives}
    for edits in alternatives:
        _moves_on(_apply(argv, edits), field, f"{case.id}: applying {edits} from {line!r}", [e.flag for e in edits])
    if case.fixed is not None:
        fixed_dir = tmp_path / "fixed"
        fixed_dir.mkdir()
        fixed = _files(_prepare(attrs.evolve(case, argv=case.fixed), fixed_dir), fixed_dir)
        if fixed not in applied:  # the same command as an applied advice already ran
            _moves_on(fixed, field, f"{case.id}: the case's fixed command")
    elif not alternatives:
        assert case.id in NO_FIX, (f"{case.id}: the error names no flag value to apply ({line!r}); add fixed=(<the "
                                   "command with the fix applied>) to the case in tests/test_errors_catalogue.py")


def test_no_fix_lists_only_catalogue_cases_with_a_reason():
    """The allow-list of fixes no test applies is small, names catalogue cases and says why for each."""
    ids = {c.id for c in CASES} | {p.values[0].id for p in CLI_PARAMS}
    assert len(NO_FIX) <= 5
    for case_id, reason in NO_FIX.items():
        assert case_id in ids and len(reason.split()) >= 5, case_id


@pytest.mark.parametrize("line, expected", [
    ("graphkv: error: --tp=3: does not split; use --tp 1, 2, 4, 8 or 16",
     [(Edit("--tp", ("1", "2", "4", "8", "16")),)]),
    ("graphkv: error: --max-model-len=16384: too long; lower --max-model-len to <= 496, or raise "
     "--num-blocks-override to >= 1025", [(Edit("--max-model-len", ("496",)),), (Edit("--num-blocks-override",
                                                                                      ("1025",)),)]),
    ("graphkv: error: --kv-memory='1.5': too small; raise --kv-memory to >= 25.50 MiB",
     [(Edit("--kv-memory", ("25.50 MiB",)),)]),
    ("graphkv: error: --pp-partition='1,2,3': lists 3 stages but --pp is 1; add --pp 3 with counts summing to the "
     "model's 48 layers, e.g. --pp-partition 16,16,16, or drop --pp-partition",
     [(Edit("--pp", ("3",)), Edit("--pp-partition", ("16,16,16",))), (Edit("--pp-partition", ()),)]),
    ("graphkv: error: --activation-memory='2GiB': only applies with --gpu; add --gpu NAME or drop --activation-memory",
     [(Edit("--activation-memory", ()),)]),
    ("graphkv: error: --utilization: '1.5' must be in (0, 1], e.g. 0.9; see `graphkv plan --help`",
     [(Edit("--utilization", ("0.9",)),)]),
    ("graphkv: error: --kv-memory='0': is zero; give --kv-memory a size above 0, e.g. 40GiB",
     [(Edit("--kv-memory", ("40GiB",)),)]),
    ("graphkv: error: --pp=1000: too many; use --pp <= 48", [(Edit("--pp", ("48",)),)]),
    ("graphkv: error: --gpu='H100': weights; use --gpu H200, or --tp >= 3", [(Edit("--gpu", ("H200",)),),
                                                                            (Edit("--tp", ("3",)),)]),
    ("graphkv: error: --device='cuda': no CUDA; use --device cpu (or auto), or run on a machine with a CUDA GPU",
     [(Edit("--device", ("cpu",)),)]),
    ("graphkv: error: --kv-memory='1TiB': too big; lower --kv-memory to <= 2.00 GiB, e.g. 2MiB, or leave it unset",
     [(Edit("--kv-memory", ("2MiB",)),), (Edit("--kv-memory", ()),)]),
    ("graphkv: error: --hf-config='x': no such file; pass the path of a Hugging Face config.json", []),
])
def test_advice_grammar_reads_each_form(line: str, expected: list):
    """The advice grammar reads each form the errors use, and nothing from a fix that is not a flag value."""
    assert advice(line) == expected


def test_apply_takes_the_choice_nearest_the_typed_value():
    """A list of valid values applies the one nearest what was typed; a bound replaces the flag's value."""
    assert _apply(("plan", "--tp", "3"), [Edit("--tp", ("1", "2", "4", "8"))]) == ("plan", "--tp", "2")
    assert _apply(("plan", "--tp", "6"), [Edit("--tp", ("1", "2", "4", "8"))]) == ("plan", "--tp", "4")
    assert _apply(("plan",), [Edit("--pp", ("3",)), Edit("--pp-partition", ("16,16,16",))]) == (
        "plan", "--pp", "3", "--pp-partition", "16,16,16")
    assert _apply(("plan", "--pp-partition", "1,2"), [Edit("--pp-partition", ())]) == ("plan",)
    assert _apply(("plan", "--json", "--tp", "3"), [Edit("--json", ())]) == ("plan", "--tp", "3")
