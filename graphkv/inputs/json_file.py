"""Read a JSON file a user named: a regular file under a size cap, parsed with a bounded depth.

A FIFO would block ``open()`` until a writer appears and ``/dev/zero`` never ends, so the path is
checked with ``stat`` before it is opened, and the read stops one byte past the cap. The JSON
parser recurses once per nesting level; a nesting deeper than :data:`MAX_JSON_DEPTH` is refused
before parsing, so no ``RecursionError`` can escape.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

from graphkv.errors import Problem, SpecError
from graphkv.spec.budget import format_bytes

__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "read_json_file", "regular_file_size"]

MAX_JSON_BYTES = 64 << 20  # a config.json is a few KiB, a safetensors index a few MiB
MAX_JSON_DEPTH = 64  # configs nest 3-4 levels; the parser recurses once per level
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _refuse(field: str, path: str, limit: str, fix: str) -> SpecError:
    return SpecError(Problem(field=field, value=path, limit=limit, fix=fix))


def regular_file_size(path: str, *, field: str, what: str = "a JSON file") -> int:
    """The size of ``path`` after checking it names a regular file (not a FIFO, device or directory)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise _refuse(field, path, "no such file", f"pass the path of {what}") from None
    except (OSError, ValueError) as e:  # permission denied, name too long, embedded NUL, ...
        raise _refuse(field, path, f"cannot be read ({type(e).__name__}: {e})", f"pass a readable path of {what}") from None
    if stat.S_ISDIR(info.st_mode):
        raise _refuse(field, path, "is a directory", f"pass {what}")
    if not stat.S_ISREG(info.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a device or special file"
        raise _refuse(field, path, f"is {kind}, not a regular file (reading it could block or never end)",
                      f"pass a regular file: {what}")
    return info.st_size


def _too_deep(text: str, max_depth: int) -> bool:
    """Whether brackets outside strings nest deeper than ``max_depth`` (stops at the first level too deep)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = 0
    for ch in brackets:
        depth += 1 if ch in "[{" else -1
        if depth > max_depth:
            return True
    return False


def read_json_file(path: str, *, field: str, what: str = "a JSON file", max_bytes: int = MAX_JSON_BYTES,
                   max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse the JSON in ``path``; every failure is a SpecError on ``field`` (e.g. ``--hf-config``).

    Refuses non-regular files, files over ``max_bytes`` (64 MiB), text that is not UTF-8 or not
    JSON (with line and column), and nesting deeper than ``max_depth`` (64 levels).
    """
    size = regular_file_size(path, field=field, what=what)
    if size > max_bytes:
        raise _refuse(field, path, f"is {format_bytes(size)}, over the {format_bytes(max_bytes)} cap for {what}",
                      f"pass {what}, not a weights or data file")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise _refuse(field, path, f"cannot be read ({type(e).__name__}: {e})", f"pass a readable {what}") from None
    if len(data) > max_bytes:  # grew since stat
        raise _refuse(field, path, f"is over the {format_bytes(max_bytes)} cap for {what}", f"pass {what}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _refuse(field, path, f"is not UTF-8 text (byte {e.start})", f"pass {what} (UTF-8 JSON)") from None
    if _too_deep(text, max_depth):
        raise _refuse(field, path, f"nests more than {max_depth} levels deep; at most {max_depth} are read",
                      f"pass {what}, unmodified")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _refuse(field, path, f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})",
                      f"pass {what}, unmodified") from None
    except ValueError as e:  # e.g. an integer longer than Python's 4300-digit conversion limit
        raise _refuse(field, path, f"holds a value that cannot be parsed ({e})", f"pass {what}, unmodified") from None
    except RecursionError:  # unreachable after the depth check; kept so no parse error can escape raw
        raise _refuse(field, path, "nests too deeply to parse", f"pass {what}, unmodified") from None
