"""What :meth:`~graphkv.runtime.capture.graphs.CapturedForward.capture` did, and why a forward runs eagerly."""

from __future__ import annotations

import sys

import attrs

from graphkv.runtime.capture.keys import GraphKey

__all__ = ["CPU_UNAVAILABLE", "MODE_NONE", "CaptureReport", "shown"]

CPU_UNAVAILABLE = "CUDA graphs unavailable: torch.cuda.is_available() is False (CPU build / no GPU); running eagerly"
MODE_NONE = "CUDA graphs disabled: the plan's cudagraph mode is NONE; running eagerly"


@attrs.frozen(kw_only=True)
class CaptureReport:
    """What :meth:`CapturedForward.capture` did: keys captured (largest first) — or, with
    ``rehearsed``, warmed up and replayed eagerly on padded buffers — seconds taken, and why
    nothing or not everything was captured."""

    keys: tuple[GraphKey, ...]
    seconds: float
    unavailable_reason: str | None = None
    skipped: tuple[str, ...] = ()
    rehearsed: bool = False
    warm_up_seconds: float = 0.0
    """Of ``seconds``, warming every key up (a compiled forward compiles here, on its first call)."""
    capture_seconds: float = 0.0
    """Of ``seconds``, capturing every key (PIECEWISE keys: each piece warmed up once more, captured, replayed)."""
    num_piece_graphs: int = 0
    """CUDA graphs captured for PIECEWISE keys' pieces (one per piece and key; 0 without PIECEWISE keys)."""

    def __str__(self) -> str:
        if self.unavailable_reason is not None:
            return self.unavailable_reason
        if self.rehearsed:
            text = (f"rehearsed {len(self.keys)} graph keys in {self.seconds:.1f} s (no CUDA graphs: every step is "
                    "dispatched and padded as a replay would be, and runs eagerly)")
        else:
            pieces = f", {self.num_piece_graphs} piece graphs" if self.num_piece_graphs else ""
            text = (f"captured {len(self.keys)} CUDA graphs in {self.seconds:.1f} s (warm-up {self.warm_up_seconds:.1f} s,"
                    f" capture {self.capture_seconds:.1f} s{pieces})")
        return "; ".join((text, *self.skipped))


def shown(report: CaptureReport, progress: bool) -> CaptureReport:
    """``report``, written to stderr as the capture's last progress line when ``progress``."""
    if progress:
        sys.stderr.write(f"\rgraphkv: {report}".ljust(80) + "\n")
    return report
