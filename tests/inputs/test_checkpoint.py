"""Weight bytes read from a checkpoint's metadata: the safetensors index, else the file headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from graphkv.errors import SpecError
from graphkv.inputs import checkpoint_weights, read_json_file
from graphkv.inputs.checkpoint import INDEX_NAME


def write_safetensors(path: Path, tensor_bytes: list[int]) -> None:
    """A safetensors file: 8-byte header length, JSON header with data_offsets, then the data."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for i, n in enumerate(tensor_bytes):
        header[f"t{i}"] = {"dtype": "U8", "shape": [n], "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_index_total_size_is_read(tmp_path: Path) -> None:
    """model.safetensors.index.json metadata.total_size is the checkpoint's weight bytes."""
    (tmp_path / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 16060522496},
                                                   "weight_map": {"lm_head.weight": "model-00004-of-00004.safetensors"}}))
    weights = checkpoint_weights(str(tmp_path))
    assert weights is not None
    assert weights.total_bytes == 16060522496
    assert weights.source == "model.safetensors.index.json metadata.total_size"
    assert weights.per_rank(2) == 8030261248 and weights.per_rank(3) == 5353507499


def test_headers_are_summed_without_an_index(tmp_path: Path) -> None:
    """Without an index, the data sizes in every .safetensors header are summed (tensors are not read)."""
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", [100, 28])
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", [1000])
    weights = checkpoint_weights(str(tmp_path))
    assert weights is not None and weights.total_bytes == 1128
    assert weights.source == "headers of 2 .safetensors files"


def test_an_index_without_total_size_sums_the_shards_it_names(tmp_path: Path) -> None:
    """An index with a weight_map but no metadata.total_size: the headers of the shards it names are summed (a stray
    .safetensors file beside them is not one of the checkpoint's)."""
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", [100, 28])
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", [1000])
    write_safetensors(tmp_path / "stray.safetensors", [7])
    (tmp_path / INDEX_NAME).write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                                  "b": "model-00002-of-00002.safetensors",
                                                                  "c": "model-00002-of-00002.safetensors"}}))
    weights = checkpoint_weights(str(tmp_path))
    assert weights is not None and (weights.total_bytes, weights.source) == (1128, "headers of 2 .safetensors files")


@pytest.mark.parametrize("index, why", [
    ({"metadata": [1]}, r"has metadata=\[1\], not the object that holds total_size"),
    ({"metadata": {}}, "has no metadata.total_size and no weight_map naming its shards"),
    ({"weight_map": {"a": "model-00001-of-00002.safetensors"}},
     r"has no metadata.total_size and names 1 shard\(s\) the directory does not hold \(first: "
     r"'model-00001-of-00002.safetensors'\)"),
    ({"weight_map": {"a": "../elsewhere.safetensors"}}, "has a weight_map entry '../elsewhere.safetensors', not a "
                                                        ".safetensors file name"),
    ({"weight_map": {"a": 3}}, "has a weight_map entry 3, not a .safetensors file name"),
])
def test_an_index_that_cannot_give_the_weights_is_refused(tmp_path: Path, index: dict, why: str) -> None:
    """An index whose metadata is not an object, or that has no total_size and no shards to read, was planned as 0 B of
    weights (the KV pool given the whole GPU): now a SpecError on the flag naming what is wrong."""
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(SpecError, match=why) as info:
        checkpoint_weights(str(tmp_path), field="--hf-config")
    assert info.value.field == "--hf-config" and "give the weights with --weights-memory" in str(info.value)


def test_directory_without_weights_is_none(tmp_path: Path) -> None:
    """A directory with only a config.json has no known weights."""
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_weights(str(tmp_path)) is None


@pytest.mark.parametrize("header_len, body, why", [
    (10**12, b"", "declares a 1000000000000-byte header"),
    (4, b"nope", "has a header that is not JSON"),
    (2, b"[]", "has a header that is not a JSON object"),
])
def test_malformed_safetensors_headers_are_refused(tmp_path: Path, header_len: int, body: bytes, why: str) -> None:
    """A header longer than the file, or not a JSON object, is a SpecError on the flag."""
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", header_len) + body)
    with pytest.raises(SpecError, match=why) as info:
        checkpoint_weights(str(tmp_path), field="--hf-config")
    assert info.value.field == "--hf-config"


@pytest.mark.parametrize("entry, why", [
    ({"dtype": "BF16", "shape": [10**12, 10**12], "data_offsets": [0, 2]},
     r"tensor 'w' is BF16 of shape \[1000000000000, 1000000000000\] \(2000000000000000000000000 bytes\) but its "
     r"data_offsets \[0, 2\] span 2"),
    ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, r"is F32 of shape \[3\] \(12 bytes\) .* span 8"),
    ({"dtype": "F32", "shape": "3", "data_offsets": [0, 12]}, "tensor 'w' has no valid shape"),
    ({"dtype": "F32", "shape": [-3], "data_offsets": [0, 12]}, "tensor 'w' has no valid shape"),
])
def test_a_tensor_whose_offsets_do_not_span_its_shape_is_refused(tmp_path: Path, entry: dict, why: str) -> None:
    """safetensors checks on load that a tensor's data_offsets span its shape times its dtype's size; a header that
    did not was read as its offsets alone (weights of 2 B, the whole GPU left to the pool)."""
    raw = json.dumps({"w": entry}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)
    with pytest.raises(SpecError, match=why):
        checkpoint_weights(str(tmp_path), field="--hf-config")
    entry.update(dtype="F4", shape=[3], data_offsets=[0, 2])  # sub-byte dtypes: their packing is not checked here
    raw = json.dumps({"w": entry}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)
    assert checkpoint_weights(str(tmp_path), field="--hf-config").total_bytes == 2


def test_bad_total_size_is_refused(tmp_path: Path) -> None:
    """A total_size that is not a positive integer is refused rather than planned as 0 bytes."""
    (tmp_path / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": "16GB"}}))
    with pytest.raises(SpecError, match="metadata.total_size='16GB', not a positive integer"):
        checkpoint_weights(str(tmp_path))


def test_total_size_above_1_pib_is_refused(tmp_path: Path) -> None:
    """A total_size above 1 PiB (the cap on sizes typed on the command line) is refused, naming the file's field."""
    (tmp_path / INDEX_NAME).write_text('{"metadata": {"total_size": 1' + "0" * 40 + "}}")
    with pytest.raises(SpecError, match=r"has metadata.total_size=10{40}, more than 1024.00 TiB, more memory than any "
                                        r"one machine has") as info:
        checkpoint_weights(str(tmp_path), field="--hf-config")
    assert info.value.field == "--hf-config" and len(info.value.problems) == 1
    (tmp_path / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 1 << 50}}))
    weights = checkpoint_weights(str(tmp_path))
    assert weights is not None and weights.total_bytes == 1 << 50  # the cap itself is accepted


def test_json_reader_bounds_depth_and_size(tmp_path: Path) -> None:
    """Nesting beyond 64 levels (at any depth the parser reaches, or past its recursion limit) is refused; files over
    the cap are refused before parsing."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SpecError, match="nests more than 64 levels deep"):
        read_json_file(str(deep), field="--hf-config")
    deep.write_text('{"a": ' * 65 + "1" + "}" * 65)  # 65 levels, well within the parser's limit
    with pytest.raises(SpecError, match="nests more than 64 levels deep"):
        read_json_file(str(deep), field="--hf-config")
    deep.write_text('{"a": ' * 63 + "[1]" + "}" * 63)  # 64 levels: read
    assert read_json_file(str(deep), field="--hf-config")["a"]["a"]["a"] is not None
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"a": "x" * 200}))
    with pytest.raises(SpecError, match="over the 128 B cap"):
        read_json_file(str(big), field="--hf-config", max_bytes=128)
    brackets_in_strings = tmp_path / "ok.json"
    brackets_in_strings.write_text(json.dumps({"pattern": "[" * 500, "n": [[1]]}))
    assert read_json_file(str(brackets_in_strings), field="--hf-config")["n"] == [[1]]


def test_json_reader_is_linear_on_strings_of_escapes(tmp_path: Path) -> None:
    """An unterminated string of 2 MiB of escaped quotes (a pattern that made a regex scan quadratic: 40 s for 80 KB)
    and a valid file with one 8 MiB string are each read, or refused as invalid JSON, in well under a second of
    parsing (the 30 s bound guards against a hang, far above the time on a loaded 2-core machine; not a performance
    target)."""
    import time

    bad = tmp_path / "escapes.json"
    bad.write_text('{"a": "' + '\\"' * (1 << 20))
    start = time.perf_counter()
    with pytest.raises(SpecError, match=r"is not valid JSON \(Unterminated string starting at: line 1 column 7\)"):
        read_json_file(str(bad), field="--hf-config")
    long = tmp_path / "long.json"
    long.write_text(json.dumps({"a": '"[{' * (8 << 18)}))
    assert len(read_json_file(str(long), field="--hf-config")["a"]) == 3 * (8 << 18)
    assert time.perf_counter() - start < 30
