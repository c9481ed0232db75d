#!/usr/bin/env bash
# Peer baseline for the GPU runs: llama.cpp's own batch-1 decode speed on the
# same synthetic checkpoint `dspark bench` times (bench/run_synth_cuda.sh,
# bench/quant_bench.sh), in bf16 and/or llama.cpp's own quantized types.
#
# Phases (each timed, each fails loudly):
#   1. unpack .devdata/llama.cpp.tar.xz (trimmed upstream source, see
#      bench/fetch_llamacpp.md) into $LCPP_ROOT (default /tmp/llamacpp)
#   2. configure + build llama-bench and llama-quantize only: CUDA backend for
#      sm_90a alone, GGML_NATIVE=OFF, no tests/examples/server/app, no
#      OpenSSL, no NCCL, Release, ninja (else make -j); skipped when the
#      binaries of the same commit are already there
#   3. put the real Qwen3 tokenizer (testdata/tokenizers/qwen3) into the
#      checkpoint directory when it has none (`dspark synth` writes none;
#      llama.cpp's converter needs one)
#   4. convert_hf_to_gguf.py DIR --outtype bf16 (LCPP_QUANT_FROM), once; then
#      for every other type of LCPP_TYPES, llama-quantize from that GGUF
#      (llama.cpp's standard recipe for the type: for Q4_0 the output matrix
#      is Q6_K, as in the Q4_0 files llama.cpp users run; LCPP_QUANT_ARGS=--pure
#      makes every matrix the type); the base GGUF is deleted as soon as the
#      last quantized file is written, unless its type is one of LCPP_TYPES.
#      LCPP_QUANT_FROM=q8_0: the converter writes Q8_0 itself (the same tensor
#      types and bytes as llama-quantize's Q8_0) and the other types are
#      requantized from it (--allow-requantize; the same tensor types as
#      from bf16): no 16 GB bf16 file on the disk, and it needs no
#      llama-quantize until a second type is asked for
#   5. for each type: llama-bench -ngl 99, flash attention on and off: pp64 +
#      tg64 at depth 0 and at depth 64 (tg64@d64: 64 tokens decoded after a
#      64-token context, the shape `dspark bench --prompt-len 64 --decode 64`
#      times); that type's GGUF is deleted right after its bench
#
# usage: bash bench/run_llamacpp.sh [MODEL_DIR]    (default /tmp/synth-qwen3-8b)
# env:   LCPP_ROOT (default /tmp/llamacpp), LCPP_JOBS (default nproc),
#        LCPP_TYPES (default "bf16"; a comma list of bf16 and llama-quantize
#        type names, e.g. "q8_0,q4_0": one conversion to bf16, one quantized
#        GGUF a type, $LCPP_ROOT/model-TYPE.gguf),
#        LCPP_QUANT_FROM (default bf16; or q8_0: see 4.),
#        LCPP_GGUF (the bf16 GGUF, default $LCPP_ROOT/model-bf16.gguf),
#        LCPP_REPS (default 5), LCPP_QUANT_ARGS (extra llama-quantize options),
#        LCPP_KEEP_GGUF=1 keeps every GGUF (16 GB bf16 for Qwen3-8B) afterwards,
#        LCPP_REUSE_GGUF (default 1: a GGUF that this script finished for the
#        same checkpoint files, marked by its .ok file, is not made again;
#        0: always remade),
#        LCPP_STEPS (default "build,convert,bench"; e.g. "build" alone;
#        "convert" makes every type's GGUF, "bench" benches and deletes them),
#        LCPP_FA (default ON; OFF builds without the flash-attention kernels,
#        about 40 % less compile work, and benches -fa 0 only),
#        LCPP_BENCH_FA (default "1,0", or "0" when built with LCPP_FA=OFF)
# Output: a summary on stdout (llama-bench JSONL lines, then one
# {"llamacpp_summary": ...} line per test and type, with the GGUF's bytes
# read per token: every tensor but an untied token embedding) and the whole
# log in ${OUT:-$LCPP_ROOT}/llamacpp.log (one file: device runs return at
# most 8).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
M=${1:-/tmp/synth-qwen3-8b}
ROOT=${LCPP_ROOT:-/tmp/llamacpp}
SRC=$ROOT/llama.cpp
B=$ROOT/build
GGUF=${LCPP_GGUF:-$ROOT/model-bf16.gguf}
TYPES=${LCPP_TYPES:-bf16}
TYPES=${TYPES,,}
TYPES=${TYPES// /}
FROM=${LCPP_QUANT_FROM:-bf16}
QARGS=${LCPP_QUANT_ARGS:-}
REUSE=${LCPP_REUSE_GGUF:-1}
KEEP=${LCPP_KEEP_GGUF:-0}
JOBS=${LCPP_JOBS:-$(nproc)}
REPS=${LCPP_REPS:-5}
STEPS=${LCPP_STEPS:-build,convert,bench}
FA=${LCPP_FA:-ON}
[[ $FA == ON || $FA == OFF ]] || { echo "LCPP_FA must be ON or OFF" >&2; exit 2; }
[[ $TYPES =~ ^[a-z0-9_]+(,[a-z0-9_]+)*$ ]] || { echo "LCPP_TYPES: a comma list of type names, got '$TYPES'" >&2; exit 2; }
[[ $FROM == bf16 || $FROM == q8_0 ]] || { echo "LCPP_QUANT_FROM must be bf16 or q8_0" >&2; exit 2; }
IFS=, read -r -a TYPE_LIST <<<"$TYPES"
# The GGUF of one type.
gguf_of() { if [ "$1" = bf16 ]; then echo "$GGUF"; else echo "$ROOT/model-$1.gguf"; fi; }
has_type() { [[ ",$TYPES," == *",$1,"* ]]; }
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
# Under a lock: two runs at once (bench/quant_bench.sh builds in one and
# converts in another) unpack one after the other, and the second finds the
# tree in place.
exec 9>"$ROOT/.unpack.lock"
command -v flock >/dev/null && flock 9
SUM=$(sha256sum "$TARBALL" | cut -d' ' -f1)
if [ "$(cat "$SRC/.tarball-sha256" 2>/dev/null)" != "$SUM" ]; then
    rm -rf "$SRC.new"
    mkdir -p "$SRC.new"
    # python's tarfile, not tar -J: the device image may lack xz.
    python3 - "$TARBALL" "$SRC.new" <<'EOF' || die "unpacking $TARBALL"
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2], filter="data") if hasattr(tarfile, "data_filter") else t.extractall(sys.argv[2])
EOF
    # A new tarball: a new tree and a new build (the same tarball keeps the
    # tree, and its mtimes, that the build used).
    rm -rf "$SRC" "$B" && mv "$SRC.new/llama.cpp" "$SRC" && rm -rf "$SRC.new" && echo "$SUM" >"$SRC/.tarball-sha256"
fi
command -v flock >/dev/null && flock -u 9
exec 9>&-
COMMIT=$(cat "$SRC/COMMIT")
say "llama.cpp commit $COMMIT"
phase unpack "$t"

# ---- 2. build --------------------------------------------------------------
BIN=$B/bin/llama-bench
QBIN=$B/bin/llama-quantize
if has_step build; then
    t=$(date +%s)
    if [ -x "$BIN" ] && [ -x "$QBIN" ] && [ "$(cat "$B/COMMIT" 2>/dev/null)" = "$COMMIT FA=$FA" ]; then
        say "llama-bench + llama-quantize of $COMMIT already built in $B, build skipped"
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
        cmake --build "$B" --target llama-bench llama-quantize -j "$JOBS" >>"$LOG" 2>&1 || {
            grep -E "error|Error" "$LOG" | head -20
            tail -20 "$LOG"
            die "build (log: $LOG)"
        }
        [ -x "$BIN" ] || die "build finished without $BIN"
        [ -x "$QBIN" ] || die "build finished without $QBIN"
        echo "$COMMIT FA=$FA" >"$B/COMMIT"
        phase "build (llama-bench, llama-quantize)" "$tb"
    fi
fi

# ---- 3 + 4. tokenizer, convert, quantize -----------------------------------
# A GGUF finished by this script carries a .ok file naming the checkpoint
# files it was made from (path, size, mtime) and how (converted, or
# quantized from which base with which LCPP_QUANT_ARGS): with
# LCPP_REUSE_GGUF=1 such a file is not made again (a second device call on a
# warm machine).
src_sig() { stat -c '%n %s %Y' "$M"/*.safetensors "$M/config.json" 2>/dev/null | sha256sum | cut -d' ' -f1; }
how_of() { if [ "$1" = "$FROM" ]; then echo convert; else echo "quantize from $FROM $QARGS"; fi; }
gguf_ok() { [ "$REUSE" = 1 ] && [ -s "$(gguf_of "$1")" ] && [ "$(cat "$(gguf_of "$1").ok" 2>/dev/null)" = "$(src_sig) $(how_of "$1")" ]; }
mark_ok() { echo "$(src_sig) $(how_of "$1")" >"$(gguf_of "$1").ok"; }
drop_gguf() { rm -f "$1" "$1.ok"; }
# need_disk PATH BYTES: the free space under PATH's folder holds BYTES + 1 GB
need_disk() {
    local avail
    avail=$(df -B1 --output=avail "$(dirname "$1")" | tail -1)
    [ "$avail" -gt $(($2 + 1000000000)) ] ||
        die "$((avail / 1000000)) MB free under $(dirname "$1"), $1 needs about $(($2 / 1000000)) MB (+1 GB)"
}
if has_step convert; then
    t=$(date +%s)
    [ -f "$M/config.json" ] || die "$M/config.json missing (write it with dspark synth --like qwen3-8b --out $M)"
    if [ ! -f "$M/tokenizer.json" ]; then
        # The real Qwen3 tokenizer (151,669 tokens; vocab_size 151936 in
        # config.json, the converter pads the rest).
        bash "$REPO/bench/put_qwen3_tokenizer.sh" "$M" || die "writing the Qwen3 tokenizer into $M"
        say "wrote tokenizer.json + tokenizer_config.json (testdata/tokenizers/qwen3) into $M"
    fi
    SRC_BYTES=$(du -cb "$M"/*.safetensors | tail -1 | cut -f1)
    TODO=()
    for ty in "${TYPE_LIST[@]}"; do
        if gguf_ok "$ty"; then
            say "$(gguf_of "$ty") of this checkpoint is there already ($(stat -c %s "$(gguf_of "$ty")") bytes), not made again"
        else
            TODO+=("$ty")
        fi
    done
    df -h "$ROOT" | tail -1 | tee -a "$LOG"
    # The base GGUF (LCPP_QUANT_FROM): the converter's output, which the other types are quantized from.
    BASE=$(gguf_of "$FROM")
    if [ ${#TODO[@]} -gt 0 ] && ! gguf_ok "$FROM"; then
        tc=$(date +%s)
        drop_gguf "$BASE"
        if [ "$FROM" = bf16 ]; then need_disk "$BASE" "$SRC_BYTES"; else need_disk "$BASE" $((SRC_BYTES / 2 + SRC_BYTES / 16)); fi
        python3 "$SRC/convert_hf_to_gguf.py" "$M" --outtype "$FROM" --outfile "$BASE" >>"$LOG" 2>&1 || {
            tail -30 "$LOG"
            drop_gguf "$BASE"
            die "convert_hf_to_gguf.py --outtype $FROM (log: $LOG)"
        }
        [ -s "$BASE" ] || die "converter wrote no $BASE"
        mark_ok "$FROM"
        say "GGUF $BASE (converted, $FROM): $(stat -c %s "$BASE") bytes"
        phase "convert ($FROM)" "$tc"
    fi
    for ty in "${TODO[@]}"; do
        [ "$ty" = "$FROM" ] && continue
        tq=$(date +%s)
        [ -x "$QBIN" ] || die "$QBIN missing (run with LCPP_STEPS containing build)"
        out=$(gguf_of "$ty")
        drop_gguf "$out"
        need_disk "$out" $((SRC_BYTES / 2 + SRC_BYTES / 16)) # 8.5 of 16 bits: Q8_0's size, the largest of the usual types
        REQ=()
        [ "$FROM" = bf16 ] || REQ=(--allow-requantize) # from Q8_0: dequantized, then quantized to the type
        # shellcheck disable=SC2086 # QARGS: options, split on spaces
        "$QBIN" "${REQ[@]}" $QARGS "$BASE" "$out" "${ty^^}" "$JOBS" >>"$LOG" 2>&1 || {
            tail -30 "$LOG"
            drop_gguf "$out"
            die "llama-quantize ${ty^^} (log: $LOG)"
        }
        [ -s "$out" ] || die "llama-quantize wrote no $out"
        mark_ok "$ty"
        say "GGUF $out (${ty^^} from $FROM${REQ[*]:+ ${REQ[*]}}${QARGS:+ $QARGS}): $(stat -c %s "$out") bytes"
        phase "quantize (${ty^^})" "$tq"
    done
    # The base file only fed the quantizer: gone as soon as the last type is written.
    if ! has_type "$FROM" && [ "$KEEP" != 1 ]; then drop_gguf "$BASE"; fi
    phase convert "$t"
fi

# ---- 5. bench --------------------------------------------------------------
if has_step bench; then
    t=$(date +%s)
    [ -x "$BIN" ] || die "$BIN missing (run with LCPP_STEPS containing build)"
    for ty in "${TYPE_LIST[@]}"; do
        [ -s "$(gguf_of "$ty")" ] || die "$(gguf_of "$ty") missing (run with LCPP_STEPS containing convert)"
    done
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$LOG"
    FAS=${LCPP_BENCH_FA:-1,0}
    grep -q "FA=OFF" "$B/COMMIT" 2>/dev/null && FAS=0
    for ty in "${TYPE_LIST[@]}"; do
        tt=$(date +%s)
        G=$(gguf_of "$ty")
        J=$ROOT/bench-$ty.jsonl
        : >"$J"
        # Bytes a decode step reads: every tensor but the token embedding
        # where the output matrix is a tensor of its own (one row of the
        # embedding is read a token), as `dspark bench` counts its own.
        PER_TOKEN=$(PYTHONPATH="$SRC/gguf-py" python3 - "$G" <<'EOF' 2>>"$LOG"
import sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
sizes = {t.name: int(t.n_bytes) for t in r.tensors}
emb = sizes.get("token_embd.weight", 0) if "output.weight" in sizes else 0
print(sum(sizes.values()) - emb)
EOF
        ) || PER_TOKEN=0
        # One invocation a type (the model is loaded once): pp64 and tg64 at
        # depth 0 (empty context) and at depth 64 (after a 64-token context,
        # the shape `dspark bench --prompt-len 64 --decode 64` times), flash
        # attention on (when built) and off.
        "$BIN" -m "$G" -ngl 99 -fa "$FAS" -p 64 -n 64 -d 0,64 -r "$REPS" -o jsonl >>"$J" 2>>"$LOG" ||
            die "llama-bench $ty (log: $LOG)"
        tee -a "$LOG" <"$J"
        python3 - "$J" "$ty" "${PER_TOKEN:-0}" <<'EOF' | tee -a "$LOG"
import json, sys
path, ty, per_token = sys.argv[1], sys.argv[2], int(sys.argv[3] or 0)
for line in open(path):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
    if r.get("n_depth"):
        test += f"@d{r['n_depth']}"
    ts = r["avg_ts"]
    out = {"test": test, "type": ty, "flash_attn": r.get("flash_attn"), "tokens_per_s": round(ts, 2),
           "tokens_per_s_stddev": round(r.get("stddev_ts", 0.0), 2), "ms_per_token": round(1e3 / ts, 4),
           "reps": len(r.get("samples_ns", [])), "model_size": r.get("model_size"),
           "bytes_read_per_token": per_token or None, "model_type": r.get("model_type"),
           "gpu": r.get("gpu_info"), "build_commit": r.get("build_commit")}
    print(json.dumps({"llamacpp_summary": out}))
EOF
        phase "bench ($ty)" "$tt"
        [ "$KEEP" = 1 ] || drop_gguf "$G"
    done
    phase bench "$t"
fi
say "all done (log: $LOG)"
