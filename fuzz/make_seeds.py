#!/usr/bin/env python3
"""Writes the seed corpora under build-fuzz/corpus/<harness>/ from the repository's
real inputs (shrunk to stay small) plus hand-made broken ones. Run from the
repository root: python3 fuzz/make_seeds.py [HARNESS...]. The committed corpora are these
seeds merged with what fuzzing found (fuzz/README.md)."""
import json
import lzma
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "build-fuzz", "corpus")  # then: bash fuzz/corpus.sh pack <harness>
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


# ---- config.json -----------------------------------------------------------
def config_seeds():
    real = {"qwen3_tiny_target": "testdata/fixtures/qwen3-tiny/target/config.json",
            "qwen3_tiny_drafter": "testdata/fixtures/qwen3-tiny/drafter/config.json",
            "gemma4_tiny_target": "testdata/fixtures/gemma4-tiny/target/config.json",
            "gemma4_tiny_drafter": "testdata/fixtures/gemma4-tiny/drafter/config.json",
            "gemma4_e_tiny_target": "testdata/fixtures/gemma4-e-tiny/target/config.json",
            "pico_qwen3": "models/pico-qwen3/config.json",
            "pico_qwen3_dspark": "models/pico-qwen3-dspark/config.json",
            "pico_qwen3_dflash": "models/pico-qwen3-dflash/config.json",
            "gemma4_12b": "testdata/configs/gemma-4-12B.config.json"}
    loaded = {}
    for name, rel in real.items():
        with open(os.path.join(ROOT, rel), "rb") as f:
            raw = f.read()
        put("config", "real_" + name, raw)
        loaded[name] = json.loads(raw)

    def variant(base, name, **changes):
        cfg = dict(loaded[base])
        for k, v in changes.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        put("config", name, json.dumps(cfg, indent=1))

    variant("qwen3_tiny_target", "bad_layers_1e9", num_hidden_layers=1e9)
    variant("qwen3_tiny_target", "bad_vocab_2p32", vocab_size=2**32 + 512)
    variant("qwen3_tiny_target", "bad_hidden_string", hidden_size="64")
    variant("qwen3_tiny_target", "bad_heads_not_multiple", num_key_value_heads=3)
    variant("qwen3_tiny_target", "bad_head_dim_odd", head_dim=15)
    variant("qwen3_tiny_target", "bad_no_vocab", vocab_size=None)
    variant("qwen3_tiny_target", "bad_rope_theta_zero", rope_parameters={"rope_theta": 0, "rope_type": "default"})
    variant("qwen3_tiny_target", "bad_rope_type", rope_parameters={"rope_theta": 1e6, "rope_type": "yarn"})
    variant("qwen3_tiny_target", "bad_eos_list", eos_token_id=[1, 2.5])
    variant("qwen3_tiny_target", "ok_eos_list", eos_token_id=[1, 2, 511, 512, -1])
    variant("qwen3_tiny_target", "bad_architecture", architectures=["LlamaForCausalLM"], model_type="llama")
    variant("qwen3_tiny_drafter", "bad_block_size_0", block_size=0)
    variant("qwen3_tiny_drafter", "bad_taps_out_of_range", target_layer_ids=[0, 7])
    variant("qwen3_tiny_drafter", "bad_taps_empty", target_layer_ids=[])
    variant("qwen3_tiny_drafter", "bad_markov_type", markov_rank=4, markov_head_type="lstm")
    variant("qwen3_tiny_drafter", "bad_markov_no_type", markov_rank=4, markov_head_type=None)
    variant("qwen3_tiny_drafter", "bad_mask_outside", mask_token_id=100000)
    variant("qwen3_tiny_drafter", "bad_conf_without_markov", markov_rank=0, enable_confidence_head=True,
            confidence_head_with_markov=True)
    variant("gemma4_tiny_target", "bad_layer_types_short", layer_types=["sliding_attention"])
    variant("gemma4_tiny_target", "bad_activation", hidden_activation="relu")
    variant("gemma4_tiny_target", "bad_moe", enable_moe_block=True, num_experts=8)
    variant("gemma4_tiny_target", "bad_kv_shared_all", num_kv_shared_layers=1000)
    variant("gemma4_tiny_drafter", "bad_softcap_string", final_logit_softcapping="30")
    put("config", "bad_not_object", "[1, 2, 3]")
    put("config", "bad_truncated", '{"model_type": "qwen3", "vocab_size": 5')
    put("config", "bad_empty", "")


# ---- tokenizer.json ---------------------------------------------------------
def tok_slice(t, keep_vocab, keep_added=24):
    """A real tokenizer cut to its first keep_vocab ids, the merges among
    them and a few added tokens renumbered after them (the post-processor's
    ids follow), so it stays a loadable tokenizer of the same kind."""
    t = json.loads(json.dumps(t))
    m = t["model"]
    m["vocab"] = {k: v for k, v in m["vocab"].items() if v < keep_vocab}
    merges = []
    for mg in m.get("merges", []):
        a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
        if a in m["vocab"] and b in m["vocab"] and a + b in m["vocab"]:
            merges.append(mg)
    m["merges"] = merges
    remap, added, nxt = {}, [], keep_vocab
    for a in t.get("added_tokens") or []:
        if a["id"] < keep_vocab:
            added.append(a)
        elif len(added) < keep_added:
            remap[a["id"]] = nxt
            a["id"] = nxt
            nxt += 1
            added.append(a)
    t["added_tokens"] = added

    def fix_ids(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k == "ids" and isinstance(v, list):
                    o[k] = [remap.get(i, i) if isinstance(i, int) else i for i in v]
                elif k == "id" and isinstance(v, int):
                    o[k] = remap.get(v, v)
                else:
                    fix_ids(v)
        elif isinstance(o, list):
            for v in o:
                fix_ids(v)
    fix_ids(t.get("post_processor"))
    return t


def tokenizer_seeds():
    for name, keep in [("qwen3", 700), ("llama3", 700), ("gemma3", 450), ("llama2", 800), ("pico-qwen3", 900)]:
        with lzma.open(os.path.join(ROOT, "testdata/tokenizers", name, "tokenizer.json.xz")) as f:
            t = json.load(f)
        put("tokenizer", "real_" + name.replace("-", "_"), json.dumps(tok_slice(t, keep), ensure_ascii=False))
    with lzma.open(os.path.join(ROOT, "testdata/tokenizers/pico-qwen3/tokenizer.json.xz")) as f:
        pico = tok_slice(json.load(f), 300)

    def variant(name, edit):
        t = json.loads(json.dumps(pico))
        edit(t)
        put("tokenizer", name, json.dumps(t, ensure_ascii=False))

    variant("bad_unigram", lambda t: t["model"].update(type="Unigram"))
    variant("bad_merge_unknown", lambda t: t["model"]["merges"].insert(0, ["zzz", "qqq"]))
    variant("bad_merge_shape", lambda t: t["model"]["merges"].insert(0, ["a"]))
    variant("bad_vocab_negative", lambda t: t["model"]["vocab"].update({"neg": -5}))
    variant("bad_vocab_huge_id", lambda t: t["model"]["vocab"].update({"huge": 2**31}))
    variant("bad_vocab_duplicate_id", lambda t: t["model"]["vocab"].update({"dup": 7}))
    variant("bad_regex", lambda t: t["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex="(?<!a+)[b"))
    variant("bad_normalizer_type", lambda t: t.update(normalizer={"type": "Lowercase2"}))
    variant("bad_decoder_type", lambda t: t.update(decoder={"type": "WordPiece"}))
    variant("bad_added_id_outside", lambda t: t["added_tokens"].append(
        {"id": 10**9, "content": "<big>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}))
    variant("bad_added_not_string", lambda t: t["added_tokens"].append({"id": 301, "content": 5, "special": True}))
    variant("bad_post_processor", lambda t: t.update(post_processor={"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<nope>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {}}))
    variant("ok_no_normalizer_no_decoder", lambda t: t.update(normalizer=None, decoder=None))
    put("tokenizer", "bad_not_json", '{"model": {"type": "BPE", "vocab": {"a": 0')
    put("tokenizer", "bad_trailing", '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}} x')
    put("tokenizer", "ok_minimal", '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}')


# ---- --prompt-file (JSON Lines) -------------------------------------------------
def prompt_seeds():
    with open(os.path.join(ROOT, "models/prompts-dev.jsonl"), encoding="utf-8") as f:
        dev = f.read().splitlines()
    put("prompt_file", "real_dev_first4", "\n".join(dev[:4]) + "\n")
    chats = []
    for fam in ("qwen3", "gemma3", "gemma4"):
        with open(os.path.join(ROOT, "testdata/chat", fam + ".jsonl"), encoding="utf-8") as f:
            for line in f.read().splitlines()[:3]:
                chats.append(json.dumps({"id": json.loads(line)["id"], "messages": json.loads(line)["messages"]},
                                        ensure_ascii=False))
    put("prompt_file", "real_chat_messages", "\n".join(chats) + "\n")
    put("prompt_file", "ok_kinds", '{"prompt": "It is a truth universally acknowledged"}\n\n'
        '{"input_ids": [1, 2, 3], "id": 7}\r\n   \n'
        '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "id": null}\n'
        '{"input_ids": [0], "prompt": "ids win", "id": {"a": [1]}}')
    put("prompt_file", "ok_unicode", r'{"prompt": "h\u00e9llo \u4e2d\u6587 \ud83d\ude00"}' + "\n")
    put("prompt_file", "ok_alternation", '{"messages": [{"role": "user", "content": "a"}, '
        '{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}')
    put("prompt_file", "bad_fractional_id", '{"input_ids": [1, 2.5]}\n')
    put("prompt_file", "bad_huge_id", '{"input_ids": [1e300]}\n')
    put("prompt_file", "bad_negative_id", '{"input_ids": [-1]}\n')
    put("prompt_file", "bad_empty_ids", '{"input_ids": []}\n')
    put("prompt_file", "bad_ids_not_list", '{"input_ids": "1 2 3"}\n')
    put("prompt_file", "bad_trailing_text", '{"prompt": "a"} {"prompt": "b"}\n')
    put("prompt_file", "bad_not_object", '["prompt", "a"]\n')
    put("prompt_file", "bad_no_prompt", '{"text": "a"}\n')
    put("prompt_file", "bad_role", '{"messages": [{"role": "tool", "content": "x"}]}\n')
    put("prompt_file", "bad_message_content", '{"messages": [{"role": "user", "content": 5}]}\n')
    put("prompt_file", "bad_messages_empty", '{"messages": []}\n')
    put("prompt_file", "bad_invalid_utf8", b'{"prompt": "\xff\xfe"}\n')
    put("prompt_file", "bad_nul_in_line", b'{"prompt": "a\x00b"}\n')
    put("prompt_file", "bad_second_line", '{"prompt": "fine"}\n{"prompt": \n')
    put("prompt_file", "bad_all_blank", "\n  \n\t\n")
    put("prompt_file", "bad_empty", "")


# ---- quantized checkpoints (fuzz_quant) -------------------------------------
def quant_seeds():
    fix = os.path.join(ROOT, "testdata", "fixtures")
    q4 = json.load(open(os.path.join(fix, "qwen3-tiny-quant", "target-q4g32", "config.json")))
    put("quant", "ok_qwen3_q4g32", json.dumps(q4, indent=2))
    put("quant", "bad_q8g64_config_on_q4_words", open(os.path.join(fix, "qwen3-tiny-quant", "target-q8g64", "config.json")).read())
    put("quant", "ok_gemma4_q4g32", open(os.path.join(fix, "gemma4-tiny-quant", "target-q4g32", "config.json")).read())
    put("quant", "ok_drafter_q8g32", open(os.path.join(fix, "qwen3-tiny-quant", "drafter-q8g32", "config.json")).read())

    def variant(name, **kw):
        c = dict(q4)
        for k, v in kw.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        put("quant", name, json.dumps(c))

    g = {"group_size": 32, "bits": 4}
    variant("bad_bits_3", quantization={"group_size": 32, "bits": 3}, quantization_config=None)
    variant("bad_group_48", quantization={"group_size": 48, "bits": 4}, quantization_config=None)
    variant("bad_bits_8_on_4bit_words", quantization={"group_size": 32, "bits": 8}, quantization_config=None)
    variant("bad_mode", quantization=dict(g, mode="mxfp4"), quantization_config=None)
    variant("bad_no_block", quantization=None, quantization_config=None)
    variant("bad_block_not_object", quantization=[32, 4], quantization_config=None)
    variant("bad_bits_string", quantization={"group_size": 32, "bits": "4"}, quantization_config=None)
    variant("bad_override_group", quantization=dict(g, **{"model.layers.1.mlp.down_proj": {"group_size": 64, "bits": 4}}),
            quantization_config=None)
    variant("bad_override_false", quantization=dict(g, **{"model.layers.0.self_attn.q_proj": False}), quantization_config=None)
    variant("bad_override_number", quantization=dict(g, **{"lm_head": 4}), quantization_config=None)
    variant("ok_config_copy_only", quantization=None, quantization_config=g)
    # Whole model.safetensors files (the weights mode): the quantized fixture itself and copies with one
    # tensor's dtype changed, over the 100 KB the other seeds keep to (a valid file holds every tensor; xz
    # packs the copies to little), and the header alone.
    st = open(os.path.join(fix, "qwen3-tiny-quant", "target-q4g32", "model.safetensors"), "rb").read()
    path = os.path.join(CORPUS, "quant")
    with open(os.path.join(path, "st_ok_qwen3_q4g32"), "wb") as f:
        f.write(st)
    n = struct.unpack("<Q", st[:8])[0]
    hdr = json.loads(st[8:8 + n])
    put("quant", "st_bad_header_only", st[:8 + n])
    for name in ("lm_head.scales", "model.layers.0.self_attn.q_proj.weight"):
        h = dict(hdr)
        t = dict(h[name])
        t["dtype"] = "F16" if name.endswith("scales") else "F32"
        h[name] = t
        with open(os.path.join(path, "st_bad_dtype_" + name.replace(".", "_")), "wb") as f:
            f.write(st_file(h, st[8 + n:]))


def main():
    import sys
    which = sys.argv[1:] or ["safetensors", "config", "tokenizer", "prompt_file", "quant"]
    seeds = {"safetensors": safetensors_seeds, "config": config_seeds, "tokenizer": tokenizer_seeds,
             "prompt_file": prompt_seeds, "quant": quant_seeds}
    for w in which:
        seeds[w]()


if __name__ == "__main__":
    main()
