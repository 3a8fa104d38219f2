"""``--compile NAME``: the graphkv.hf compile mode each flag name selects (torch-free: the CLI parses with it).

The modes are :class:`~graphkv.hf.PagedModel`'s ``compile``: ``True`` (each attention group's flex
attention compiled), ``False`` (nothing), ``"model"`` (the whole forward by Inductor),
``"piecewise"`` (split at the attention and state-mixer ops, pieces as traced) and ``"fused"``
(split the same way, each piece compiled by Inductor); ``None`` picks ``True`` on a GPU.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

__all__ = ["COMPILE_BY_NAME"]

COMPILE_BY_NAME: Mapping[str, bool | str | None] = MappingProxyType(
    {"auto": None, "attention": True, "model": "model", "piecewise": "piecewise", "fused": "fused", "none": False})
"""The ``--compile NAME`` flags of ``graphkv demo --hf`` and the benchmarks: the ``compile`` each selects."""
