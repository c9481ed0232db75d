#!/usr/bin/env bash
# Writes the real Qwen3 tokenizer (testdata/tokenizers/qwen3: tokenizer.json + tokenizer_config.json) into a
# checkpoint directory that has none (`dspark synth` writes none; llama.cpp's converter needs one; dspark
# ignores it). usage: bash bench/put_qwen3_tokenizer.sh DIR   (exit 0 and nothing written if DIR has one)
set -euo pipefail
dir=$1
src="$(cd "$(dirname "$0")/.." && pwd)/testdata/tokenizers/qwen3"
[ -f "$dir/tokenizer.json" ] && exit 0
python3 - "$src" "$dir" <<'PY'
import lzma, sys
src, dst = sys.argv[1], sys.argv[2]
for name in ("tokenizer.json", "tokenizer_config.json"):
    with lzma.open(f"{src}/{name}.xz") as f, open(f"{dst}/{name}", "wb") as g:
        g.write(f.read())
PY
