"""Turn a :class:`~graphkv.plan.Plan` into the configuration of an engine that realizes it."""

from graphkv.emit.vllm import VllmTarget, vllm_serve_command

__all__ = ["VllmTarget", "vllm_serve_command"]
