"""A tiny hybrid language model: attention layers + gated linear-recurrence layers.

Random weights, no downloads. It exists to prove the paged, captured path end to end: its
attention layers read a paged KV cache and its recurrence layers keep a conv state and a
recurrent state in the *same* shared pool. :func:`dense_forward` is the non-paged reference —
the whole sequence of every request recomputed from scratch — that the paged engine must match.

Layer kinds in ``pattern``: ``"A"`` attention (GQA, causal, optional sliding window),
``"M"`` recurrence (causal depthwise conv over ``conv_kernel`` tokens, then per head
``S_t = g_t * S_{t-1} + k_t^T v_t`` and ``o_t = q_t S_t``, the shape of gated-delta/linear attention).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import attrs

from graphkv.spec.layers import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from graphkv.spec.model import LayerDecl, ModelKV

__all__ = ["TinyHybridConfig", "TinyHybridWeights", "dense_forward", "init_weights", "model_kv"]


@attrs.frozen(kw_only=True)
class TinyHybridConfig:
    """Shape of the tiny hybrid model."""

    vocab_size: int = 97
    hidden_size: int = 64
    pattern: str = "MAMA"
    num_heads: int = 4
    num_kv_heads: int = 2
    head_size: int = 16
    sliding_window: int | None = None
    state_heads: int = 2
    state_key_size: int = 8
    state_value_size: int = 16
    conv_kernel: int = 4
    max_position_embeddings: int = 4096

    @property
    def conv_dim(self) -> int:
        """Channels of the conv state: q, k and v of every state head."""
        return self.state_heads * (2 * self.state_key_size + self.state_value_size)

    @property
    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Conv state ``(conv_kernel - 1, conv_dim)`` and recurrent state ``(heads, dk, dv)``."""
        return ((self.conv_kernel - 1, self.conv_dim),
                (self.state_heads, self.state_key_size, self.state_value_size))


def model_kv(config: TinyHybridConfig, *, attention_backend: str = "flex", name: str = "tiny-hybrid") -> ModelKV:
    """The graphkv declaration of the model's KV-holding layers (float32 caches and states)."""
    layers = []
    for i, kind in enumerate(config.pattern):
        if kind == "A":
            common: dict[str, Any] = dict(num_kv_heads=config.num_kv_heads, head_size=config.head_size,
                                          dtype="float32")
            spec = (SlidingWindowSpec(window=config.sliding_window, **common) if config.sliding_window
                    else FullAttentionSpec(**common))
            layers.append(LayerDecl(index=i, name=f"layers.{i}", spec=spec, backend=attention_backend))
        else:
            spec = MambaSpec(shapes=config.state_shapes, dtypes=("float32", "float32"), variant="gated_linear",
                             chunk_size=64)
            layers.append(LayerDecl(index=i, name=f"layers.{i}", spec=spec, backend="gdn"))
    return ModelKV(name=name, layers=tuple(layers), max_position_embeddings=config.max_position_embeddings,
                   hidden_size=config.hidden_size)


@attrs.frozen(kw_only=True)
class TinyHybridWeights:
    """Weights of every layer, as torch tensors keyed by name."""

    config: TinyHybridConfig
    tensors: dict = attrs.field(eq=False)

    def __getitem__(self, name: str) -> Any:
        return self.tensors[name]

    def to(self, device: Any) -> "TinyHybridWeights":
        """A copy on ``device``."""
        return TinyHybridWeights(config=self.config, tensors={k: v.to(device) for k, v in self.tensors.items()})


def init_weights(config: TinyHybridConfig, *, seed: int = 0) -> TinyHybridWeights:
    """Random float32 weights (deterministic for ``seed``) on CPU."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) / math.sqrt(shape[0])

    h, c = config.hidden_size, config
    t: dict[str, torch.Tensor] = {"embed": torch.randn(c.vocab_size, h, generator=gen), "lm_head": rand(h, c.vocab_size)}
    for i, kind in enumerate(c.pattern):
        p = f"layers.{i}."
        if kind == "A":
            t[p + "wq"] = rand(h, c.num_heads * c.head_size)
            t[p + "wk"] = rand(h, c.num_kv_heads * c.head_size)
            t[p + "wv"] = rand(h, c.num_kv_heads * c.head_size)
            t[p + "wo"] = rand(c.num_heads * c.head_size, h)
        else:
            t[p + "w_in"] = rand(h, c.conv_dim)
            t[p + "conv"] = torch.randn(c.conv_dim, c.conv_kernel, generator=gen) / c.conv_kernel
            t[p + "w_gate"] = rand(h, c.state_heads)
            t[p + "w_out"] = rand(c.state_heads * c.state_value_size, h)
    return TinyHybridWeights(config=config, tensors=t)


def rms_norm(x: Any) -> Any:
    """Weightless RMS norm over the last dim."""
    return x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()


def split_qkv(w: TinyHybridWeights, prefix: str, x: Any) -> tuple[Any, Any, Any]:
    """Attention projections of ``x [T, hidden]`` → q ``[T, Hq, D]``, k/v ``[T, Hkv, D]``."""
    c = w.config
    q = (x @ w[prefix + "wq"]).view(-1, c.num_heads, c.head_size)
    k = (x @ w[prefix + "wk"]).view(-1, c.num_kv_heads, c.head_size)
    v = (x @ w[prefix + "wv"]).view(-1, c.num_kv_heads, c.head_size)
    return q, k, v


def recurrence_inputs(w: TinyHybridWeights, prefix: str, x: Any, conv_state: Any) -> tuple[Any, Any, Any, Any, Any]:
    """Causal conv over ``[conv_state; x @ w_in]`` and the per-head decay.

    ``x``: ``[T, hidden]``; ``conv_state``: ``[conv_kernel - 1, conv_dim]`` (previous inputs).
    Returns q ``[T, Hs, dk]``, k ``[T, Hs, dk]``, v ``[T, Hs, dv]``, decay ``[T, Hs]`` and the
    new conv state (last ``conv_kernel - 1`` inputs).
    """
    import torch

    c = w.config
    u = x @ w[prefix + "w_in"]  # [T, conv_dim]
    window = torch.cat([conv_state, u], dim=0)  # [K-1+T, conv_dim]
    conv = w[prefix + "conv"]  # [conv_dim, K]
    frames = window.unfold(0, c.conv_kernel, 1)  # [T, conv_dim, K]
    mixed = torch.nn.functional.silu((frames * conv).sum(-1))  # [T, conv_dim]
    hs, dk, dv = c.state_heads, c.state_key_size, c.state_value_size
    q = mixed[:, : hs * dk].view(-1, hs, dk)
    k = mixed[:, hs * dk: 2 * hs * dk].view(-1, hs, dk) / math.sqrt(dk)
    v = mixed[:, 2 * hs * dk:].view(-1, hs, dv)
    decay = torch.sigmoid(x @ w[prefix + "w_gate"])  # [T, Hs]
    return q, k, v, decay, window[-(c.conv_kernel - 1):]


def recurrence_scan(q: Any, k: Any, v: Any, decay: Any, state: Any) -> tuple[Any, Any]:
    """Run ``S_t = g_t S_{t-1} + k_t^T v_t``, ``o_t = q_t S_t`` over T tokens from ``state [Hs, dk, dv]``.

    Returns outputs ``[T, Hs, dv]`` and the final state.
    """
    outs = []
    for t in range(q.shape[0]):
        state = decay[t][:, None, None] * state + k[t][:, :, None] * v[t][:, None, :]
        outs.append((q[t][:, None, :] @ state).squeeze(1))
    import torch

    return torch.stack(outs) if outs else q.new_zeros(0, *v.shape[1:]), state


def dense_forward(weights: TinyHybridWeights, tokens: Sequence[int]) -> Any:
    """Reference: logits ``[len(tokens), vocab]`` of one request, computed from scratch without paging."""
    import torch

    c = weights.config
    ids = torch.as_tensor(list(tokens), dtype=torch.long)
    x = weights["embed"][ids]
    n = ids.shape[0]
    for i, kind in enumerate(c.pattern):
        p = f"layers.{i}."
        h = rms_norm(x)
        if kind == "A":
            q, k, v = split_qkv(weights, p, h)
            pos = torch.arange(n)
            allowed = pos[None, :] <= pos[:, None]
            if c.sliding_window:
                allowed &= pos[None, :] > pos[:, None] - c.sliding_window
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                attn_mask=allowed[None, None], enable_gqa=True)[0].transpose(0, 1)
            x = x + out.reshape(n, -1) @ weights[p + "wo"]
        else:
            conv0 = x.new_zeros(c.conv_kernel - 1, c.conv_dim)
            s0 = x.new_zeros(c.state_heads, c.state_key_size, c.state_value_size)
            q, k, v, decay, _ = recurrence_inputs(weights, p, h, conv0)
            out, _ = recurrence_scan(q, k, v, decay, s0)
            x = x + out.reshape(n, -1) @ weights[p + "w_out"]
    return rms_norm(x) @ weights["lm_head"]
