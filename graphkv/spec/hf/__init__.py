"""Hugging Face ``config.json`` readers, one module per architecture family.

The public entry point is :func:`graphkv.spec.hf_config.model_from_hf_config`; the modules here
turn one family's config fields into :class:`~graphkv.spec.model.LayerDecl` lists. They read the
config through :class:`~graphkv.spec.hf._reader.ConfigReader`, which records every problem
(missing field, wrong type, size that tensor parallelism cannot split) so that one
:class:`~graphkv.errors.SpecError` reports all of them at once. Nothing here imports torch.
"""
