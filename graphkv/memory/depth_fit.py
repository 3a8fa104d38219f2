"""Graph memory at a preset's full depth from two reduced-depth measurements, linear in layers.

``graphkv bench memory`` captures a preset's forward at two depths ``l1 < l2``
(:func:`graphkv.memory.preset_forward.depths`) and fits a :class:`GraphPoolModel` at each. Each
per-layer quantity a captured step allocates (a layer's activations in the workspace, what a graph
keeps per layer) grows with the number of layers, and the rest (the logits a graph keeps, the
instantiated graph) does not, so every coefficient ``c`` is taken as ``c(L) = c1 + (c2 - c1) x
(L - l1) / (l2 - l1)`` and evaluated at the preset's ``num_layers``, clamped at 0. Lazy workspaces
(cuBLAS) do not depend on depth: the deeper measurement's is kept. The rule is first order and
stated in the calibration's ``source``; keys measured at a third depth check it.
"""

from __future__ import annotations

import attrs

from graphkv.plan.graph_pool import GraphPoolModel

__all__ = ["extrapolate"]

_LINEAR_COEFFICIENTS = ("per_graph_bytes", "output_bytes_per_token", "workspace_bytes_per_token")


def extrapolate(shallow: GraphPoolModel, deep: GraphPoolModel, *, shallow_layers: int, deep_layers: int,
                num_layers: int, source: str) -> GraphPoolModel:
    """The model at ``num_layers`` from fits at ``shallow_layers`` and ``deep_layers`` (see the
    module docstring); ``source`` names the preset and the device for the ledger's reasons.

    >>> a = GraphPoolModel(per_graph_bytes=1000.0, output_bytes_per_token=10.0, workspace_bytes_per_token=100.0,
    ...                    calibrated=True, source="1 layer", hidden_size=64)
    >>> b = attrs.evolve(a, workspace_bytes_per_token=150.0, source="2 layers")
    >>> m = extrapolate(a, b, shallow_layers=1, deep_layers=2, num_layers=32, source="x")
    >>> (m.per_graph_bytes, m.output_bytes_per_token, m.workspace_bytes_per_token)
    (1000.0, 10.0, 1650.0)
    """
    assert 1 <= shallow_layers < deep_layers, (shallow_layers, deep_layers)
    assert shallow.hidden_size == deep.hidden_size, "both depths share the preset's widths"
    scale = (num_layers - shallow_layers) / (deep_layers - shallow_layers)
    values = {name: max(getattr(shallow, name) + (getattr(deep, name) - getattr(shallow, name)) * scale, 0.0)
              for name in _LINEAR_COEFFICIENTS}
    return attrs.evolve(deep, **values, calibrated=True,
                        source=f"{source}: measured at {shallow_layers} and {deep_layers} layers, extrapolated "
                               f"linearly to {num_layers}")
