"""Triton kernels of graphkv, installed as ``graphkv.kernels`` (needs the ``runtime`` extra).

Each kernel is a :func:`~graphkv.kernels.launch.device_kernel`: compiled on CUDA tensors, run in Triton's
interpreter on CPU tensors, whatever ``TRITON_INTERPRET`` says.
"""

from graphkv.extras import require

require("runtime", "triton", needed_by="graphkv.kernels")
