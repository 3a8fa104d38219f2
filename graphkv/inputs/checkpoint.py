"""Weight bytes of a Hugging Face checkpoint directory, read from metadata only.

``model.safetensors.index.json`` carries ``metadata.total_size`` (the bytes of every tensor of
every shard). Without an index, each ``*.safetensors`` file starts with an 8-byte little-endian
header length and a JSON header whose ``data_offsets`` end where the tensor data ends; only that
header is read (bounded), never the tensors.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.inputs.json_file import MAX_JSON_BYTES, read_json_file, regular_file_size
from graphkv.printable import shortened
from graphkv.spec.budget import MAX_BYTES, format_bytes

__all__ = ["INDEX_NAME", "CheckpointWeights", "checkpoint_weights", "safetensors_data_bytes"]

INDEX_NAME = "model.safetensors.index.json"
_HEADER_LEN = struct.Struct("<Q")
_MAX_FILES = 4096  # shards of the largest public checkpoints number in the hundreds
# bytes per element of the safetensors dtypes of whole bytes (sub-byte ones, F4 / F6_*, are not checked)
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


@attrs.frozen(kw_only=True)
class CheckpointWeights:
    """Bytes of all weights of a checkpoint, and the file(s) the number was read from."""

    total_bytes: int
    source: str  # e.g. "model.safetensors.index.json metadata.total_size"

    def per_rank(self, tp: int) -> int:
        """Bytes one of ``tp`` tensor-parallel ranks holds (weights split evenly; rounded up).

        Replicated tensors (norms, routers) are small, so an even split is within a fraction of
        a percent for the models graphkv plans.
        """
        return -(-self.total_bytes // tp)


def _bad(field: str, path: str, limit: str) -> SpecError:
    return SpecError(Problem(field=field, value=path, limit=limit,
                             fix="pass an unmodified checkpoint directory, or give the weights with --weights-memory"))


def safetensors_data_bytes(path: str, *, field: str) -> int:
    """Bytes of tensor data in one ``.safetensors`` file, from its header alone."""
    size = regular_file_size(path, field=field, what="a .safetensors file")
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER_LEN.size)
            if len(head) < _HEADER_LEN.size:
                raise _bad(field, path, "is shorter than a safetensors header (8 bytes)")
            (n,) = _HEADER_LEN.unpack(head)
            if n > min(MAX_JSON_BYTES, size - _HEADER_LEN.size):
                raise _bad(field, path, f"declares a {n}-byte header (file is {size} bytes, headers are read up to "
                                        f"{format_bytes(MAX_JSON_BYTES)})")
            raw = f.read(n)
    except OSError as e:
        raise _bad(field, path, f"cannot be read ({type(e).__name__}: {e})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _bad(field, path, "has a header that is not JSON") from None
    if not isinstance(header, dict):
        raise _bad(field, path, "has a header that is not a JSON object")
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
            raise _bad(field, path, f"tensor {name[:60]!r} has no valid data_offsets")
        _check_extent(entry, name, offsets, path, field)
        end = max(end, offsets[1])
    if end > size - _HEADER_LEN.size - n:
        raise _bad(field, path, f"declares {end} bytes of tensors but holds {size - _HEADER_LEN.size - n}")
    return end


def _check_extent(entry: dict[str, Any], name: str, offsets: list[int], path: str, field: str) -> None:
    """A tensor's ``data_offsets`` span its shape times its dtype's size (as safetensors itself checks on load):
    a header that says otherwise would make the weights look as small as its offsets (2 B for a 10^24-element
    tensor), and the pool take the whole GPU."""
    shape, itemsize = entry.get("shape"), _DTYPE_BYTES.get(entry.get("dtype"))  # type: ignore[arg-type]
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise _bad(field, path, f"tensor {name[:60]!r} has no valid shape (a list of sizes)")
    if itemsize is None:
        return  # a sub-byte or newer dtype: its packing is the library's to check
    numel = 1
    for d in shape:
        numel *= d
    if offsets[1] - offsets[0] != numel * itemsize:
        raise _bad(field, path, f"tensor {name[:60]!r} is {entry['dtype']} of shape {shape[:8]} "
                                f"({numel * itemsize} bytes) but its data_offsets {offsets} span "
                                f"{offsets[1] - offsets[0]}")


def _index_total(index: Any, path: str, field: str) -> int | None:
    if not isinstance(index, dict):  # an index is an object ({"metadata": ..., "weight_map": ...}); a list is no index
        raise _bad(field, path, f"is a JSON {type(index).__name__}, not the object a safetensors index holds")
    metadata = index.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _bad(field, path, f"has metadata={shortened(repr(metadata))}, not the object that holds total_size")
    total = metadata.get("total_size") if metadata is not None else None
    if total is None:
        return None
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        raise _bad(field, path, f"has metadata.total_size={total!r}, not a positive integer")
    if total > MAX_BYTES:  # the cap on sizes typed on the command line; more is a corrupt or hostile index
        raise _bad(field, path, f"has metadata.total_size={total}, more than {format_bytes(MAX_BYTES)}, more memory "
                                "than any one machine has")
    return total


def _index_shards(index: dict[str, Any], path: str, directory: str, field: str) -> list[str]:
    """The shard files an index without ``metadata.total_size`` names in its ``weight_map``, each
    checked to be a file name in ``directory``, which holds it."""
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise _bad(field, path, "has no metadata.total_size and no weight_map naming its shards: the weights' size "
                                "cannot be read")
    names = sorted(set(weight_map.values()), key=str)
    for name in names:
        if not isinstance(name, str) or not name.endswith(".safetensors") or os.path.basename(name) != name:
            raise _bad(field, path, f"has a weight_map entry {shortened(repr(name))}, not a .safetensors file name")
    missing = [n for n in names if not os.path.lexists(os.path.join(directory, n))]
    if missing:
        raise _bad(field, path, f"has no metadata.total_size and names {len(missing)} shard(s) the directory does "
                                f"not hold (first: {missing[0]!r}): the weights' size cannot be read")
    return names


def checkpoint_weights(directory: str, *, field: str = "--hf-config") -> CheckpointWeights | None:
    """The weight bytes of the checkpoint in ``directory``; ``None`` when it holds no safetensors.

    Reads ``model.safetensors.index.json``'s ``metadata.total_size`` when present, else sums the
    data sizes of the headers of the shards its ``weight_map`` names, else (no index) of every
    ``*.safetensors`` file. Malformed metadata — ``metadata`` not an object, an index with neither
    ``total_size`` nor a ``weight_map``, or naming shards the directory lacks — is a
    :class:`SpecError` on ``field`` (a wrong weight number would silently misplan the pool).
    """
    index_path = os.path.join(directory, INDEX_NAME)
    names: list[str] | None = None
    if os.path.lexists(index_path):
        index = read_json_file(index_path, field=field, what=f"a {INDEX_NAME}")
        total = _index_total(index, index_path, field)
        if total is not None:
            return CheckpointWeights(total_bytes=total, source=f"{INDEX_NAME} metadata.total_size")
        names = _index_shards(index, index_path, directory, field)
    if names is None:
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
        except OSError as e:
            raise _bad(field, directory, f"cannot be listed ({type(e).__name__}: {e})") from None
    if not names:
        return None
    if len(names) > _MAX_FILES:
        raise _bad(field, directory, f"holds {len(names)} .safetensors files, more than the {_MAX_FILES} read")
    total = sum(safetensors_data_bytes(os.path.join(directory, n), field=field) for n in names)
    what = names[0] if len(names) == 1 else f"{len(names)} .safetensors files"
    return CheckpointWeights(total_bytes=total, source=f"headers of {what}")
