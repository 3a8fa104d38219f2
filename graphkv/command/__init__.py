"""The pieces of the ``graphkv`` command: one-line argument errors, errors in terms of the flags the
user typed, the model and budget the flags describe. :mod:`graphkv.cli` wires them together."""
