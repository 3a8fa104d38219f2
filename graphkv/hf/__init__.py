"""Hugging Face transformers models on graphkv's pool, step and capture.

Take a loaded causal LM (``AutoModelForCausalLM.from_config(config)`` or ``.from_pretrained(local
dir)``; graphkv never downloads), read its cache layers from its config with the same reader as
``graphkv plan``, compile a plan, allocate the pool and run the model's own modules over its own
weights with graphkv's paged flex attention (through transformers' attention-function interface)
and paged recurrent mixers (its states in the pool's state pages):

- :func:`generate` — greedy continuous batching with chunked prefill, ``list[list[int]]`` out;
- :class:`ServingLoop` — the plan, the :class:`~graphkv.runtime.step.Step` and the captured
  forward, for stacks that schedule themselves;
- :class:`PagedModel` — the paged forward itself; :func:`model_kv` — the model's declaration;
- :data:`FAMILIES` — the families that run (others are refused in one line naming what is missing).

Needs the ``hf`` extra (transformers) on top of ``runtime``. Names are imported lazily, so
``import graphkv.hf`` is cheap until one is used.
"""

from __future__ import annotations

from graphkv._lazy import lazy_exports
from graphkv.extras import require

require("runtime", "torch", needed_by="graphkv.hf")
require("hf", "transformers", needed_by="graphkv.hf")

__all__ = ["FAMILIES", "PagedModel", "ServingLoop", "generate", "model_kv", "tiny_model"]

_LAZY = {
    "FAMILIES": "graphkv.hf.support",
    "PagedModel": "graphkv.hf.model",
    "ServingLoop": "graphkv.hf.serving",
    "generate": "graphkv.hf.generation",
    "model_kv": "graphkv.hf.declare",
    "tiny_model": "graphkv.hf.tiny",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
