"""Merged projections: a layer's q / k / v weights (and an MLP's gate / up weights) in one tensor, one matmul each.

Why: a decode step at a small batch is a chain of matrix-vector products, each one kernel launch. A Qwen3 layer runs
seven (q, k, v, o, gate, up, down); q, k and v read the same input, as do gate and up, so engines serve them as one
matmul over the weights laid end to end (vLLM's ``QKVParallelLinear`` and ``MergedColumnParallelLinear``): three
launches fewer per layer, and larger matmuls that reach more of the memory bandwidth.

:func:`merge_projections` lays each group's weights (and biases) out end to end in one tensor and makes every
``nn.Linear`` of the group a view of its rows: the model computes exactly what it did (its parameters hold the same
values, in eager mode too) and holds no extra memory once the separate tensors are freed. :class:`ProjectionSlice`
replaces each projection in graphkv's view of the model (:func:`graphkv.hf.view.paged_view`): the whole group's
matmul, then its own columns. The group's slices compute the same matmul of the same input, which
:func:`~graphkv.runtime.capture.split.dedupe_linears` keeps once when the forward is traced, so a compiled forward
runs one matmul per group; run eagerly, each slice would run the whole matmul, so :class:`~graphkv.hf.model.PagedModel`
merges only under a split forward (``compile="piecewise"`` / ``"fused"``).
"""

from __future__ import annotations

from typing import Any, Iterable

import attrs
import torch

__all__ = ["GROUPS", "MergedGroup", "ProjectionSlice", "merge_projections", "needs_copy"]

GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""The projection groups merged, by child name: attention's query / key / value and a gated MLP's gate / up."""


@attrs.frozen(kw_only=True, eq=False)
class MergedGroup:
    """One merged group: the module holding it (``parent``), its projections' names, the weight ``[sum of
    out_features, in_features]`` and bias (``None`` when the projections have none) the projections are views of,
    and each projection's rows ``(start, stop)``."""

    parent: torch.nn.Module
    names: tuple[str, ...]
    weight: torch.nn.Parameter
    bias: torch.nn.Parameter | None
    rows: tuple[tuple[int, int], ...]

    @property
    def linears(self) -> tuple[torch.nn.Linear, ...]:
        """The group's projections, in :attr:`names` order."""
        return tuple(self.parent._modules[name] for name in self.names)  # type: ignore[misc]


class ProjectionSlice(torch.nn.Module):
    """One projection of a :class:`MergedGroup`: the group's matmul of the input, then this projection's columns
    (``[..., start:stop]``, a view). Holds the group's tensors without registering them (the model's parameters
    are views of them, which the view already holds through the model's own modules). Moving or casting the model
    afterwards (``model.to(...)``) gives its parameters new tensors that the group's no longer back: build the
    paged model after the model is where and what it will be served as."""

    def __init__(self, group: MergedGroup, index: int) -> None:
        super().__init__()
        self.__dict__["group"] = group  # not a submodule: the view's state_dict keeps the model's keys
        self.start, self.stop = group.rows[index]
        linear = group.linears[index]
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T (+ bias)`` of the whole group, this projection's columns."""
        group = self.group
        return torch.nn.functional.linear(x, group.weight, group.bias)[..., self.start:self.stop]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rows={self.start}:{self.stop}"


def _plain(tensor: Any) -> bool:
    """A plain parameter over a plain, contiguous tensor (not a quantized or distributed tensor subclass)."""
    return (type(tensor) is torch.nn.Parameter and type(tensor.data) is torch.Tensor  # noqa: E721 - exact types
            and tensor.is_contiguous())


def _mergeable(linears: list[Any]) -> bool:
    """Plain ``nn.Linear`` s (not quantized or parallel subclasses, no hooks or patched ``forward`` a slice would
    skip) of one input width, over plain contiguous weights of one dtype and device, with a bias each (of that dtype
    and device) or none, no parameter appearing twice."""
    if not all(type(m) is torch.nn.Linear for m in linears):  # noqa: E721 - subclasses compute something else
        return False
    first = linears[0].weight
    params = [p for m in linears for p in (m.weight, m.bias) if p is not None]
    return (all(m.in_features == linears[0].in_features and not m._forward_hooks and not m._forward_pre_hooks
                and "forward" not in m.__dict__ for m in linears)
            and all(_plain(p) and p.dtype == first.dtype and p.device == first.device for p in params)
            and len({m.bias is None for m in linears}) == 1
            and len({id(p) for p in params}) == len(params))


def _laid_out(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The one tensor ``tensors`` already are consecutive rows of (a second merge of the same model), else ``None``."""
    first = tensors[0]
    offset = first.storage_offset()
    for t in tensors:
        if t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or t.storage_offset() != offset:
            return None
        offset += t.numel()
    rows = sum(t.shape[0] for t in tensors)
    return first.as_strided((rows, *first.shape[1:]), first.stride())


@torch.no_grad()
def _merge(tensors: list[torch.Tensor]) -> torch.nn.Parameter:
    """One parameter whose consecutive rows hold ``tensors``; each tensor becomes a view of its rows (its values
    unchanged; its old storage freed when nothing else holds it)."""
    merged = _laid_out(tensors)
    if merged is None:
        merged = torch.cat([t.detach() for t in tensors])
        start = 0
        for t in tensors:
            t.data = merged[start:start + t.shape[0]]
            start += t.shape[0]
    return torch.nn.Parameter(merged, requires_grad=False)


def _groups(model: torch.nn.Module,
            exclude: Iterable[torch.nn.Module]) -> list[tuple[torch.nn.Module, tuple[str, ...]]]:
    """``(parent, names)`` of every mergeable group of ``model`` outside ``exclude``, in module order. A group sharing
    a projection or a parameter with another module's group (tied weights) is left alone: one tensor cannot be rows
    of two groups."""
    skipped = {id(m) for root in exclude for m in root.modules()}
    found = [(parent, names) for parent in model.modules() if id(parent) not in skipped for names in GROUPS
             if _mergeable([parent._modules.get(name) for name in names])]
    owners: dict[int, int] = {}  # id of a projection or parameter -> how many groups hold it
    for parent, names in found:
        for name in names:
            linear = parent._modules[name]
            for key in {id(linear)} | {id(p) for p in (linear.weight, linear.bias) if p is not None}:
                owners[key] = owners.get(key, 0) + 1
    return [(parent, names) for parent, names in found
            if all(owners[id(parent._modules[name])] == 1 and owners[id(parent._modules[name].weight)] == 1
                   for name in names)]


def needs_copy(model: torch.nn.Module, *, exclude: Iterable[torch.nn.Module] = ()) -> bool:
    """Whether :func:`merge_projections` would copy any weight of ``model`` (a group not laid out yet), which moves
    the weights that CUDA graphs captured over the model before read where they were."""
    for parent, names in _groups(model, exclude):
        linears = [parent._modules[name] for name in names]
        tensors = [[m.weight for m in linears]] + ([[m.bias for m in linears]] if linears[0].bias is not None else [])
        if any(_laid_out(ts) is None for ts in tensors):
            return True
    return False


def merge_projections(model: torch.nn.Module, *,
                      exclude: Iterable[torch.nn.Module] = ()) -> tuple[MergedGroup, ...]:
    """Lay out every :data:`GROUPS` group of ``model`` (a module with all of a group's children, each a plain
    ``nn.Linear`` of one input width, dtype and device, a bias each or none) end to end: one weight (and bias) per
    group, of which the group's projections' parameters become row views (their values unchanged, their old tensors
    freed once nothing else holds them). Groups inside an ``exclude`` module (a recurrent mixer graphkv runs
    eagerly, where each slice would run the whole matmul) are left alone. A model merged before is found laid out
    and not copied again. Returns the groups, in module order. ``model`` computes what it computed before."""
    groups = []
    for parent, names in _groups(model, exclude):
        linears = [parent._modules[name] for name in names]
        weight = _merge([m.weight for m in linears])
        bias = None if linears[0].bias is None else _merge([m.bias for m in linears])
        bounds, start = [], 0
        for m in linears:
            bounds.append((start, start + m.out_features))
            start += m.out_features
        groups.append(MergedGroup(parent=parent, names=names, weight=weight, bias=bias, rows=tuple(bounds)))
    return tuple(groups)
