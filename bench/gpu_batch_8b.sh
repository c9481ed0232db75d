#!/usr/bin/env bash
# Issue 39, must-shows 3 and 5 on one device call: the batched engine at the
# Qwen3-8B shape (dspark synth: random bf16 weights of the real shapes, with
# a DSpark drafter), acceptance simulated from two profiles (the pico pair's
# measured per-position acceptance; tau 3.7 at gamma 7, the paper's MT-Bench
# T=1 figure), output tokens/s for AR, fixed gamma and Algorithm 1 at
# concurrency LEVELS, at T = 0 and T = 1; then 256 requests of 1k-token
# contexts (must-show 5's memory), AR only. Row invariance on (DS_CUDA_INVARIANT
# =1) unless INV=0. Logs and JSON in $OUT.
#   run (carry [".devdata/root.tar.xz", ".devdata/tls.tar.xz", ".devdata/devenv.sh"]): bash bench/gpu_batch_8b.sh
# Env: LEVELS (default 1,8,32,64,128,256), DECODE (default 64), PROFILES (default "pico-dspark mtbench-t1"),
#      TEMPS (default "0 1"), SKIP_MEM=1 (no 1k-context run), INV (default 1).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
LEVELS=${LEVELS:-1,8,32,64,128,256}
DECODE=${DECODE:-64}
export DS_CUDA_INVARIANT=${INV:-1}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
ds_build dspark_cli || exit 1 # incremental: a warm machine's build follows the tree
M=$M8
ds_synth_8b
t "model ready (invariant $DS_CUDA_INVARIANT)"
for prof in ${PROFILES:-pico-dspark mtbench-t1}; do
  for temp in ${TEMPS:-0 1}; do
    l=${prof}_T$temp
    timeout 300 ./$B/dspark bench --concurrency $LEVELS --backend cuda -m $M -d $M-dspark --temp $temp \
      --sim-acceptance bench/profiles/$prof.json --prompt-len 128 --decode $DECODE --sps-cache $OUT/sps.json \
      >"$OUT/bench_$l.txt" 2>"$OUT/bench_$l.err"
    t "$l rc=$?"; cat "$OUT/bench_$l.txt"; tail -3 "$OUT/bench_$l.err"
  done
done
if [ -z "${SKIP_MEM:-}" ]; then
  timeout 300 ./$B/dspark bench --concurrency 256 --arms ar --backend cuda -m $M -d $M-dspark --prompt-len 1000 \
    --decode 24 >"$OUT/bench_mem.txt" 2>"$OUT/bench_mem.err"
  t "256 x 1k contexts rc=$?"; cat "$OUT/bench_mem.txt"; tail -8 "$OUT/bench_mem.err"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
fi
