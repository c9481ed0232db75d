#!/usr/bin/env bash
# Device run for the Qwen3-8B-shaped synthetic checkpoint: builds the CLI
# with the CUDA backend, writes the checkpoint (+ drafter) with `dspark synth`,
# times it with `dspark bench --backend cuda`, then times Hugging Face
# transformers' AR decode on the same files (bench/hf_decode.py).
# Logs go to $OUT (default ./build-cuda-syn/logs).
# Usage: source .devdata/devenv.sh && bash bench/run_synth_cuda.sh -DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG
set -uo pipefail
cd "$(dirname "$0")/.."
B=build-cuda-syn
OUT=${OUT:-$B/logs}
M=${SYNTH_DIR:-/tmp/synth-qwen3-8b}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
df -h /tmp | tail -1
T0=$(date +%s)
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DDS_CUDA=ON "$@" >"$OUT/build.log" 2>&1 &&
  cmake --build $B -j16 --target dspark_cli >>"$OUT/build.log" 2>&1
rc=$?
grep -E "warning|error" "$OUT/build.log" | grep -v "^--" | head -20
echo "build rc=$rc ($(($(date +%s) - T0)) s)"
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }

timeout 200 ./$B/dspark synth --like qwen3-8b --out "$M" --drafter --seed 0 2>&1 | tee "$OUT/synth.log"
echo "synth rc=$? ($(($(date +%s) - T0)) s)"
ls -la "$M" "$M-dspark"

timeout 180 ./$B/dspark bench --backend cuda -m "$M" -d "$M-dspark" --prompt-len 64 --decode 64 \
  --assume-tau 3 --assume-tau 4 --assume-tau 5 --assume-tau 6 --json >"$OUT/bench.json" 2>"$OUT/bench.err"
echo "bench rc=$? ($(($(date +%s) - T0)) s)"
cat "$OUT/bench.err" "$OUT/bench.json"

PYTHONUNBUFFERED=1 timeout ${HF_TIMEOUT:-200} python3 bench/hf_decode.py "$M" --prompt-len 64 --new 64 2>"$OUT/hf.err" |
  tee "$OUT/hf.jsonl"
echo "hf rc=$? ($(($(date +%s) - T0)) s)"
tail -5 "$OUT/hf.err"
