"""The one padding sentinel shared by kernels, references and static inputs."""

from __future__ import annotations

__all__ = ["PAD_SLOT_ID"]

PAD_SLOT_ID = -1
"""Slot of a token that writes no KV: a padding token of a captured graph, or any token of a
state (Mamba) group, which has no per-token slots. Kernels skip negative slots."""
