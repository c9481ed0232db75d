#!/usr/bin/env python3
"""Writes the STS prompt set (testdata/sts/cal.jsonl, testdata/sts/eval.jsonl):
short text passages of the pico corpus's TRAIN split, for `dspark calibrate`
(calibrate on one half, evaluate on the other; bench/RESULTS.md).

Deterministic: a fixed seed, the sources taken in turn (Austen, KJV, State of
the Union, Python stdlib), a document drawn from the split's train list, a
passage from a random word start, cut at the last whitespace before CHARS
characters. Passages alternate between the halves, so each half has every
source equally. The held-out documents are not in the corpus file (they are
kept for evaluation), so both halves are training text: the confidence head
is calibrated and evaluated where the drafter was trained, like the prompts
DeepSpec's evaluation draws from its training mixture's domains.

    python3 scripts/make_sts_prompts.py [CORPUS.jsonl.xz] [SPLIT.json] [OUT_DIR]
"""
import json
import lzma
import random
import sys

SEED = 20260107
PROMPTS = 320  # 160 a half
CHARS = 200


def main():
    corpus = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/corpus/train.jsonl.xz"
    split = sys.argv[2] if len(sys.argv) > 2 else "/work/shared/models/corpus-split.json"
    out = sys.argv[3] if len(sys.argv) > 3 else "testdata/sts"
    with open(split, encoding="utf-8") as f:
        sources = json.load(f)["sources"]
    docs = {}
    with lzma.open(corpus, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            docs[d["name"]] = d["text"]
    rng = random.Random(SEED)
    order = sorted(sources)
    halves = ([], [])
    for i in range(PROMPTS):
        source = order[i % len(order)]
        train = [n for n in sources[source]["train"] if n in docs and len(docs[n]) > 4 * CHARS]
        name = rng.choice(train)
        text = docs[name]
        at = rng.randrange(0, len(text) - 2 * CHARS)
        while at > 0 and not text[at - 1].isspace():  # back to a word's start
            at -= 1
        passage = text[at : at + CHARS]
        cut = max(passage.rfind(" "), passage.rfind("\n"))
        passage = passage[:cut] if cut > CHARS // 2 else passage
        half = i % 2
        halves[half].append({"id": f"sts-{'ce'[half]}{len(halves[half]):03d}", "doc": name, "char_offset": at,
                             "prompt": passage})
    for half, name in enumerate(("cal", "eval")):
        with open(f"{out}/{name}.jsonl", "w", encoding="utf-8") as f:
            for row in halves[half]:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
