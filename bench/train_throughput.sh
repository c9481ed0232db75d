#!/usr/bin/env bash
# Issue 41, must-show 3: training throughput, `dspark train --backend cuda` vs DeepSpec's PyTorch trainer
# (bench/train_deepspec.py) on the same GPU and the same datagen cache, in one device call.
#   here:   bash bench/make_devdata.sh      (also packs DeepSpec's source: .devdata/deepspec.tar.xz)
#   device: bash bench/train_throughput.sh  (carry the .devdata files gpu_check.sh names, + deepspec.tar.xz)
# Logs and JSON in $OUT (or /tmp/train_tp). Knobs: PROMPTS (sequences in the cache, default 512), BATCH (64),
# STEPS (timed, 30), NEW (tokens generated a prompt, 192).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/train_tp}
source bench/device_lib.sh
PROMPTS=${PROMPTS:-512} BATCH=${BATCH:-64} STEPS=${STEPS:-30} NEW=${NEW:-192}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ds_build || exit 1
t "built"
mkdir -p /tmp/deepspec && tar -xJf .devdata/deepspec.tar.xz -C /tmp/deepspec
# The cache: pico's continuations of the train prompts (T 0.7, top-p 0.9, as the reference recipe), batched on the GPU.
python3 - "$PROMPTS" <<'PY' >/tmp/train_prompts.jsonl
import json, sys
lines = open("testdata/train/train.jsonl").read().splitlines()
n = int(sys.argv[1])
for i in range(n): print(lines[i % len(lines)])
PY
C=/tmp/tp_cache
rm -rf $C
./$B/dspark datagen --backend cuda --batch 64 --prompt-file /tmp/train_prompts.jsonl --out $C -n $NEW --temp 0.7 \
  --top-p 0.9 --ignore-eos >"$OUT/datagen.log" 2>&1
t "datagen rc=$? ($(tail -1 "$OUT/datagen.log"))"
D=models/pico-qwen3-dspark
ours() { # label, extra args
  rm -rf /tmp/tp_out_$1
  ./$B/dspark train --backend cuda -d $D --data $C --out /tmp/tp_out_$1 --steps $((STEPS + 5)) --batch $BATCH \
    --val-frac 0 --quiet "${@:2}" >"$OUT/ours_$1.log" 2>&1
  t "ours $1 rc=$? $(grep -h 'trained' "$OUT/ours_$1.log")"
}
theirs() { # label, extra args
  timeout 900 python3 bench/train_deepspec.py --deepspec /tmp/deepspec --cache $C --drafter $D --batch $BATCH \
    --steps $STEPS --warmup 5 "${@:2}" >"$OUT/deepspec_$1.json" 2>"$OUT/deepspec_$1.err"
  t "deepspec $1 rc=$? $(cat "$OUT/deepspec_$1.json")"; tail -3 "$OUT/deepspec_$1.err"
}
ours micro1 --micro 1
ours batch --micro $BATCH
ours micro1_tf32 --micro 1 --tf32
theirs local1 --local 1
theirs local1_compile --local 1 --compile
theirs batch --local $BATCH
ours micro1_again --micro 1
