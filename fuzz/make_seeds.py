#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<harness>/ from the repository's
real inputs (shrunk to stay small) plus hand-made broken ones. Run from the
repository root: python3 fuzz/make_seeds.py. The committed corpora are these
seeds merged with what fuzzing found (fuzz/README.md)."""
import json
import lzma
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
SIZES = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4}


def put(harness, name, data):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) < 100_000, (harness, name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors -----------------------------------------------------------
def st_file(header, data=b"", hlen=None):
    h = json.dumps(header, separators=(",", ":")).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def st_valid(tensors, metadata=None):
    """tensors: [(name, dtype, shape)] laid out back to back."""
    header, off = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dt, shape in tensors:
        n = SIZES.get(dt, 1)
        for s in shape:
            n *= s
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    return st_file(header, bytes(i % 251 for i in range(off)))


def st_real(path):
    """A real checkpoint's header (names, dtypes, ranks, metadata) with every
    dimension cut to at most 2, so the file stays small but valid."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    meta = header.pop("__metadata__", None)
    tensors = [(k, v["dtype"], [min(s, 2) for s in v["shape"]]) for k, v in sorted(header.items())]
    return st_valid(tensors, meta)


def safetensors_seeds():
    for name, rel in [("real_qwen3_tiny_target", "testdata/fixtures/qwen3-tiny/target/model.safetensors"),
                      ("real_gemma4_tiny_drafter", "testdata/fixtures/gemma4-tiny/drafter/model.safetensors"),
                      ("real_pico_dspark", "models/pico-qwen3-dspark/model.safetensors"),
                      ("real_golden", "testdata/fixtures/qwen3-tiny/golden.safetensors")]:
        put("safetensors", name, st_real(os.path.join(ROOT, rel)))
    put("safetensors", "ok_empty_header", st_file({}))
    put("safetensors", "ok_metadata_only", st_file({"__metadata__": {"format": "pt"}}))
    put("safetensors", "ok_every_dtype", st_valid([(d.lower(), d, [2, 3]) for d in SIZES], {"format": "pt"}))
    put("safetensors", "ok_scalar_and_empty", st_valid([("scalar", "F32", []), ("empty", "BF16", [0, 4]),
                                                         ("after", "F16", [3])]))
    put("safetensors", "ok_8_dims", st_valid([("t", "F32", [1, 1, 1, 1, 1, 1, 1, 2])]))
    put("safetensors", "bad_truncated_length", b"\x10\x00\x00")
    put("safetensors", "bad_header_past_end", st_file({}, hlen=1 << 40))
    put("safetensors", "bad_header_not_object", st_file(b"[1,2,3]"))
    put("safetensors", "bad_header_not_json", st_file(b'{"a": {"dtype": "F32",'))
    put("safetensors", "bad_unknown_dtype", st_file({"t": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}, b"\0"))
    put("safetensors", "bad_9_dims", st_file({"t": {"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}}, b"\0" * 4))
    put("safetensors", "bad_negative_dim", st_file({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4))
    put("safetensors", "bad_shape_overflow",
        st_file({"t": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}}, b"\0" * 4))
    put("safetensors", "bad_offsets_outside", st_file({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4))
    put("safetensors", "bad_offsets_reversed", st_file({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4))
    put("safetensors", "bad_offsets_fractional",
        st_file({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0.5, 4.5]}}, b"\0" * 8))
    put("safetensors", "bad_byte_count", st_file({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 12))
    put("safetensors", "bad_overlap", st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12))
    put("safetensors", "bad_duplicate_name",
        st_file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
                b"\0" * 8))
    put("safetensors", "bad_entry_not_object", st_file({"a": [1, 2]}))
    put("safetensors", "bad_offsets_strings", st_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}}, b"\0" * 4))


def main():
    safetensors_seeds()


if __name__ == "__main__":
    main()
