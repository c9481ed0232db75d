#!/usr/bin/env bash
# Builds the CUDA backend, runs its op tests and the golden tests on the
# GPU (DS_BACKEND=cuda), then times the pico pair through the CLI: plain
# autoregressive decoding and drafted runs (DSpark, DFlash), 32 dev prompts,
# 128 new tokens each. Logs go to $OUT (default ./build-cuda/logs).
# Usage: bash bench/run_cuda.sh [extra cmake args]
set -uo pipefail
cd "$(dirname "$0")/.."
B=build-cuda
OUT=${OUT:-$B/logs}
mkdir -p "$OUT"
J=$(nproc)

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
nvcc --version | tail -2

cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DDS_CUDA=ON "$@" >"$OUT/build.log" 2>&1 &&
  cmake --build $B -j"$J" >>"$OUT/build.log" 2>&1
rc=$?
grep -E "warning|error" "$OUT/build.log" | grep -v "^--" | head -20
echo "build rc=$rc"
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }

# The op tests, a program per op family of src/backend/cuda/, each against the CPU backend.
for t in elementwise matmul attention norm_rope sample markov; do
    timeout 300 ./$B/tests/test_cuda_$t >"$OUT/test_cuda_$t.log" 2>&1
    echo "test_cuda_$t rc=$?"
    cat "$OUT/test_cuda_$t.log"
done
# The ops timed alone: matmul bandwidth, the 8B's projections, a sampled round (the op tests' config).
timeout 300 ./$B/bench/bench_cuda_ops --test-config >"$OUT/bench_cuda_ops.log" 2>&1
echo "bench_cuda_ops rc=$?"
cat "$OUT/bench_cuda_ops.log"

# CUDA graphs (step regions) against the same GPU op by op, bit for bit.
timeout 300 ./$B/tests/test_cuda_graphs >"$OUT/test_cuda_graphs.log" 2>&1
echo "test_cuda_graphs rc=$?"
cat "$OUT/test_cuda_graphs.log"

# Sampling at T > 0 on the GPU: the ops against the host path on the same device logits, and the
# statistical losslessness test through the GPU path.
DS_BACKEND=cuda timeout 300 ./$B/tests/test_sample_ops >"$OUT/test_sample_ops.log" 2>&1
echo "test_sample_ops (DS_BACKEND=cuda) rc=$?"
grep -vE "^ok " "$OUT/test_sample_ops.log" | head -20
DS_BACKEND=cuda DS_TEST_QUICK=1 timeout 300 ./$B/tests/test_lossless_sampling >"$OUT/test_lossless_cuda.log" 2>&1
echo "test_lossless_sampling (DS_BACKEND=cuda, quick) rc=$?"
tail -12 "$OUT/test_lossless_cuda.log"

DS_BACKEND=cuda timeout 420 ctest --test-dir $B -R '^test_(qwen3|dspark|gemma4|dspark_gemma4|pico)$' -j4 -V \
  >"$OUT/golden_cuda.log" 2>&1
echo "golden tests (DS_BACKEND=cuda) rc=$?"
grep -E "rel err|err |agree|tau|Test +#|tests passed|FAIL" "$OUT/golden_cuda.log" | sed 's/^[0-9]*: //' | head -60

P=models/prompts-dev.jsonl
run() { # name, args...
  local name=$1
  shift
  timeout 240 ./$B/dspark generate --backend cuda --json --prompt-file $P -n 128 "$@" >"$OUT/gen_$name.jsonl" 2>&1
  echo "$name rc=$? $(tail -1 "$OUT/gen_$name.jsonl")"
}
run ar --no-draft
run ar2 --no-draft
run dspark
run dflash -d models/pico-qwen3-dflash
run dspark_thr05 --threshold 0.5

# Graphs off vs on (DS_CUDA_GRAPHS): the pico pair's steps, where launches dominate.
for g in 0 1; do
  DS_CUDA_GRAPHS=$g timeout 240 ./$B/dspark bench --backend cuda -m models/pico-qwen3 -d models/pico-qwen3-dspark \
    --prompt-len 200 --decode 128 >"$OUT/bench_graphs$g.txt" 2>&1
  echo "bench DS_CUDA_GRAPHS=$g rc=$?"
  grep -E "graphs|AR decode|bare step|verify +n=(1|8) |draft |drafted" "$OUT/bench_graphs$g.txt"
done
