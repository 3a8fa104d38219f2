"""DeepSeek-V2/V3: multi-head latent attention on every layer.

Each token caches one latent of ``kv_lora_rank + qk_rope_head_dim`` elements (512 + 64 for V3),
shared by all heads, so tensor parallelism does not shrink it: every rank caches the whole
latent. The multi-token-prediction layers (``num_nextn_predict_layers``) are not counted.
"""

from __future__ import annotations

from graphkv.spec.hf._common import decl
from graphkv.spec.hf._reader import ConfigReader, Options
from graphkv.spec.layers import MLASpec
from graphkv.spec.model import LayerDecl

__all__ = ["build"]


def build(cfg: ConfigReader, opts: Options, num_layers: int | None) -> list[LayerDecl]:
    """``num_hidden_layers`` MLA layers on the MLA backend (``flashmla`` unless overridden)."""
    rank = cfg.int_field("kv_lora_rank")
    rope_dim = cfg.int_field("qk_rope_head_dim")
    cfg.raise_if_any()
    assert rank is not None and rope_dim is not None and num_layers is not None
    spec = MLASpec(kv_lora_rank=rank, rope_dim=rope_dim, dtype=opts.attention_dtype)
    return [decl(i, spec, opts.mla_backend) for i in range(num_layers)]
