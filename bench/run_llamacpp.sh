#!/usr/bin/env bash
# Peer baseline for the GPU runs: llama.cpp's own batch-1 decode speed on the
# same synthetic checkpoint `dspark bench` times (bench/run_synth_cuda.sh).
#
# Phases (each timed, each fails loudly):
#   1. unpack .devdata/llama.cpp.tar.xz (trimmed upstream source, see
#      bench/fetch_llamacpp.md) into $LCPP_ROOT (default /tmp/llamacpp)
#   2. configure + build llama-bench only: CUDA backend for sm_90a alone,
#      GGML_NATIVE=OFF, no tests/examples/server/app, no OpenSSL, no NCCL,
#      Release, ninja (else make -j); skipped when the binary of the same
#      commit is already there
#   3. put the real Qwen3 tokenizer (testdata/tokenizers/qwen3) into the
#      checkpoint directory when it has none (`dspark synth` writes none;
#      llama.cpp's converter needs one)
#   4. convert_hf_to_gguf.py DIR --outtype bf16 (no quantization)
#   5. llama-bench -ngl 99, flash attention on and off: pp64 + tg64 at depth 0
#      and at depth 64 (tg64@d64: 64 tokens decoded after a 64-token context,
#      the shape `dspark bench --prompt-len 64 --decode 64` times)
#
# usage: bash bench/run_llamacpp.sh [MODEL_DIR]    (default /tmp/synth-qwen3-8b)
# env:   LCPP_ROOT (default /tmp/llamacpp), LCPP_JOBS (default nproc),
#        LCPP_GGUF (default $LCPP_ROOT/model-bf16.gguf), LCPP_REPS (default 5),
#        LCPP_KEEP_GGUF=1 keeps the GGUF (16 GB for Qwen3-8B) afterwards,
#        LCPP_STEPS (default "build,convert,bench"; e.g. "build" alone),
#        LCPP_FA (default ON; OFF builds without the flash-attention kernels,
#        about 40 % less compile work, and benches -fa 0 only)
# Output: a summary on stdout (llama-bench JSONL lines, then one
# {"llamacpp_summary": ...} line per test) and the whole log in
# ${OUT:-$LCPP_ROOT}/llamacpp.log (one file: device runs return at most 8).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
M=${1:-/tmp/synth-qwen3-8b}
ROOT=${LCPP_ROOT:-/tmp/llamacpp}
SRC=$ROOT/llama.cpp
B=$ROOT/build
GGUF=${LCPP_GGUF:-$ROOT/model-bf16.gguf}
JOBS=${LCPP_JOBS:-$(nproc)}
REPS=${LCPP_REPS:-5}
STEPS=${LCPP_STEPS:-build,convert,bench}
FA=${LCPP_FA:-ON}
[[ $FA == ON || $FA == OFF ]] || { echo "LCPP_FA must be ON or OFF" >&2; exit 2; }
TARBALL=$REPO/.devdata/llama.cpp.tar.xz
mkdir -p "$ROOT"
LOGDIR=${OUT:-$ROOT}
mkdir -p "$LOGDIR"
LOG=$LOGDIR/llamacpp.log
: >"$LOG"
T0=$(date +%s)

say() { echo "[llamacpp $(($(date +%s) - T0)) s] $*" | tee -a "$LOG"; }
die() {
    say "FAILED: $*"
    exit 1
}
phase() { # phase NAME START_SECONDS
    say "$1 done in $(($(date +%s) - $2)) s"
}
has_step() { [[ ",$STEPS," == *",$1,"* ]]; }

# ---- 1. unpack -------------------------------------------------------------
t=$(date +%s)
[ -f "$TARBALL" ] || die "$TARBALL missing (make it with bench/make_llamacpp_tarball.sh; carry .devdata)"
rm -rf "$SRC.new"
mkdir -p "$SRC.new"
# python's tarfile, not tar -J: the device image may lack xz.
python3 - "$TARBALL" "$SRC.new" <<'EOF' || die "unpacking $TARBALL"
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2], filter="data") if hasattr(tarfile, "data_filter") else t.extractall(sys.argv[2])
EOF
COMMIT=$(cat "$SRC.new/llama.cpp/COMMIT")
SUM=$(sha256sum "$TARBALL" | cut -d' ' -f1)
if [ "$(cat "$SRC/.tarball-sha256" 2>/dev/null)" = "$SUM" ]; then
    rm -rf "$SRC.new" # same tarball: keep the tree (and its mtimes) the build used
else
    rm -rf "$SRC" "$B" && mv "$SRC.new/llama.cpp" "$SRC" && rm -rf "$SRC.new" && echo "$SUM" >"$SRC/.tarball-sha256"
fi
say "llama.cpp commit $COMMIT"
phase unpack "$t"

# ---- 2. build --------------------------------------------------------------
BIN=$B/bin/llama-bench
if has_step build; then
    t=$(date +%s)
    if [ -x "$BIN" ] && [ "$(cat "$B/COMMIT" 2>/dev/null)" = "$COMMIT FA=$FA" ]; then
        say "llama-bench of $COMMIT already built in $B, build skipped"
    else
        command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "nvcc not found"
        NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
        GEN=()
        command -v ninja >/dev/null && GEN=(-G Ninja)
        say "nvcc: $("$NVCC" --version | tail -1); cmake: $(cmake --version | head -1); generator: ${GEN[*]:-make}; jobs $JOBS"
        # GGML_CUDA_FA_ALL_QUANTS stays OFF (default): only the f16/bf16/q4_0/q8_0
        # fattn-vec instances are compiled (and shipped). 90a-real = sm_90a
        # SASS only (no PTX): the H200 needs nothing else.
        cmake -S "$SRC" -B "$B" "${GEN[@]}" \
            -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_CUDA_COMPILER="$NVCC" \
            -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
            -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF -DGGML_CUDA_NCCL=OFF \
            -DGGML_CUDA_FA="$FA" -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_CUDA_GRAPHS=ON \
            -DBUILD_SHARED_LIBS=OFF \
            -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_COMMIT="${COMMIT:0:8}" -DLLAMA_BUILD_NUMBER="$(cat "$SRC/BUILD_NUMBER" 2>/dev/null || echo 0)" \
            >>"$LOG" 2>&1 || {
            tail -30 "$LOG"
            die "cmake configure (log: $LOG)"
        }
        phase configure "$t"
        tb=$(date +%s)
        cmake --build "$B" --target llama-bench -j "$JOBS" >>"$LOG" 2>&1 || {
            grep -E "error|Error" "$LOG" | head -20
            tail -20 "$LOG"
            die "build (log: $LOG)"
        }
        [ -x "$BIN" ] || die "build finished without $BIN"
        echo "$COMMIT FA=$FA" >"$B/COMMIT"
        phase "build (llama-bench)" "$tb"
    fi
fi

# ---- 3 + 4. tokenizer, convert ---------------------------------------------
if has_step convert; then
    t=$(date +%s)
    [ -f "$M/config.json" ] || die "$M/config.json missing (write it with dspark synth --like qwen3-8b --out $M)"
    if [ ! -f "$M/tokenizer.json" ]; then
        # The real Qwen3 tokenizer (151,669 tokens; vocab_size 151936 in
        # config.json, the converter pads the rest).
        python3 - "$REPO/testdata/tokenizers/qwen3" "$M" <<'EOF' || die "writing the Qwen3 tokenizer into $M"
import lzma, sys
src, dst = sys.argv[1], sys.argv[2]
for name in ("tokenizer.json", "tokenizer_config.json"):
    with lzma.open(f"{src}/{name}.xz") as f, open(f"{dst}/{name}", "wb") as g:
        g.write(f.read())
EOF
        say "wrote tokenizer.json + tokenizer_config.json (testdata/tokenizers/qwen3) into $M"
    fi
    rm -f "$GGUF"
    df -h "$(dirname "$GGUF")" | tail -1 | tee -a "$LOG"
    python3 "$SRC/convert_hf_to_gguf.py" "$M" --outtype bf16 --outfile "$GGUF" >>"$LOG" 2>&1 || {
        tail -30 "$LOG"
        die "convert_hf_to_gguf.py (log: $LOG)"
    }
    [ -s "$GGUF" ] || die "converter wrote no $GGUF"
    say "GGUF $GGUF: $(stat -c %s "$GGUF") bytes"
    phase convert "$t"
fi

# ---- 5. bench --------------------------------------------------------------
if has_step bench; then
    t=$(date +%s)
    [ -x "$BIN" ] || die "$BIN missing (run with LCPP_STEPS containing build)"
    [ -s "$GGUF" ] || die "$GGUF missing (run with LCPP_STEPS containing convert)"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$LOG"
    J=$ROOT/bench.jsonl
    : >"$J"
    # One invocation (the model is loaded once): pp64 and tg64 at depth 0
    # (empty context) and at depth 64 (after a 64-token context, the shape
    # `dspark bench --prompt-len 64 --decode 64` times), flash attention on
    # (when built) and off.
    FAS=1,0
    grep -q "FA=OFF" "$B/COMMIT" 2>/dev/null && FAS=0
    "$BIN" -m "$GGUF" -ngl 99 -fa $FAS -p 64 -n 64 -d 0,64 -r "$REPS" -o jsonl >>"$J" 2>>"$LOG" ||
        die "llama-bench (log: $LOG)"
    tee -a "$LOG" <"$J"
    python3 - "$J" <<'EOF' | tee -a "$LOG"
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
    if r.get("n_depth"):
        test += f"@d{r['n_depth']}"
    ts = r["avg_ts"]
    out = {"test": test, "flash_attn": r.get("flash_attn"), "tokens_per_s": round(ts, 2),
           "tokens_per_s_stddev": round(r.get("stddev_ts", 0.0), 2), "ms_per_token": round(1e3 / ts, 4),
           "reps": len(r.get("samples_ns", [])), "model_size": r.get("model_size"),
           "model_type": r.get("model_type"), "gpu": r.get("gpu_info"), "build_commit": r.get("build_commit")}
    print(json.dumps({"llamacpp_summary": out}))
EOF
    phase bench "$t"
    [ "${LCPP_KEEP_GGUF:-0}" = 1 ] || rm -f "$GGUF"
fi
say "all done (log: $LOG)"
