#!/usr/bin/env bash
# Issue 5's side-by-side run, all in ONE device call (~9 minutes on an H200
# machine with 16 cores), after the CUDA op checks and golden tests: dspark, llama.cpp and Hugging Face transformers on
# the same synthetic Qwen3-8B checkpoint, and dspark vs DeepSpec's own HF
# speculative loop on the bundled pico pair.
#
# CPU-heavy work overlaps GPU work where it cannot disturb a timing:
#   background: llama.cpp build (FA kernels off) -> convert to GGUF bf16
#   foreground: dspark build, synth, the pico runs (dspark, DeepSpec loop)
# then, with the CPU quiet, one GPU timing after another: dspark bench,
# llama-bench, transformers (eager, dynamic, static + torch.compile), and
# dspark bench again (the pair brackets the peers: drift shows).
#
# usage: source .devdata/devenv.sh
#        bash bench/run_side_by_side.sh -DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG
# Logs: $OUT (default build-cuda/logs); the summary is on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
B=build-cuda
OUT=${OUT:-$B/logs}
M=${SYNTH_DIR:-/tmp/synth-qwen3-8b}
mkdir -p "$OUT"
T0=$(date +%s)
t() { echo "[$(($(date +%s) - T0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader

# Background: llama.cpp build, then conversion once the checkpoint exists.
(
    LCPP_FA=OFF LCPP_STEPS=build LCPP_JOBS=12 OUT=$OUT/lcpp-build bash bench/run_llamacpp.sh "$M" >"$OUT/lcpp_build.txt" 2>&1
    while [ ! -f "$M.done" ]; do sleep 2; done
    LCPP_FA=OFF LCPP_STEPS=convert OUT=$OUT/lcpp-convert bash bench/run_llamacpp.sh "$M" >"$OUT/lcpp_convert.txt" 2>&1
    echo done >"$OUT/lcpp.ready"
) &

cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DDS_CUDA=ON "$@" >"$OUT/build.log" 2>&1 &&
    cmake --build $B -j4 >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
t "dspark built"
# Correctness first: the op checks and the golden tests on the GPU.
for t in elementwise matmul attention norm_rope sample markov; do
    timeout 120 ./$B/tests/test_cuda_$t >"$OUT/test_cuda_$t.log" 2>&1
    echo "test_cuda_$t rc=$? $(tail -1 "$OUT/test_cuda_$t.log")"
done
timeout 200 ./$B/tests/test_cuda_graphs >"$OUT/test_cuda_graphs.log" 2>&1
echo "test_cuda_graphs rc=$? $(tail -1 "$OUT/test_cuda_graphs.log")"
DS_BACKEND=cuda timeout 200 ./$B/tests/test_sample_ops >"$OUT/test_sample_ops.log" 2>&1
echo "test_sample_ops (DS_BACKEND=cuda) rc=$? $(tail -1 "$OUT/test_sample_ops.log")"
DS_BACKEND=cuda timeout 200 ctest --test-dir $B -R '^test_(qwen3|dspark|gemma4|pico)$' -j4 >"$OUT/golden.log" 2>&1
echo "golden tests (DS_BACKEND=cuda) rc=$? $(grep "tests passed" "$OUT/golden.log")"
t "tests done"
./$B/dspark synth --like qwen3-8b --out "$M" --drafter --seed 0 >"$OUT/synth.log" 2>&1 && touch "$M.done"
t "synth rc=$?"

# Pico pair (launch-bound at 8 M parameters; the CPU is busy building here,
# so these tokens/s are conservative for both sides).
P=models/prompts-dev.jsonl
for m in "ar --no-draft" "dspark" "dflash -d models/pico-qwen3-dflash"; do
    set -- $m
    name=$1
    shift
    ./$B/dspark generate --backend cuda --json --prompt-file $P -n 128 "$@" 2>&1 | tail -1 | cut -c1-200 |
        sed "s/^/dspark pico $name: /"
done
PYTHONUNBUFFERED=1 timeout 150 python3 bench/hf_deepspec.py --device cuda 2>"$OUT/deepspec.err" | cut -c1-260 |
    sed 's/^/deepspec loop: /'
t "pico done"

while [ ! -f "$OUT/lcpp.ready" ]; do sleep 2; done
t "llama.cpp built and converted: $(grep -h "done in" "$OUT"/lcpp-*/llamacpp.log | tr '\n' ' ')"

bench() {
    timeout 120 ./$B/dspark bench --backend cuda -m "$M" -d "$M-dspark" --prompt-len 64 --decode 64 \
        --assume-tau 3 --assume-tau 4 --assume-tau 5 --assume-tau 6 2>&1 | grep -v "^  "
}
t "dspark bench (1)"
bench
t "llama-bench"
LCPP_FA=OFF LCPP_STEPS=bench LCPP_REPS=3 OUT=$OUT/lcpp-bench bash bench/run_llamacpp.sh "$M" 2>&1 |
    grep -E "llamacpp_summary" | cut -c1-300
t "transformers"
PYTHONUNBUFFERED=1 timeout 180 python3 bench/hf_decode.py "$M" --prompt-len 64 --new 64 2>"$OUT/hf.err" | cut -c1-300
t "dspark bench (2)"
bench
t "total"
