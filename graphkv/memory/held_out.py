"""How well the graph-memory model predicts capture keys it was not fitted to.

:func:`held_out` fits :func:`graphkv.plan.graph_pool.fit_graph_pool` to every other measured key
(the first, largest key always in the fit: it alone measures the workspace) and compares the
model's kept bytes (``per_graph + output x n``) with each left-out key's measured kept bytes. The
bar is 5 % of a key's measured bytes, and never below :data:`FLOOR_BYTES`: graphs that keep weak
views of their outputs (:mod:`graphkv.runtime.capture.weak`) keep 0 to a few KiB each, where a
percentage measures nothing (2 KiB against 1 KiB is 100 %) and 64 KiB is 0.025 % of the smallest
graph pool a preset plans (qwen3-next-80b-a3b's uncalibrated 245.55 MiB). The check covers the later
keys' kept bytes only: the largest key's footprint, nearly the whole pool, is measured, never
predicted, and checked against the pool's segments by the bench's pool note. ``graphkv bench memory`` prints the worst key against its bar.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from graphkv.plan.graph_keys import GraphKey
from graphkv.plan.graph_pool import fit_graph_pool

__all__ = ["BAR_FRACTION", "FLOOR_BYTES", "HeldOutKey", "held_out", "held_out_line"]

BAR_FRACTION = 0.05  # 5 % of the measured bytes ...
FLOOR_BYTES = 64 * 1024  # ... or 64 KiB, whichever is larger


@attrs.frozen(kw_only=True)
class HeldOutKey:
    """One key left out of the fit: its measured and predicted kept bytes."""

    num_tokens: int
    uniform: bool
    measured_bytes: int
    predicted_bytes: float

    @property
    def error_pct(self) -> float | None:
        """``(predicted - measured) / measured`` in percent (``None`` when measured 0)."""
        if self.measured_bytes == 0:
            return None
        return 100.0 * (self.predicted_bytes - self.measured_bytes) / self.measured_bytes

    @property
    def bar_bytes(self) -> float:
        """The largest error the check allows this key: 5 % of its measured bytes, at least 64 KiB."""
        return max(BAR_FRACTION * self.measured_bytes, FLOOR_BYTES)

    @property
    def within(self) -> bool:
        """Whether the prediction is within :attr:`bar_bytes` of the measurement."""
        return abs(self.predicted_bytes - self.measured_bytes) <= self.bar_bytes


def held_out(keys: Sequence[GraphKey], kept_bytes: Sequence[int], *, first_peak_bytes: int) -> tuple[HeldOutKey, ...]:
    """Fit to keys ``0, 2, 4, …`` of ``keys`` (capture order) and predict keys ``1, 3, 5, …``; empty
    with fewer than 4 keys (a line through one or two points checks nothing).

    >>> keys = [GraphKey(num_tokens=n, num_reqs=None, uniform=True) for n in (8, 6, 4, 2)]
    >>> [(k.num_tokens, k.predicted_bytes) for k in held_out(keys, [1080, 1060, 1040, 1021], first_peak_bytes=3000)]
    [(6, 1060.0), (2, 1020.0)]
    """
    if len(keys) != len(kept_bytes):
        raise ValueError(f"{len(kept_bytes)} measurements for {len(keys)} keys")
    if len(keys) < 4:
        return ()
    fitted = fit_graph_pool(keys[0::2], list(kept_bytes[0::2]), first_peak_bytes=first_peak_bytes, hidden_size=None,
                            source="held-out check")
    return tuple(HeldOutKey(num_tokens=k.num_tokens, uniform=k.uniform, measured_bytes=int(b),
                            predicted_bytes=fitted.per_graph_bytes + fitted.output_bytes_per_token * k.num_tokens)
                 for k, b in zip(keys[1::2], kept_bytes[1::2]))


def held_out_line(checked: Sequence[HeldOutKey]) -> str | None:
    """One line: the left-out key furthest from the model, against its bar (``None`` when nothing was checked)."""
    if not checked:
        return None
    key = max(checked, key=lambda k: abs(k.predicted_bytes - k.measured_bytes) / k.bar_bytes)
    diff = key.predicted_bytes - key.measured_bytes
    pct = key.error_pct
    verdict = "within" if all(k.within for k in checked) else "OUTSIDE"
    return (f"held-out keys: the model fitted to every other key predicts the other {len(checked)} keys' kept bytes; "
            f"furthest {'decode' if key.uniform else 'mixed'}({key.num_tokens}): {key.measured_bytes:,} B measured, "
            f"{key.predicted_bytes:,.0f} B predicted ({diff:+,.0f} B" + (f", {pct:+.2f} %" if pct is not None else "")
            + f") — {verdict} the bar of 5 % or 64 KiB")
