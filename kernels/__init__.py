"""Triton kernels of graphkv, installed as ``graphkv.kernels``."""
