#!/usr/bin/env python3
"""Reads a `dspark datagen` training cache with numpy (memory-mapped): for the
PyTorch reference and other tools outside the engine. The C reader is
src/io/train_cache.h; the layout is src/io/train_shard.h's:

    header (128 bytes, little-endian): magic "DSTRAIN1", u32 version, u32 header_bytes, u32 n_seqs,
        u32 n_taps, u32 hidden, u32 dtype (1 = bf16), u64 first_seq, u64 n_tokens, u64 ids_off,
        u64 mask_off, u64 index_off, u64 file_bytes, u64 cache_id, 40 reserved bytes
    per sequence: taps bf16 [len, n_taps*hidden] at taps_off, final hidden bf16 [len, hidden] at final_off
    ids int32 [n_tokens] at ids_off, mask uint8 [n_tokens] at mask_off,
    index [n_seqs] x (u64 taps_off, u64 final_off, u64 tok_start, u32 len, u32 n_prompt) at index_off

    python3 scripts/train_cache.py CACHE_DIR      # checks every shard, prints a summary

    from train_cache import TrainCache
    c = TrainCache("CACHE_DIR"); s = c[0]       # s["ids"], s["mask"], s["taps"], s["final_hidden"] (uint16 bf16 bits)
    taps = bf16_to_f32(s["taps"])                # or torch.from_numpy(s["taps"].view(np.int16)).view(torch.bfloat16)
"""
import json
import os
import struct
import sys

import numpy as np

HEADER = struct.Struct("<8sIIIIIIQQQQQQQ40x")
INDEX = np.dtype([("taps_off", "<u8"), ("final_off", "<u8"), ("tok_start", "<u8"), ("len", "<u4"),
                  ("n_prompt", "<u4")])


def bf16_to_f32(a):
    """bf16 bits (uint16) -> float32 values."""
    return (a.astype(np.uint32) << 16).view(np.float32)


def fnv64(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def cache_id(m):
    """The manifest's identity hash, as src/io/train_manifest.c computes it."""
    t, s, p = m["target"], m["sampling"], m["prompts"]
    line = "v%d|%s|%s|%s|%s|%d|%d|%d|%.9g|%.9g|%d|%d|%d|%d|%d|%d|%s|%d|taps" % (
        m["version"], t["model_type"], m["backend"], t["config_hash"], t["weights_fingerprint"], t["vocab_size"], m["hidden_size"],
        t["num_hidden_layers"], np.float32(s["temperature"]), np.float32(s["top_p"]), s["top_k"], s["max_new"],
        s["seed"], s["ignore_eos"], p["count"], p["raw"], p["ids_hash"], m["shard_tokens"])
    line += "".join(",%d" % x for x in m["tap_layers"])
    return "%016x" % fnv64(line.encode())


class Shard:
    def __init__(self, path, manifest, info):
        self.map = np.memmap(path, dtype=np.uint8, mode="r")
        if len(self.map) < HEADER.size:
            raise ValueError(f"{path}: truncated: {len(self.map)} bytes")
        (magic, version, hbytes, self.n_seqs, self.n_taps, self.hidden, dtype, self.first_seq, self.n_tokens,
         ids_off, mask_off, index_off, file_bytes, cid) = HEADER.unpack(bytes(self.map[:HEADER.size]))
        if magic != b"DSTRAIN1" or version != 1 or hbytes != 128 or dtype != 1:
            raise ValueError(f"{path}: bad magic / version / dtype")
        if file_bytes != len(self.map):
            raise ValueError(f"{path}: truncated: header says {file_bytes} bytes, file has {len(self.map)}")
        if "%016x" % cid != manifest["cache_id"] or self.first_seq != info["first_seq"] or \
                self.n_seqs != info["n_seqs"] or self.n_tokens != info["n_tokens"]:
            raise ValueError(f"{path}: does not match the manifest's entry")
        self.ids = self.map[ids_off:ids_off + 4 * self.n_tokens].view("<i4")
        self.mask = self.map[mask_off:mask_off + self.n_tokens]
        self.index = self.map[index_off:index_off + INDEX.itemsize * self.n_seqs].view(INDEX)

    def __getitem__(self, i):
        e = self.index[i]
        n, tw = int(e["len"]), self.n_taps * self.hidden
        t0, f0, k = int(e["taps_off"]), int(e["final_off"]), int(e["tok_start"])
        return {"ids": self.ids[k:k + n], "mask": self.mask[k:k + n], "n_prompt": int(e["n_prompt"]),
                "taps": self.map[t0:t0 + 2 * n * tw].view("<u2").reshape(n, tw),
                "final_hidden": self.map[f0:f0 + 2 * n * self.hidden].view("<u2").reshape(n, self.hidden)}


class TrainCache:
    def __init__(self, path):
        with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
            self.manifest = json.load(f)
        if cache_id(self.manifest) != self.manifest["cache_id"]:
            raise ValueError(f"{path}/manifest.json: cache_id is not the hash of its identity fields")
        self.shards = [Shard(os.path.join(path, s["file"]), self.manifest, s) for s in self.manifest["shards"]]
        self.starts = [s["first_seq"] for s in self.manifest["shards"]]

    def __len__(self):
        return sum(s.n_seqs for s in self.shards)

    def __getitem__(self, i):
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        if not 0 <= i < len(self) or k < 0:
            raise IndexError(i)
        return self.shards[k][i - self.starts[k]]


def main():
    c = TrainCache(sys.argv[1])
    m = c.manifest
    toks = gen = 0
    for i in range(len(c)):
        s = c[i]
        assert (s["mask"][:s["n_prompt"]] == 0).all() and (s["mask"][s["n_prompt"]:] == 1).all(), i  # raw: n_prompt 0
        assert ((s["ids"] >= 0) & (s["ids"] < m["target"]["vocab_size"])).all(), i
        toks += len(s["ids"])
        gen += int(s["mask"].sum())
    print(f"{sys.argv[1]}: {len(c)} sequences, {toks} tokens ({gen} generated), taps {m['tap_layers']} x "
          f"hidden {m['hidden_size']} bf16, {len(c.shards)} shards, complete {m['complete']}; "
          f"seq 0 final_hidden[0][:4] = {bf16_to_f32(c[0]['final_hidden'][0][:4])}")


if __name__ == "__main__":
    main()
