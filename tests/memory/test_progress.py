"""The benchmark's progress bar: drawn in place on stderr when enabled, silent otherwise."""

from __future__ import annotations

import io

from graphkv.memory.progress import Progress


def test_the_bar_fills_in_place_and_ends_with_a_newline():
    """Two of four keys draw half a bar after a carriage return; done() draws it full and ends the line."""
    stream = io.StringIO()
    bar = Progress(True, stream)
    bar.start("capture")
    bar.update("capture", 2, 4)
    bar.done("capture")
    text = stream.getvalue()
    assert "\rcapture" in text and "[############............] 2/4" in text
    assert text.endswith("\n") and "[########################]" in text.splitlines()[-1]


def test_a_disabled_bar_writes_nothing():
    """--no-progress (or stderr not a terminal): nothing at all."""
    stream = io.StringIO()
    bar = Progress(False, stream)
    bar.start("pool")
    bar.update("pool", 1, 1)
    bar.done("pool")
    assert stream.getvalue() == ""
