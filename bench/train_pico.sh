#!/usr/bin/env bash
# Issue 41, must-show 2: a DSpark drafter for pico-qwen3 trained from scratch on one GPU in <= 10 GPU-minutes
# (datagen included), tau at T=0 on the 32 dev prompts (the reference recipe's bundled drafter: 2.67), one call:
#   here:   python3 scripts/make_train_prompts.py --train 6000 --raw 0 --out-dir /tmp/tp6k &&
#           xz -9 -c /tmp/tp6k/train.jsonl > .devdata/train_prompts_6k.jsonl.xz
#   device: bash bench/train_pico.sh   (carry gpu_check.sh's .devdata files + train_prompts_6k.jsonl.xz)
# Knobs (env): PROMPTS (sequences, default 4096), NEW (tokens a continuation, 192), TEMP (datagen temperature,
# default 0: the greedy continuations the T=0 evaluation follows), STEPS (1500), BATCH (64), MICRO (8),
# ANCHORS (64), LR (6e-4), TF32 (1: --tf32). Phases timed; the sum is the GPU-minutes figure.
set -uo pipefail
cd "$(dirname "$0")/.."
source .devdata/devenv.sh
OUT=${OUT:-/tmp/train_pico}
mkdir -p "$OUT"
PROMPTS=${PROMPTS:-4096} NEW=${NEW:-192} TEMP=${TEMP:-0} STEPS=${STEPS:-1500} BATCH=${BATCH:-64} MICRO=${MICRO:-8}
ANCHORS=${ANCHORS:-64} LR=${LR:-6e-4} TF32=${TF32:-1}
PREC=(); [ "$TF32" = 1 ] && PREC=(--tf32)
T0=$(date +%s)
t() { echo "[$(($(date +%s) - T0)) s] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader
B=build-cuda
if [ ! -x $B/dspark ]; then
  cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DDS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG -DDS_SERVE=$DS_SERVE -DDS_OPENBLAS=${DS_OPENBLAS:-OFF} >"$OUT/build.log" 2>&1 &&
    cmake --build $B -j16 --target dspark_cli >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
t "built (not counted)"
xz -dc .devdata/train_prompts_6k.jsonl.xz | head -n "$PROMPTS" >/tmp/pico_prompts.jsonl
G0=$(date +%s)
C=/tmp/pico_cache; rm -rf $C
./$B/dspark datagen --backend cuda --batch 128 --prompt-file /tmp/pico_prompts.jsonl --out $C -n "$NEW" \
  --temp "$TEMP" --top-p 0.9 >"$OUT/datagen.log" 2>&1
t "datagen rc=$? $(tail -1 "$OUT/datagen.log")"
G1=$(date +%s)
D=/tmp/pico_drafter; rm -rf $D
./$B/dspark train --backend cuda --config models/pico-qwen3-dspark/config.json --data $C --out $D --steps "$STEPS" \
  --batch "$BATCH" --micro "$MICRO" --anchors "$ANCHORS" --lr "$LR" --val-frac 0.01 --eval-every 250 --quiet "${PREC[@]}" \
  >"$OUT/train.log" 2>&1
t "train rc=$? $(grep -h trained "$OUT/train.log")"
G2=$(date +%s)
echo "GPU time: datagen $((G1 - G0)) s + training $((G2 - G1)) s = $((G2 - G0)) s (budget 600 s)"
cp $D/loss.png $D/train_log.jsonl $D/config.json "$OUT/" 2>/dev/null
for dr in $D models/pico-qwen3-dspark; do
  ./$B/dspark generate --backend cuda -d $dr --prompt-file models/prompts-dev.jsonl -n 128 --json \
    >"$OUT/eval_$(basename $dr).jsonl" 2>/dev/null
  python3 - "$OUT/eval_$(basename $dr).jsonl" "$dr" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rounds = sum(r.get("rounds", 0) for r in rows)
tau = sum(r.get("acceptance_length", 0) * r.get("rounds", 0) for r in rows) / max(1, rounds)
print("%s: %d dev prompts, 128 new tokens, T=0: tau %.3f over %d rounds" % (sys.argv[2], len(rows), tau, rounds))
PY
done
t done
