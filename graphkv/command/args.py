"""Argument parsing that ends every mistake in one line: ``graphkv: error: <what>; <fix>``, exit 2.

argparse prints a usage block before its error; :class:`OneLineParser` prints one line that names
the flag and points at ``--help``. The value types refuse empty text and out-of-range counts at
parse time, so nothing falls back silently to a default.
"""

from __future__ import annotations

import argparse
import re
import sys
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, NoReturn, Sequence

__all__ = ["MAX_COUNT", "OneLineParser", "count", "nonempty", "real_fraction"]

MAX_COUNT = (1 << 31) - 1  # page ids, positions and lengths live in int32 buffers
_NEGATIVE = re.compile(r"-[0-9.]")  # a value such as -1GiB or -.5, which argparse would take for a flag


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr with exit status 2."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        """As argparse, but a flag's value that starts like a negative number with a unit (``--kv-memory -1GiB``,
        which argparse takes for a flag and refuses as "expected one argument") is given to the flag, so the
        flag's own check names the value, its limit and the fix."""
        if args is None:
            args = sys.argv[1:]
        args, out, i = list(args), [], 0
        while i < len(args):
            action = self._option_string_actions.get(args[i])
            if (action is not None and action.nargs is None and i + 1 < len(args) and _NEGATIVE.match(args[i + 1])
                    and args[i + 1] not in self._option_string_actions):
                out.append(f"{args[i]}={args[i + 1]}")
                i += 2
                continue
            out.append(args[i])
            i += 1
        return super().parse_known_args(out, namespace)

    def error(self, message: str) -> NoReturn:
        """Print ``graphkv: error: <message>; e.g. --flag VALUE`` (no usage block) and exit 2."""
        message = message.removeprefix("argument ").replace("\n", " ")
        sys.stderr.write(f"graphkv: error: {message}{self._example(message)}; see `{self.prog} --help`\n")
        raise SystemExit(2)

    def _example(self, message: str) -> str:
        """``; e.g. --flag VALUE`` for the flag whose value was refused: its default, else its first choice
        (nothing for a flag without either: its own message says what it takes)."""
        flag = message.split(":", 1)[0].split("/")[-1]  # "--max-num-seqs: ..." (argparse writes "-h/--help")
        action = next((a for a in self._actions if flag in a.option_strings), None)
        if action is None or action.nargs == 0 or "not allowed with" in message:  # a conflict, not a value
            return ""
        if action.default not in (None, argparse.SUPPRESS) and not isinstance(action.default, bool):
            return f"; e.g. {flag} {action.default} (the default)"
        if action.choices:
            return f"; e.g. {flag} {next(iter(action.choices))}"
        return ""


def nonempty(what: str) -> Callable[[str], str]:
    """A type that refuses empty or blank text (``--preset ''`` must not mean the default)."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"is empty; give {what}")
        return text.strip()

    return parse


def count(minimum: int, *, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """A type for whole counts in ``[minimum, maximum]``; accepts ``8192``, ``8_192`` and ``1e9``."""
    def parse(text: str) -> int:
        raw = text.strip().replace("_", "")
        try:
            value = Decimal(raw) if raw and len(raw) <= 32 else None
        except InvalidOperation:
            value = None
        if value is None or not value.is_finite() or value != value.to_integral_value():
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number")
        if not minimum <= value <= maximum:  # compared as Decimal: 1e999999 never becomes an int
            raise argparse.ArgumentTypeError(f"{text[:40]!r} must be between {minimum} and {maximum}")
        return int(value)

    return parse


def real_fraction(text: str) -> float:
    """A type for a fraction in (0, 1] (``--utilization``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1], e.g. 0.9")
    return value
