#!/usr/bin/env python3
"""A numpy re-implementation of MLX's affine quantization (mx.quantize /
mx.dequantize, mode "affine", as mlx-lm saves a quantized model), kept out of
the build: it makes the reference checkpoints `dspark quantize` must equal
byte for byte, and golden logits of the dequantized weights.

  mlx_quant_ref.py quantize  -m DIR --bits 4|8 [--group 64] [--skip PAT]... --out DIR
  mlx_quant_ref.py dequantize -m QDIR --out DIR          # fp32 checkpoint of the dequantized values
  mlx_quant_ref.py fixture                               # testdata/fixtures/{qwen3,gemma4}-tiny-quant/
                                                         # (quantized checkpoints, golden logits, dequant_fnv.json)

What it follows (read from ml-explore/mlx, written anew here):
- the quantizer is the CPU kernel `quantize` of mlx/backend/cpu/quantized.cpp,
  every step in fp32: scale = max((max - min) / (2^bits - 1), 1e-7), signed
  so that the edge of larger magnitude is hit exactly (q0 = rint(edge / scale),
  then scale = edge / q0, bias = edge; q0 == 0 keeps the scale, bias 0);
  q = clip(rint((w - bias) / scale), 0, 2^bits - 1); ties to even (std::rint);
  scales and biases are then cast to the weight's dtype (bf16: round to nearest
  even);
- packing (pack_and_quantize): 32 / bits values a uint32, the first in the
  lowest bits;
- which weights (mlx.nn.quantize with mlx-lm's predicate): Linear and Embedding
  weights whose last dimension the group size divides; at the safetensors level,
  2-D float tensors named *.weight with cols % group == 0 (norms are 1-D and stay);
- config.json gets "quantization": {"group_size", "bits"} and the same as
  "quantization_config" (mlx-lm writes both).
- dequantized value: one fp32 rounding of scale * q + bias (the product is
  exact for bf16 / f16 scales, so this is MLX's dequantize there).

Output tensors are written sorted by name, in the layout of
src/io/safetensors_write.c (header {"__metadata__":{"format":"pt"},...}
without spaces, padded with spaces to 8 bytes, data back to back).
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

DT = {"F32": np.float32, "F16": np.float16, "BF16": "bf16", "I64": np.int64, "I32": np.int32, "U32": np.uint32}


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """Round to nearest even (MLX's and torch's float -> bfloat16), NaN kept quiet."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def read_st(path):
    """{name: (dtype string, numpy array as stored: bf16 as uint16)} in file order."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        dt = v["dtype"]
        npdt = np.uint16 if dt == "BF16" else DT[dt]
        out[k] = (dt, np.frombuffer(data[a:b], dtype=npdt).reshape(v["shape"]))
    return out


def read_ckpt(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for f in files:
        out.update(read_st(os.path.join(d, f)))
    return out


def write_st(path, tensors):
    """tensors: {name: (dtype string, array)}; written sorted by name."""
    names = sorted(tensors, key=lambda s: s.encode())
    hdr = {"__metadata__": {"format": "pt"}}
    off = 0
    blobs = []
    for k in names:
        dt, a = tensors[k]
        b = np.ascontiguousarray(a).tobytes()
        hdr[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def as_f32(dt, a):
    if dt == "BF16":
        return bf16_to_f32(a)
    return a.astype(np.float32)


def from_f32(dt, x):
    if dt == "BF16":
        return f32_to_bf16(x)
    return x.astype(DT[dt])


def quantize(w, bits, group):
    """MLX's CPU quantize of a [N, K] fp32 array: (packed uint32 [N, K*bits/32], scales, biases fp32 [N, K/group])."""
    N, K = w.shape
    g = w.reshape(N, K // group, group).astype(np.float32)
    n_bins = np.float32((1 << bits) - 1)
    w_max = g.max(axis=-1)
    w_min = g.min(axis=-1)
    mask = np.abs(w_min) > np.abs(w_max)
    scale = np.maximum((w_max - w_min) / n_bins, np.float32(1e-7)).astype(np.float32)
    scale = np.where(mask, scale, -scale).astype(np.float32)
    edge = np.where(mask, w_min, w_max).astype(np.float32)
    q0 = np.rint(edge / scale).astype(np.float32)
    nz = q0 != 0
    scale = np.where(nz, edge / np.where(nz, q0, np.float32(1)), scale).astype(np.float32)
    bias = np.where(nz, edge, np.float32(0)).astype(np.float32)
    q = np.rint((g - bias[..., None]) / scale[..., None]).astype(np.float32)
    q = np.clip(q, 0, n_bins).astype(np.uint32).reshape(N, K)
    per = 32 // bits
    words = q.reshape(N, K // per, per) << (np.arange(per, dtype=np.uint32) * bits)
    packed = np.bitwise_or.reduce(words, axis=-1).astype(np.uint32)
    return packed, scale, bias


def dequantize(packed, scales, biases, bits, group):
    """fp32 [N, K]: one rounding of scale * q + bias (fp64 holds the product exactly)."""
    N = packed.shape[0]
    per = 32 // bits
    q = (packed[..., None] >> (np.arange(per, dtype=np.uint32) * bits)) & np.uint32((1 << bits) - 1)
    q = q.reshape(N, -1).astype(np.float64)
    K = q.shape[1]
    s = np.repeat(scales.astype(np.float64), group, axis=1)
    b = np.repeat(biases.astype(np.float64), group, axis=1)
    return (s * q + b).astype(np.float32).reshape(N, K)


def should_quantize(name, dt, a, group, skip):
    return (name.endswith(".weight") and a.ndim == 2 and dt in ("F32", "BF16", "F16") and a.shape[1] % group == 0
            and not any(p in name for p in skip))


def copy_side_files(src, dst):
    for f in sorted(os.listdir(src)):
        p = os.path.join(src, f)
        if (os.path.isfile(p) and not f.endswith(".safetensors") and f != "model.safetensors.index.json"
                and f != "config.json"):
            shutil.copyfile(p, os.path.join(dst, f))


def cmd_quantize(src, dst, bits, group, skip):
    ts = read_ckpt(src)
    out = {}
    for name, (dt, a) in ts.items():
        if not should_quantize(name, dt, a, group, skip):
            out[name] = (dt, a)
            continue
        packed, s, b = quantize(as_f32(dt, a), bits, group)
        base = name[: -len(".weight")]
        out[name] = ("U32", packed)
        out[base + ".scales"] = (dt, from_f32(dt, s))
        out[base + ".biases"] = (dt, from_f32(dt, b))
    os.makedirs(dst, exist_ok=True)
    write_st(os.path.join(dst, "model.safetensors"), out)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization"] = {"group_size": group, "bits": bits}
    cfg["quantization_config"] = {"group_size": group, "bits": bits}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    copy_side_files(src, dst)


def dequantized_tensors(qdir):
    ts = read_ckpt(qdir)
    cfg = json.load(open(os.path.join(qdir, "config.json")))
    q = cfg.get("quantization") or cfg.get("quantization_config")
    out = {}
    for name, (dt, a) in ts.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base and base + ".scales" in ts:
            over = q.get(base, q)
            sdt, s = ts[base + ".scales"]
            _, b = ts[base + ".biases"]
            out[name] = dequantize(a, as_f32(sdt, s), as_f32(sdt, b), over["bits"], over["group_size"])
        else:
            out[name] = as_f32(dt, a) if dt in ("F32", "BF16", "F16") else a
    return out, cfg


def cmd_dequantize(qdir, dst):
    ts, cfg = dequantized_tensors(qdir)
    cfg.pop("quantization", None)
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    os.makedirs(dst, exist_ok=True)
    write_st(os.path.join(dst, "model.safetensors"),
             {k: ("F32" if v.dtype == np.float32 else "I64", v) for k, v in ts.items()})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    copy_side_files(qdir, dst)


def qwen3_logits(ts, cfg, ids):
    """Qwen3ForCausalLM forward in fp32 (no cache): logits of every position."""
    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = np.float32(cfg["rms_norm_eps"])
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))
    T = len(ids)

    def norm(x, w):
        x = x.astype(np.float32)
        v = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return (x / np.sqrt(v + eps)).astype(np.float32) * w

    inv = (1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.int64).astype(np.float32) / hd))).astype(np.float32)
    ang = np.arange(T, dtype=np.float32)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # [T, heads, hd]
        h = hd // 2
        rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
        return (x * cos[:, None, :] + rot * sin[:, None, :]).astype(np.float32)

    x = ts["model.embed_tokens.weight"][ids].astype(np.float32)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        n = norm(x, ts[p + "input_layernorm.weight"])
        q = (n @ ts[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd)
        k = (n @ ts[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
        v = (n @ ts[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
        q = rope(norm(q, ts[p + "self_attn.q_norm.weight"]))
        k = rope(norm(k, ts[p + "self_attn.k_norm.weight"]))
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k).astype(np.float32) * np.float32(hd ** -0.5) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s = (s / s.sum(-1, keepdims=True)).astype(np.float32)
        a = np.einsum("hts,shd->thd", s, v).reshape(T, nh * hd).astype(np.float32)
        x = x + a @ ts[p + "self_attn.o_proj.weight"].T
        n = norm(x, ts[p + "post_attention_layernorm.weight"])
        g = n @ ts[p + "mlp.gate_proj.weight"].T
        u = n @ ts[p + "mlp.up_proj.weight"].T
        x = (x + ((g / (1 + np.exp(-g))) * u) @ ts[p + "mlp.down_proj.weight"].T).astype(np.float32)
    x = norm(x, ts["model.norm.weight"])
    head = ts["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else ts["lm_head.weight"]
    return (x @ head.T).astype(np.float32)


def fnv64(data):
    """FNV-1a, 64 bits (tests/pinned.c's pinned_fnv): the test checks the engine's dequantized bytes by it."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def dequant_hashes(qdir):
    """{weight name: FNV-1a of its dequantized fp32 bytes} for every quantized weight of qdir."""
    ts, _ = dequantized_tensors(qdir)
    raw = read_ckpt(qdir)
    return {k: "%016x" % fnv64(np.ascontiguousarray(v, dtype="<f4").tobytes())
            for k, v in sorted(ts.items()) if k.endswith(".weight") and k[: -len(".weight")] + ".scales" in raw}


def cmd_fixture(root):
    """testdata/fixtures/qwen3-tiny-quant/ from testdata/fixtures/qwen3-tiny/."""
    src = os.path.join(root, "testdata/fixtures/qwen3-tiny")
    out = os.path.join(root, "testdata/fixtures/qwen3-tiny-quant")
    gold = read_st(os.path.join(src, "golden.safetensors"))
    ids = gold["prompt_ids"][1].astype(np.int64)
    # The numpy forward first reproduces the torch goldens of the plain fixture.
    plain, pcfg = dequantized_tensors(os.path.join(src, "target"))
    ref = gold["target_logits_prompt"][1]
    mine = qwen3_logits(plain, pcfg, ids)
    err = float(np.max(np.abs(mine - ref)) / np.max(np.abs(ref)))
    assert err < 1e-5, "numpy forward vs torch golden: %g" % err
    golden = {"prompt_ids": ("I64", ids)}
    hashes = {}
    variants = [("target-q4g32", "target", 4, 32, []), ("target-q8g64", "target", 8, 64, ["lm_head"]),
                ("drafter-q8g32", "drafter-trained", 8, 32, [])]
    for name, what, bits, group, skip in variants:
        qd = os.path.join(out, name)
        cmd_quantize(os.path.join(src, what), qd, bits, group, skip)
        if what == "target":
            ts, cfg = dequantized_tensors(qd)
            golden["logits_" + name] = ("F32", qwen3_logits(ts, cfg, ids))
            hashes[name] = dequant_hashes(qd)
            print("%s: logits vs plain max |d| %.4g (max |logit| %.4g)" % (
                name, np.max(np.abs(golden["logits_" + name][1] - ref)), np.max(np.abs(ref))))
    write_st(os.path.join(out, "golden.safetensors"), golden)
    with open(os.path.join(out, "dequant_fnv.json"), "w") as f:
        json.dump(hashes, f, indent=1, sort_keys=True)
    # Gemma 4 (tied embeddings: the quantized table is the LM head too; k_eq_v): checked against the
    # engine on its dequantized fp32 copy (no numpy Gemma 4 forward here). The tests build the dequantized
    # copies themselves and check them against these hashes (fp32 copies would cost the checkout 1 MB each).
    src = os.path.join(root, "testdata/fixtures/gemma4-tiny")
    out = os.path.join(root, "testdata/fixtures/gemma4-tiny-quant")
    cmd_quantize(os.path.join(src, "target"), os.path.join(out, "target-q4g32"), 4, 32, [])
    with open(os.path.join(out, "dequant_fnv.json"), "w") as f:
        json.dump({"target-q4g32": dequant_hashes(os.path.join(out, "target-q4g32"))}, f, indent=1, sort_keys=True)
    cmd_quantize(os.path.join(src, "drafter-trained"), os.path.join(out, "drafter-q8g32"), 8, 32, [])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["quantize", "dequantize", "fixture"])
    ap.add_argument("-m")
    ap.add_argument("--out")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--skip", action="append", default=[])
    a = ap.parse_args()
    if a.cmd == "quantize":
        cmd_quantize(a.m, a.out, a.bits, a.group, a.skip)
    elif a.cmd == "dequantize":
        cmd_dequantize(a.m, a.out)
    else:
        cmd_fixture(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


if __name__ == "__main__":
    sys.exit(main())
