"""Skip marks for torch features that a test needs and an older torch (a GPU machine's own) lacks."""

import pytest
import torch

from graphkv.runtime.flex.region import CPU_FLEX_MIN_TORCH, cpu_flex_compiles

compiled_cpu_flex = pytest.mark.skipif(
    not cpu_flex_compiles(),
    reason=f"compiled CPU flex attention over paged K/V views needs torch {'.'.join(map(str, CPU_FLEX_MIN_TORCH))} "
           f"or later (graphkv's regions run it eagerly before that: cpu_flex_compiles); torch {torch.__version__} "
           f"here")
"""Marks a test that compiles flex attention on a CPU itself."""
