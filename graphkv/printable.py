"""Text from a file, made safe to print: control and bidi characters shown as escapes.

A config.json can hold any character. Printed raw, ``"llama\\x1b[31m"`` recolours the terminal,
``"\\u202e"`` reverses the text after it (so a report can say what it does not) and a lone
surrogate (``"\\ud800"``, valid JSON) makes ``print`` raise. Every character Python does not
call printable (``str.isprintable``: C0/C1 controls, DEL, format characters such as the bidi
overrides and zero-width marks, line and paragraph separators, surrogates, unassigned code
points) is shown the way ``repr`` shows it: ``\\n``, ``\\x1b``, ``\\u202e``, ``\\U000e0001``. Printable
text, non-ASCII letters included, is returned as it is.
"""

from __future__ import annotations

__all__ = ["printable", "shortened"]


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped, so it prints as one line that cannot
    move the cursor, change colours or reorder what follows (a newline becomes ``\\n``).

    >>> printable("llama\\x1b[31m")
    'llama\\\\x1b[31m'
    >>> printable("caf\\u00e9")
    'café'
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def shortened(text: str, width: int = 60) -> str:
    """``text`` cut to at most ``width`` characters, ``...`` marking a cut (a value quoted in an
    error message stays one readable line).

    >>> shortened("x" * 70, 10)
    'xxxxxxx...'
    """
    return text if len(text) <= width else text[:width - 3] + "..."
