#!/usr/bin/env bash
# The batched engine at the Qwen3-8B shape, a base tree against the working tree in one device call: both
# built (the base in /tmp/base), then `dspark bench` for each in turn, REPS times alternately, on the same
# synthetic checkpoint (dspark synth; simulated acceptance PROFILE). Output tokens/s per arm and concurrency.
#   run (carry [".devdata/root.tar.xz", ".devdata/tls.tar.xz", ".devdata/devenv.sh"]): BASE=HEAD bash bench/gpu_ab_8b.sh
# On the device git holds the session's first commit: BASE=HEAD is the tree the session started from.
# Env: BASE (required), LEVELS (default 8,64,256), ARMS (default ar,fixed,confidence), TEMP (default 1),
#      INV (DS_CUDA_INVARIANT, default 0), REPS (default 1), PROFILE (default mtbench-t1), DECODE (default 64).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
: "${BASE:?BASE=REV: the tree to compare with}"
export DS_CUDA_INVARIANT=${INV:-0}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
ds_build dspark_cli || exit 1
t "tree built"
rm -rf /tmp/base && mkdir -p /tmp/base && git archive "$BASE" | tar -x -C /tmp/base &&
  (cd /tmp/base && OUT=$OUT/base && mkdir -p "$OUT" && B=build && ds_build dspark_cli) || { t "base build failed"; exit 1; }
t "base $BASE built"
ds_synth_8b
t "synth rc=$?"
for rep in $(seq "${REPS:-1}"); do
  for which in base tree; do
    bin=./$B/dspark
    [ $which = base ] && bin=/tmp/base/build/dspark
    l=${which}_$rep
    timeout 240 $bin bench --concurrency "${LEVELS:-8,64,256}" --arms "${ARMS:-ar,fixed,confidence}" --backend cuda \
      -m $M8 -d $M8-dspark --temp "${TEMP:-1}" --sim-acceptance bench/profiles/${PROFILE:-mtbench-t1}.json \
      --prompt-len 128 --decode "${DECODE:-64}" --sps-cache "$OUT/sps_$which.json" >"$OUT/$l.txt" 2>"$OUT/$l.err"
    t "$l rc=$?"
    cat "$OUT/$l.txt"
    tail -2 "$OUT/$l.err"
  done
done
t "done"
