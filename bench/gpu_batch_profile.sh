#!/usr/bin/env bash
# Issue 39: where a batched GPU step's time goes, in one device call (~7 min on a fresh machine).
#  1. build; test_cuda_markov / test_cuda_sample (the batched walks and verifications against each alone),
#     test_cuda_attention,
#     DS_BACKEND=cuda DS_CUDA_INVARIANT=1 test_batch (every request == its solo run);
#  2. at the Qwen3-8B shape (dspark synth; simulated mtbench-t1 acceptance), 64 in flight, T = 1:
#     DS_CUDA_PROFILE=1 per-op tables for AR and fixed gamma;
#     and the bundled pair (measured acceptance) at 1..64 in flight, T = 0 / 1 (must-show 4);
#  3. ncu on one launch mid-run: the paged attention (AR's decode rows, the staged kernel);
#  4. DS_BACKEND=cuda test_lossless_sampling (must-show 1's chi-square through the batched path).
#   run (carry [".devdata/root.tar.xz", ".devdata/tls.tar.xz", ".devdata/devenv.sh"]): bash bench/gpu_batch_profile.sh
# Logs in $OUT. SKIP_TESTS=1: parts 2 and 3 only. BASE=REV: part 2's profiles also from REV's tree (on the
# device, git there holds the session's first commit: BASE=HEAD is the tree this session started from),
# built in /tmp/base, run first.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
ds_build || exit 1
t "built"
if [ -z "${SKIP_TESTS:-}" ]; then
  for x in test_cuda_markov test_cuda_sample test_cuda_attention; do
    timeout 200 ./$B/tests/$x >"$OUT/$x.log" 2>&1
    t "$x rc=$?: $(tail -1 "$OUT/$x.log")"
  done
  grep -hE "_seqs|verify_sample_many|FAIL|failed" "$OUT"/test_cuda_*.log | head -20
  DS_BACKEND=cuda DS_CUDA_INVARIANT=1 timeout 240 ./$B/tests/test_batch >"$OUT/test_batch.log" 2>&1
  t "test_batch (invariant) rc=$?: $(tail -1 "$OUT/test_batch.log")"
fi
# Must-show 4: the bundled pair, measured acceptance, AR / fixed / Algorithm 1 at 1..64 in flight, T = 0 and 1.
for temp in 0 1; do
  timeout 150 ./$B/dspark bench --concurrency 1,8,32,64 --backend cuda --prompt-len 64 --decode 64 --temp $temp \
    >"$OUT/pico_T$temp.txt" 2>"$OUT/pico_T$temp.err"
  t "pico T=$temp rc=$?"; cat "$OUT/pico_T$temp.txt"; tail -2 "$OUT/pico_T$temp.err"
done
ds_synth_8b
t "synth rc=$?"
ARGS=(--concurrency 64 --backend cuda -m $M8 -d $M8-dspark --temp 1 --sim-acceptance bench/profiles/mtbench-t1.json
  --prompt-len 128 --decode 64)
BINS=(./$B/dspark)
if [ -n "${BASE:-}" ]; then
  rm -rf /tmp/base && mkdir -p /tmp/base && git archive "$BASE" | tar -x -C /tmp/base &&
    (cd /tmp/base && OUT=$OUT/base && mkdir -p $OUT && B=build && ds_build dspark_cli) &&
    BINS=(/tmp/base/build/dspark ./$B/dspark)
  t "base $BASE built: ${#BINS[@]} binaries"
fi
for bin in "${BINS[@]}"; do
  for arm in ar fixed; do
    l=$arm$([ "$bin" = "./$B/dspark" ] || echo _base)
    DS_CUDA_PROFILE=1 timeout 120 $bin bench --arms $arm "${ARGS[@]}" >"$OUT/$l.txt" 2>"$OUT/$l.err"
    t "$l rc=$?: $(tail -1 "$OUT/$l.txt")"
    grep -E "ms in ops|attention|markov|verify_sample|linear" "$OUT/$l.err" | head -12
  done
done
# Where a fixed-gamma step's time goes at 8 in flight (the drafter's share is larger there).
DS_CUDA_PROFILE=1 timeout 120 ./$B/dspark bench --arms fixed "${ARGS[@]}" --concurrency 8 >"$OUT/fixed8.txt" 2>"$OUT/fixed8.err"
t "fixed at 8 rc=$?: $(tail -1 "$OUT/fixed8.txt")"
sed -n '/dspark cuda profile/,$p' "$OUT/fixed8.err" | head -24
run_ncu() { # label kernel-regex launches-to-skip arm
  timeout 150 ncu --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    -k "regex:$2" --launch-skip "$3" --launch-count 1 ./$B/dspark bench --arms "$4" "${ARGS[@]}" >"$OUT/ncu_$1.txt" 2>&1
  t "ncu $1 rc=$?"
  grep -E "^  [a-z].*\(|Duration|Registers Per Thread|Achieved Occupancy|Waves Per SM|Warp Cycles Per Issued|DRAM Throughput|Compute \(SM\) Throughput" "$OUT/ncu_$1.txt"
  grep -iE "stall|bank" "$OUT/ncu_$1.txt" | head -4
}
run_ncu attention attn_staged 1200 ar
if [ -z "${SKIP_TESTS:-}" ]; then # must-show 1's chi-square through the GPU's batched path, Algorithm 1 on
  DS_BACKEND=cuda timeout 150 ./$B/tests/test_lossless_sampling >"$OUT/lossless.log" 2>&1
  t "test_lossless_sampling (cuda) rc=$?: $(tail -1 "$OUT/lossless.log")"
  grep -A1 "batched" "$OUT/lossless.log"
fi
t "done"
