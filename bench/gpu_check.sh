#!/usr/bin/env bash
# One device call: build with CUDA, every GPU test, the CPU-golden tests again
# on the GPU (DS_BACKEND=cuda), and `dspark bench` at the Qwen3-8B shape with
# the copy bandwidth measured in the same run. Logs in $OUT (or /tmp/gpu_check).
#   bash bench/make_devdata.sh     # here, once
#   run (carry [".devdata/root.tar.xz", ".devdata/tls.tar.xz", ".devdata/devenv.sh"]): bash bench/gpu_check.sh
# With .devdata/base.tar.xz (what to compare against, made here by
#   git archive REV CMakeLists.txt include src tools | xz -9 > .devdata/base.tar.xz
# (its tests/ and bench/ are left out: only its CLI is built)
# and carried too), its dspark_cli is built in /tmp/base and the bench runs
# twice for each tree, alternating, on the same synthetic checkpoint.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ds_build
rc=$?; t "build rc=$rc (serve $DS_SERVE)"; grep -E "warning|error" "$OUT/build.log" | grep -v "^--" | head -20
[ $rc -eq 0 ] || exit 1
# SKIP_TESTS=1: the bench part only (a second call on a warm machine, after one with SKIP_BENCH=1)
if [ -z "${SKIP_TESTS:-}" ]; then
ctest --test-dir $B -j4 -R 'cuda' --output-on-failure >"$OUT/ctest_cuda.log" 2>&1
t "GPU tests rc=$?"; grep -E "Test +#|tests passed|FAIL" "$OUT/ctest_cuda.log"
DS_BACKEND=cuda ctest --test-dir $B -j4 --output-on-failure \
  -R '^test_(dspark|dspark_gemma4|qwen3|gemma4|gemma4_unified|markov_heads|stop|sample_ops|round_ops|engine_api|pico|lossless_sampling)$' \
  >"$OUT/ctest_on_cuda.log" 2>&1
t "CPU-golden tests on the GPU rc=$?"; grep -E "Test +#|tests passed|FAIL|tau T=0|agree" "$OUT/ctest_on_cuda.log"
# Tensor parallel emulated on the one GPU: every rank a CUDA backend, the collectives through the host.
DS_BACKEND=cuda timeout 300 ./$B/tests/test_tp >"$OUT/test_tp_cuda.log" 2>&1
t "test_tp on CUDA backends rc=$?"; grep -E "ranks|tokens|FAIL|passed" "$OUT/test_tp_cuda.log" | head -8
fi
# SKIP_BENCH=1: the tests only (a call that must leave time for another)
[ -n "${SKIP_BENCH:-}" ] && { t "done (SKIP_BENCH)"; exit 0; }
if [ -f .devdata/base.tar.xz ]; then
  mkdir -p /tmp/base/tests /tmp/base/bench && tar -xJf .devdata/base.tar.xz -C /tmp/base &&
    : >/tmp/base/tests/CMakeLists.txt && : >/tmp/base/bench/CMakeLists.txt &&
    cmake -S /tmp/base -B /tmp/base/build -DCMAKE_BUILD_TYPE=Release -DDS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
      -DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG >"$OUT/base_build.log" 2>&1 &&
    cmake --build /tmp/base/build -j16 --target dspark_cli >>"$OUT/base_build.log" 2>&1
  t "base build rc=$?"
fi
M=$M8
ds_synth_8b
t "synth rc=$?"
bench() { # tree label
  timeout 200 "$1/dspark" bench --backend cuda -m $M -d $M-dspark --prompt-len 64 --decode 64 --assume-tau 3 \
    --json >"$OUT/bench_$2.json" 2>"$OUT/bench_$2.err"
  t "bench $2 rc=$?"; grep -vE "^\s*$" "$OUT/bench_$2.err" | tail -25
}
bench ./$B new
if [ -x /tmp/base/build/dspark ]; then bench /tmp/base/build base; bench ./$B new2; bench /tmp/base/build base2; fi
python3 - "$OUT" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "bench_*.json"))):
    try:
        j = json.load(open(f))
    except Exception as e:
        print(os.path.basename(f), "unreadable:", e); continue
    mb, ar, d = j.get("memory_bandwidth", {}), j.get("ar_decode", {}), j.get("drafter", {})
    v8 = [v.get("vs_ar_step", float("nan")) for v in j.get("verify", []) if v.get("rows") == 8]
    num = lambda x: float(x) if isinstance(x, (int, float)) else float("nan")
    print("%s: copy %.3f TB/s measured (datasheet %.3f); AR %.3f ms/token = %.1f %% of the measured floor (%s), "
          "%.1f %% of the datasheet's, %.1f %% of 4.3 TB/s; verify-8 %.3f AR steps; draft %.3f ms, loop round %.3f ms; "
          "drafted tokens == AR: %s" % (
              os.path.basename(f), num(mb.get("measured_bytes_per_s")) / 1e12, num(mb.get("datasheet_bytes_per_s")) / 1e12,
              num(ar.get("ms_per_token")), num(ar.get("pct_of_floor")), ar.get("floor_basis"),
              num(ar.get("pct_of_datasheet_floor")), num(ar.get("pct_of_assumed_floor")), v8[0] if v8 else float("nan"),
              num(d.get("draft_round_ms")), num(d.get("loop_round_ms")), j.get("drafted_run", {}).get("tokens_equal_ar")))
PY
