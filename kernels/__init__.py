"""Triton kernels of graphkv, installed as ``graphkv.kernels`` (needs the ``runtime`` extra)."""

from graphkv.extras import require

require("runtime", "triton", needed_by="graphkv.kernels")
