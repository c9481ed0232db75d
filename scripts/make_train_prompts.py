#!/usr/bin/env python3
"""Writes prompt files for `dspark datagen` (drafter training data, issue 41):
passages of the pico corpus (../shared/corpus/train.jsonl.xz, the text
pico-qwen3 was trained on), split by DOCUMENT into a train and a validation
set of our own, so that no validation passage shares a document with a
training prompt.

As the reference recipe (../shared/models/gendata.json: prompts are random
windows of the train stream, 32..96 tokens), each prompt is a window of a
document starting at a word, 32..96 tokens long at ~4 characters a token
(the pico tokenizer's rate on this text), cut at the last whitespace. The
sources are taken in turn (Austen, KJV, State of the Union, Python stdlib),
so every source is equally represented. The dev prompts
(models/prompts-dev.jsonl) come from the held-out documents, which the corpus
file does not contain: neither split touches them.

raw.jsonl holds raw windows of the train documents (288 tokens at ~4
characters a token), for `dspark datagen --raw-file`: stored as they are with
the loss on every token, as the recipe mixes 1706 of them into its 5120
continuations.

Deterministic (fixed seed). The committed files are small (the defaults);
full-size sets are regenerated, e.g.

    python3 scripts/make_train_prompts.py --train 5120 --valid 256 --raw 1706 --out-dir /tmp/train

    python3 scripts/make_train_prompts.py [--corpus F.jsonl.xz] [--out-dir testdata/train]
                                          [--train N] [--valid N] [--raw N] [--valid-docs FRACTION] [--seed S]
"""
import argparse
import hashlib
import json
import lzma
import os
import random

CHARS_PER_TOKEN = 4
TOKENS = (32, 96)


def is_valid_doc(name, fraction):
    """A document's split, from its name alone (stable whatever else the corpus holds)."""
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


RAW_TOKENS = 288


def window(rng, text, tokens=None):
    chars = (tokens or rng.randint(TOKENS[0], TOKENS[1])) * CHARS_PER_TOKEN
    at = rng.randrange(0, len(text) - 2 * chars)
    while at > 0 and not text[at - 1].isspace():  # back to a word's start
        at -= 1
    passage = text[at : at + chars]
    cut = max(passage.rfind(" "), passage.rfind("\n"))
    return at, passage[:cut] if cut > chars // 2 else passage


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=os.path.join(here, "..", "..", "shared", "corpus", "train.jsonl.xz"))
    ap.add_argument("--out-dir", default=os.path.join(here, "..", "testdata", "train"))
    ap.add_argument("--train", type=int, default=192, help="training prompts (default 192: the committed file)")
    ap.add_argument("--valid", type=int, default=64, help="validation prompts (default 64)")
    ap.add_argument("--raw", type=int, default=32, help="raw train windows (default 32)")
    ap.add_argument("--valid-docs", type=float, default=0.08, help="fraction of documents held for validation")
    ap.add_argument("--seed", type=int, default=20261206)
    a = ap.parse_args()
    docs = {}
    with lzma.open(a.corpus, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if len(d["text"]) > 4 * TOKENS[1] * CHARS_PER_TOKEN:
                docs.setdefault(d["source"], []).append(d["name"])
                docs[d["name"]] = d["text"]
    sources = sorted(k for k in docs if "/" not in k)
    rng = random.Random(a.seed)
    os.makedirs(a.out_dir, exist_ok=True)
    for split, count in (("train", a.train), ("valid", a.valid), ("raw", a.raw)):
        names = {s: sorted(n for n in docs[s] if is_valid_doc(n, a.valid_docs) == (split == "valid")) for s in sources}
        if split == "raw":  # documents long enough for a raw window
            names = {s: [n for n in v if len(docs[n]) > 2 * RAW_TOKENS * CHARS_PER_TOKEN + 1] for s, v in names.items()}
        path = os.path.join(a.out_dir, f"{split}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for i in range(count):
                source = sources[i % len(sources)]
                name = rng.choice(names[source])
                at, passage = window(rng, docs[name], RAW_TOKENS if split == "raw" else None)
                row = {"id": f"{split}-{i:05d}", "doc": name, "char_offset": at, "prompt": passage}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{path}: {count} prompts from {sum(len(v) for v in names.values())} documents")


if __name__ == "__main__":
    main()
