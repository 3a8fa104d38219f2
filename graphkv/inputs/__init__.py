"""Reading what a user points graphkv at — config files, checkpoint directories — without trusting it.

Every reader here refuses, with a :class:`~graphkv.errors.SpecError` naming the flag or field,
what is not a regular file, what is larger than a cap, what nests deeper than a bound and what
does not parse; none of them blocks on a FIFO or reads an endless device.
"""

from graphkv.inputs.checkpoint import CheckpointWeights, checkpoint_weights
from graphkv.inputs.json_file import MAX_JSON_BYTES, MAX_JSON_DEPTH, read_json_file

__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "CheckpointWeights", "checkpoint_weights", "read_json_file"]
