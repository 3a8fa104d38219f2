"""How well the graph-memory model predicts capture keys it was not fitted to.

:func:`held_out` fits :func:`graphkv.plan.graph_pool.fit_graph_pool` to every other measured key
(the first, largest key always in the fit: it alone measures the workspace) and compares the
model's kept bytes (``per_graph + output x n``) with each left-out key's measured kept bytes. The
issue's bar is 5 % on every left-out key; ``graphkv bench memory`` prints the worst.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from graphkv.plan.graph_keys import GraphKey
from graphkv.plan.graph_pool import fit_graph_pool

__all__ = ["HeldOutKey", "held_out", "held_out_line"]


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
    """One line: the worst left-out key's error against the 5 % bar (``None`` when nothing was checked)."""
    errors = [(abs(e), k) for k in checked if (e := k.error_pct) is not None]
    if not errors:
        return None
    worst, key = max(errors, key=lambda t: t[0])
    verdict = "within" if worst <= 5.0 else "OUTSIDE"
    return (f"held-out keys: the model fitted to every other key predicts the other {len(checked)} keys' kept bytes "
            f"to {worst:.2f} % at worst ({'decode' if key.uniform else 'mixed'}({key.num_tokens}): "
            f"{key.measured_bytes:,} B measured, {key.predicted_bytes:,.0f} B predicted) — {verdict} the 5 % bar")
