"""What a plan decides about CUDA graphs (step 6 of the compiler pass): the support the backends
allow, the mode requested and the mode kept (with why it was downgraded), and the token counts to
capture. :mod:`graphkv.plan.cudagraph` computes it; :class:`~graphkv.plan.plan.Plan` holds it as
``plan.cudagraph``.
"""

from __future__ import annotations

import attrs

from graphkv.spec.backends import CudaGraphSupport
from graphkv.spec.limits import CudaGraphMode

__all__ = ["CaptureSizes", "CudaGraphPlan"]


@attrs.frozen(kw_only=True)
class CaptureSizes:
    """Token counts to capture: uniform-decode graphs and mixed (prefill + decode) graphs."""

    decode: tuple[int, ...]
    mixed: tuple[int, ...]


@attrs.frozen(kw_only=True)
class CudaGraphPlan:
    """Step 6: what can be captured, what will be, and why."""

    support: CudaGraphSupport
    limited_by: str  # "group N (backend)" that set the minimum
    requested_mode: CudaGraphMode
    mode: CudaGraphMode
    downgrades: tuple[str, ...]
    capture_sizes: CaptureSizes
    max_capture_size_reason: str = ""
    """Where :attr:`max_capture_size` comes from (vLLM's default rule, or the limit that was set)."""

    @property
    def max_capture_size(self) -> int:
        """The largest step (tokens) any graph is captured for; larger steps run uncaptured. 0 when the
        mode captures nothing."""
        return max((*self.capture_sizes.decode, *self.capture_sizes.mixed), default=0)
