"""A one-line progress bar on stderr for the benchmark's long phases (pool allocation, capture).

Written only when enabled (``graphkv bench memory`` enables it when stderr is a terminal;
``--no-progress`` turns it off), redrawn in place with ``\\r`` and ended with a newline.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]

_WIDTH = 24


class Progress:
    """``Progress(enabled)``; :meth:`update` per item, :meth:`done` at the end of a phase."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self._stream = stream if stream is not None else sys.stderr
        self._start = time.perf_counter()
        self._last = 0

    def start(self, label: str) -> None:
        """Begin a phase (shows the label with an empty bar)."""
        self._start = time.perf_counter()
        self._draw(label, 0, 1)

    def update(self, label: str, done: int, total: int) -> None:
        """``done`` of ``total`` items of the phase ``label``."""
        self._draw(label, done, total)

    def done(self, label: str) -> None:
        """End the phase: a full bar, the seconds it took and a newline."""
        if self.enabled:
            line = f"\r{label:<28} [{'#' * _WIDTH}] {time.perf_counter() - self._start:6.1f} s"
            self._stream.write(line.ljust(self._last) + "\n")
            self._stream.flush()
            self._last = 0

    def _draw(self, label: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        filled = _WIDTH * done // max(total, 1)
        line = f"\r{label:<28} [{'#' * filled}{'.' * (_WIDTH - filled)}] {done}/{total}"
        self._stream.write(line.ljust(self._last))
        self._stream.flush()
        self._last = len(line)
