#!/usr/bin/env bash
# One device call for the batched engine (src/batch/): its tests on the GPU,
# with and without DS_CUDA_INVARIANT, and `dspark bench --concurrency` on the
# bundled pair (measured acceptance) and at the Qwen3-8B shape (simulated
# acceptance, bench/profiles/), invariance off and on. Logs in $OUT.
#   run (carry [".devdata/root.tar.xz", ".devdata/tls.tar.xz", ".devdata/devenv.sh"]): bash bench/gpu_batch.sh [LEVELS]
# Reuses build-cuda/ and /tmp/synth-qwen3-8b from bench/gpu_check.sh on a warm machine.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
LEVELS=${1:-1,8,32,64}
ds_build || exit 1
t "built"
ctest --test-dir $B -R 'test_cuda_attention' --output-on-failure >"$OUT/ctest_attention.log" 2>&1
t "test_cuda_attention rc=$?"; grep -E "paged|passed|FAIL" "$OUT/ctest_attention.log" | head -20
for inv in 1 0; do
  DS_BACKEND=cuda DS_CUDA_INVARIANT=$inv timeout 300 ./$B/tests/test_batch >"$OUT/test_batch_inv$inv.log" 2>&1
  t "test_batch on the GPU, DS_CUDA_INVARIANT=$inv: rc=$?"
  grep -E "identical to solo|passed" "$OUT/test_batch_inv$inv.log" | awk '{print}' | head -40
done
M=$M8
ds_synth_8b
timeout 120 ./$B/dspark bench --concurrency $LEVELS --backend cuda --prompt-len 64 --decode 64 \
  >"$OUT/bench_pico.txt" 2>"$OUT/bench_pico.err"
t "bench pico rc=$?"; cat "$OUT/bench_pico.txt"; tail -3 "$OUT/bench_pico.err"
for inv in 0 1; do
  DS_CUDA_INVARIANT=$inv timeout 200 ./$B/dspark bench --concurrency $LEVELS --backend cuda -m $M -d $M-dspark \
    --sim-acceptance bench/profiles/mtbench-t1.json --prompt-len 128 --decode 32 \
    >"$OUT/bench_8b_inv$inv.txt" 2>"$OUT/bench_8b_inv$inv.err"
  t "bench qwen3-8b shape, simulated, DS_CUDA_INVARIANT=$inv rc=$?"; cat "$OUT/bench_8b_inv$inv.txt"
  tail -3 "$OUT/bench_8b_inv$inv.err"
done
