"""Paged twins of transformers' recurrent mixers: the model's own projections, convolution weights,
norms and output projections around graphkv's packed state ops (:mod:`graphkv.runtime.state`), the
states in the pool's state pages.

A twin replaces the mixer in the paged view (:mod:`graphkv.hf.view`) and takes the same call
(``hidden_states [1, T, hidden]`` plus keywords); it reads the step from the ``graphkv`` keyword
(or the step's context: a forward compiled whole passes none, its ``graphkv::state_mixer`` op reads the context).
:data:`MIXERS` maps the names in :data:`graphkv.hf.support.FAMILIES` to the twin classes.
"""

from __future__ import annotations

import types

from graphkv.hf.mixers.gated_delta import PagedGatedDeltaNet
from graphkv.hf.mixers.mamba2 import PagedMamba2Mixer
from graphkv.hf.mixers.short_conv import PagedShortConv

__all__ = ["MIXERS", "PagedGatedDeltaNet", "PagedMamba2Mixer", "PagedShortConv"]

MIXERS = types.MappingProxyType({"gated_delta": PagedGatedDeltaNet, "mamba2": PagedMamba2Mixer,
                                 "short_conv": PagedShortConv})
