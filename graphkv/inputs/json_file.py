"""Read a JSON file a user named: a regular file under a size cap, parsed with a bounded depth.

A FIFO would block ``open()`` until a writer appears and ``/dev/zero`` never ends, so the path is
checked with ``stat`` before it is opened, and the read stops one byte past the cap. Parsing is
linear in the file (``json``'s C parser; nothing is scanned with a backtracking pattern, which an
unterminated string of escapes made quadratic); a nesting deeper than :data:`MAX_JSON_DEPTH` is
refused after parsing (the parser's own ``RecursionError``, past about 1000 levels, is refused the
same way), so code that walks the result never recurses deeply. A key given twice in one object, at any depth,
is refused naming its path: ``json`` would keep the last value and drop the other silently, and a
hand-merged config that says ``"factor": 4`` and then ``"factor": 8`` has no single meaning.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from graphkv.errors import Problem, SpecError
from graphkv.printable import shortened
from graphkv.spec.budget import format_bytes

__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "read_json_file", "regular_file_size"]

MAX_JSON_BYTES = 64 << 20  # a config.json is a few KiB, a safetensors index a few MiB
MAX_JSON_DEPTH = 64  # configs nest 3-4 levels; the parser recurses once per level


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


def _too_deep(data: Any, max_depth: int) -> bool:
    """Whether parsed JSON ``data`` nests objects and arrays deeper than ``max_depth`` (the top level
    is depth 1); iterative, linear in the values, stops at the first level too deep."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def read_json_file(path: str, *, field: str, what: str = "a JSON file", max_bytes: int = MAX_JSON_BYTES,
                   max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse the JSON in ``path``; every failure is a SpecError on ``field`` (e.g. ``--hf-config``).

    Refuses non-regular files, files over ``max_bytes`` (64 MiB), text that is not UTF-8 or not
    JSON (with line and column), nesting deeper than ``max_depth`` (64 levels) and a key given
    twice in one object (naming its path, e.g. ``rope_scaling.factor``, and the values).
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
    too_deep = _refuse(field, path, f"nests more than {max_depth} levels deep; at most {max_depth} are read",
                       f"pass {what}, unmodified")
    duplicates = _Duplicates()
    try:
        parsed = json.loads(text, object_pairs_hook=duplicates.hook)
    except json.JSONDecodeError as e:
        raise _refuse(field, path, f"is not valid JSON ({e.msg}: line {e.lineno} column {e.colno})",
                      f"pass {what}, unmodified") from None
    except ValueError as e:  # e.g. an integer longer than Python's 4300-digit conversion limit
        raise _refuse(field, path, f"holds a value that cannot be parsed ({e})", f"pass {what}, unmodified") from None
    except RecursionError:  # deeper than the parser's recursion limit (about 1000 levels)
        raise too_deep from None
    if _too_deep(parsed, max_depth):
        raise too_deep
    if duplicates.found:
        key, values = duplicates.first(parsed)
        raise _refuse(field, path, f"gives {key} {len(values)} times (values {_shown(values)}); JSON would keep "
                                   "only the last, silently",
                      f"delete all but one {key} from the file"
                      + ("" if all(v == values[0] for v in values) else " (keep the intended value)"))
    return parsed


def _shown(values: list[Any]) -> str:
    """``values`` as ``a, b and c``, each value cut to a readable length."""
    words = [shortened(repr(v), 40) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


class _Duplicates:
    """The ``object_pairs_hook`` that builds each JSON object as ``json`` does (the last value of a
    key wins) and remembers the objects that gave a key more than once, to name its path after."""

    def __init__(self) -> None:
        self.found: dict[int, tuple[dict[str, Any], str, list[Any]]] = {}  # id(object) -> (object, key, values)

    def hook(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) < len(pairs):
            seen: dict[str, list[Any]] = {}
            for key, value in pairs:
                seen.setdefault(key, []).append(value)
            key = next(k for k, values in seen.items() if len(values) > 1)
            self.found[id(obj)] = (obj, key, seen[key])  # holding obj keeps its id unique
        return obj

    def first(self, data: Any) -> tuple[str, list[Any]]:
        """``(key, values)`` of the first object, in document order, that repeats a key; ``key`` is
        its path from the top (``num_hidden_layers``, ``rope_scaling.factor``, ``layers[2].attn.dim``)."""
        stack: list[tuple[Any, str]] = [(data, "")]
        while stack:
            node, path = stack.pop()
            if isinstance(node, dict):
                if id(node) in self.found:
                    _, key, values = self.found[id(node)]
                    return (f"{path}.{key}" if path else key), values
                children = [(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()]
            elif isinstance(node, list):
                children = [(v, f"{path}[{i}]") for i, v in enumerate(node)]
            else:
                continue
            stack.extend(reversed(children))
        raise AssertionError("a duplicated key was recorded in an object the parsed JSON does not hold")
