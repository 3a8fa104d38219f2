"""Hugging Face ``config.json`` readers, one module per idea, driven by what the config says.

The public entry point is :func:`graphkv.spec.hf_config.model_from_hf_config`. Here:
:mod:`.source` (which config describes the decoder, which family it is), :mod:`.families` (the
families graphkv lists, as data), :mod:`.layout` (what every layer is), :mod:`.sharing` (KV
sharing), :mod:`.attention`, :mod:`.mla` and :mod:`.states` (each kind's shapes), :mod:`.build`
(the model's entries) and :mod:`._reader` (typed field access that records every problem, with
plausibility caps). Nothing here imports torch or transformers.
"""
