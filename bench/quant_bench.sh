#!/usr/bin/env bash
# Issue 42, must-show 3, on one H100 at the Qwen3-8B shape (the synthetic
# checkpoint of `dspark synth --like qwen3-8b --drafter --seed 0`): dspark's
# int8 and int4 AR decode as % of their own copy-bandwidth floors (bytes as
# stored: packed words + scales + biases, over the copy bandwidth each
# `dspark bench` measures before it loads), the draft round with an int8
# drafter against the bf16 one, the projected speedup at tau 3, and
# llama.cpp's Q8_0 / Q4_0 decode on the same checkpoint, every timing in the
# same call with the CPU quiet.
#
# The device call (carry: what gpu_check.sh carries + the llama.cpp tarball,
# 3.8 MiB; with the tracked tree, ~58 of the 64 MiB):
#   run(kind="nvidia-h100-x1", timeout_s=600,
#       carry=[".devdata/root.tar.xz", ".devdata/tls.tar.xz", ".devdata/devenv.sh", ".devdata/llama.cpp.tar.xz"],
#       command="bash bench/quant_bench.sh")
# On a fresh machine the prep alone (the llama.cpp build above all) takes
# most of a call, so the cheapest plan is two calls, the second at once on
# the still-warm machine:
#   1. command="QB_STEPS=prep bash bench/quant_bench.sh"   (~350-500 s fresh: no timings)
#   2. command="bash bench/quant_bench.sh"                 (~300 s: prep all reused, every timing)
# Everything it makes is kept under /tmp and build-cuda/ with a marker of
# what it was made from, so a later call goes straight to what is missing,
# then times everything again (timings are never reused: they are all of
# one call). A single call on a fresh machine gets the dspark timings (the
# llama.cpp background stopped meanwhile) and, if the budget allows,
# llama.cpp's; else the same command again finishes. The .devdata files come
# from bench/make_devdata.sh and bench/make_llamacpp_tarball.sh
# (bench/fetch_llamacpp.md).
# Estimates (16 cores; from this machine's 2-core runs and earlier device
# runs, not yet measured at 8B on the device): llama.cpp build 250-400 s
# (background), dspark build 60-90 s, synth 30-60 s, dspark quantize
# 100-200 s (one core a job, the three at once), convert to Q8_0 100-160 s
# (background), Q4_0 20-40 s, each dspark bench 40-60 s, llama-bench 30-45 s
# a type.
#
# Phases, each with a timestamp ([N s] since the start):
#   prep  1. llama.cpp: build llama-bench + llama-quantize (CUDA sm_90a, flash
#            attention kernels on; ~5 min on 16 cores) in the background at
#            nice 10; as soon as the checkpoint is there, convert it straight
#            to Q8_0 (convert_hf_to_gguf.py --outtype q8_0: the tensor types
#            and bytes of llama-quantize's Q8_0, and no 16 GB bf16 GGUF on the
#            disk); once built, llama-quantize Q4_0 from that Q8_0
#            (--allow-requantize; llama.cpp's Q4_0 recipe: output.weight Q6_K)
#         2. dspark: build the CLI in build-cuda/ (gpu_check.sh's configure)
#         3. `dspark synth` unless a complete checkpoint is there
#         4. `dspark quantize` (group 64): the target to int8 and to int4, the
#            drafter to int8, the three at once (one core each)
#   time  5. every timing with the CPU quiet: if the llama.cpp background is
#            still at work, it is stopped (SIGSTOP) for the dspark benches and
#            continued after them; `dspark bench --backend cuda --prompt-len 64
#            --decode 64 --assume-tau 3 --json` for bf16 + bf16 drafter, bf16 +
#            int8 drafter, int8 (+ int8 drafter), int4 (+ int8 drafter)
#         6. llama-bench for Q8_0 and Q4_0 once the background is done: -ngl 99,
#            flash attention on and off, pp64 / tg64 at depth 0 and 64
#         7. one summary table (stdout and $OUT/summary.txt)
# A timing that would not end inside QB_BUDGET_S is skipped with a line
# saying so; the background is killed when the script ends.
#
# Disk (/tmp): checkpoint 16.4 GB + drafter 4.7, int8 8.7 + int4 4.6 + int8
# drafter 2.5, Q8_0 8.7 + Q4_0 4.8 GGUFs: ~51 GB at the peak.
#
# env: SKIP_LCPP=1 (no llama.cpp), SKIP_DSPARK=1 (no dspark quantize or bench:
#      llama.cpp alone, on the same checkpoint), SKIP_BUILD=1 (use build-cuda/dspark as it is),
#      QB_STEPS (default "prep,time"; "prep": make everything, time nothing),
#      QB_BENCHES (default "bf16,d8,int8,int4"), QB_QT_DRAFTER (the drafter of
#      the int8 / int4 target benches: d8 (default), bf16 or none),
#      QB_LCPP_TYPES (default "q8_0,q4_0"), LCPP_QUANT_FROM (default q8_0 here;
#      bf16: convert to bf16 and llama-quantize both from it, 16 GB more disk),
#      LCPP_FA (default ON), QB_BUDGET_S (default 570), QB_TAU (default 3),
#      QB_GROUP (default 64), SYNTH_DIR (default /tmp/synth-qwen3-8b),
#      QB_LIKE (default qwen3-8b), QB_SYNTH=keep (take SYNTH_DIR and its
#      -dspark drafter as they are: any Qwen3 checkpoint, not checked against
#      synth), QB_BUILD_DIR (default build-cuda), QB_DEVENV (default
#      .devdata/devenv.sh), QB_BACKEND (default cuda; cpu only tests the
#      script on a machine without a GPU),
#      QB_STATE (default /tmp/quant_bench: logs), QB_CLEAN=1 (delete the
#      quantized checkpoints and GGUFs at the end)
# $OUT (default $QB_STATE/out) gets at most 8 files: quant_bench.log (this
# output), summary.txt, bench_{bf16,d8,int8,int4}.json, llamacpp.log (the
# llama-bench run) and logs.txt (the tail of every other log).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
T0=$(date +%s)
STATE=${QB_STATE:-/tmp/quant_bench}
LOGS=$STATE/logs
OUTD=${OUT:-$STATE/out}
mkdir -p "$LOGS" "$OUTD"
rm -rf "$LOGS" "$OUTD"/bench_*.json "$OUTD/summary.txt" "$OUTD/llamacpp.log" "$OUTD/logs.txt" "$STATE/lcpp_summary.jsonl"
mkdir -p "$LOGS"
exec > >(tee "$OUTD/quant_bench.log") 2>&1
TEE=$!

BUDGET=${QB_BUDGET_S:-570}
STEPS=${QB_STEPS:-prep,time}
BENCHES=${QB_BENCHES:-bf16,d8,int8,int4}
QT_DRAFTER=${QB_QT_DRAFTER:-d8}
LTYPES=${QB_LCPP_TYPES:-q8_0,q4_0}
TAU=${QB_TAU:-3}
GROUP=${QB_GROUP:-64}
M=${SYNTH_DIR:-/tmp/synth-qwen3-8b}
D=$M-dspark
M8=$M-int8
M4=$M-int4
D8=$D-int8
LIKE=${QB_LIKE:-qwen3-8b}
B=${QB_BUILD_DIR:-build-cuda}
DSPARK=$B/dspark
DEVENV=${QB_DEVENV:-.devdata/devenv.sh}
export LCPP_QUANT_FROM=${LCPP_QUANT_FROM:-q8_0} LCPP_FA=${LCPP_FA:-ON}
# Quantized weights on the CUDA backend (off by default while the first form had not run on a GPU).
export DS_CUDA_QUANT=${DS_CUDA_QUANT:-1}
DO_LCPP=1
[ -n "${SKIP_LCPP:-}" ] && DO_LCPP=0
if [ $DO_LCPP = 1 ] && [ ! -f .devdata/llama.cpp.tar.xz ]; then
    DO_LCPP=0
    echo "no .devdata/llama.cpp.tar.xz (carry it; bench/fetch_llamacpp.md): llama.cpp left out"
fi
DO_DSPARK=1
[ -n "${SKIP_DSPARK:-}" ] && DO_DSPARK=0

el() { echo $(($(date +%s) - T0)); }
say() { echo "[$(el) s] $*"; }
has_step() { [[ ",$STEPS," == *",$1,"* ]]; }
has_bench() { [[ ",$BENCHES," == *",$1,"* ]]; }
# The bytes of a checkpoint's safetensors files, and a signature of them (names, sizes, mtimes) for the markers.
st_bytes() { du -cb "$1"/*.safetensors 2>/dev/null | tail -1 | cut -f1; }
st_sig() { stat -c '%n %s %Y' "$1"/*.safetensors "$1/config.json" 2>/dev/null | sha256sum | cut -d' ' -f1; }
free_bytes() { df -B1 --output=avail "$(dirname "$1")" | tail -1; }

BG=""
QPIDS=()
cleanup() {
    for p in "${QPIDS[@]}"; do kill "$p" 2>/dev/null; done
    if [ -n "$BG" ] && kill -0 "$BG" 2>/dev/null; then
        kill -CONT -- -"$BG" 2>/dev/null
        kill -TERM -- -"$BG" 2>/dev/null
    fi
    exec 1>&- 2>&-
    wait "$TEE" 2>/dev/null # the log's last lines
}
trap cleanup EXIT

say "quant_bench: steps $STEPS; dspark $([ $DO_DSPARK = 1 ] && echo "benches $BENCHES (int8/int4 with drafter $QT_DRAFTER)" || echo off);" \
    "llama.cpp $([ $DO_LCPP = 1 ] && echo "$LTYPES (from $LCPP_QUANT_FROM, FA $LCPP_FA)" || echo off); budget $BUDGET s"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1
echo "cpus $(nproc); $(free -g | awk '/Mem:/ {print $2 " GB RAM"}'); /tmp: $(df -h /tmp | tail -1 | awk '{print $4 " free of " $2}')"
git log -1 --format='tree at %h %s' 2>/dev/null | cut -c1-120

# ---- prep 1: llama.cpp in the background --------------------------------------------------------------
lcpp() { # STEPS TYPES LOGNAME: one run of bench/run_llamacpp.sh at nice 10, its output in $LOGS/LOGNAME.txt
    LCPP_STEPS=$1 LCPP_TYPES=$2 OUT=$LOGS/$3 nice -n 10 bash bench/run_llamacpp.sh "$M" >"$LOGS/$3.txt" 2>&1
}
lcpp_chain() {
    set +m # its jobs stay in its process group
    lcpp build "$LTYPES" lcpp-build &
    local bp=$! crc=1 brc
    # The base GGUF needs the checkpoint, not the build: converted meanwhile.
    while [ ! -f "$STATE/synth.ready" ] && [ ! -f "$STATE/synth.failed" ]; do sleep 2; done
    [ -f "$STATE/synth.ready" ] && { lcpp convert "$LCPP_QUANT_FROM" lcpp-convert; crc=$?; }
    wait $bp
    brc=$?
    echo "build rc=$brc convert rc=$crc" >"$STATE/lcpp-prep.rc"
    [ $brc = 0 ] && [ $crc = 0 ] || exit 1
    lcpp convert "$LTYPES" lcpp-quantize
    echo "quantize rc=$?" >>"$STATE/lcpp-prep.rc"
}
rm -f "$STATE/synth.ready" "$STATE/synth.failed" "$STATE/lcpp-prep.rc"
if has_step prep && [ $DO_LCPP = 1 ]; then
    set -m # the chain in a process group of its own: stopped, continued and killed as one
    lcpp_chain &
    BG=$!
    set +m
    say "prep: llama.cpp build + convert in the background (pid $BG)"
fi

# ---- prep 2: dspark build -----------------------------------------------------------------------------
if has_step prep && [ -z "${SKIP_BUILD:-}" ]; then
    # shellcheck disable=SC1090
    source "$DEVENV"
    t=$(date +%s)
    cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DDS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
        -DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG" -DDS_SERVE="$DS_SERVE" -DDS_OPENBLAS="${DS_OPENBLAS:-OFF}" \
        >"$LOGS/build.log" 2>&1 && cmake --build "$B" -j"$(nproc)" --target dspark_cli >>"$LOGS/build.log" 2>&1
    rc=$?
    say "prep: dspark build rc=$rc in $(($(date +%s) - t)) s (serve $DS_SERVE)"
    grep -E "warning|error" "$LOGS/build.log" | grep -v "^--" | head -10
    [ $rc -eq 0 ] || {
        tail -30 "$LOGS/build.log"
        touch "$STATE/synth.failed"
        exit 1
    }
elif [ -f "$DEVENV" ]; then
    # shellcheck disable=SC1090 # the CLI's libraries (LD_LIBRARY_PATH)
    source "$DEVENV"
fi
[ -x "$DSPARK" ] || {
    say "no $DSPARK (build it: leave SKIP_BUILD unset)"
    touch "$STATE/synth.failed"
    exit 1
}

# ---- prep 3: the checkpoint ---------------------------------------------------------------------------
# Complete when its safetensors hold the bytes `dspark synth --config-only` reports (the files
# are written front to back; a cut write leaves them short), whoever wrote it (gpu_check.sh too).
synth_ok() {
    [ -f "$M/config.json" ] && [ -f "$D/config.json" ] || return 1
    local js
    js=$("$DSPARK" synth --like "$LIKE" --out "$STATE/synth-cfg" --drafter --seed 0 --config-only 2>/dev/null | tail -1)
    python3 - "$js" "$(st_bytes "$M")" "$(st_bytes "$D")" <<'EOF'
import json, sys
j = json.loads(sys.argv[1])
t, d = int(sys.argv[2] or 0), int(sys.argv[3] or 0)
# tensor bytes + the files' JSON headers (a few MB at most)
ok = j["target_bytes"] <= t < j["target_bytes"] + 2**24 and j["drafter_bytes"] <= d < j["drafter_bytes"] + 2**24
sys.exit(0 if ok else 1)
EOF
}
if has_step prep; then
    t=$(date +%s)
    if [ "${QB_SYNTH:-}" = keep ] && [ -f "$M/config.json" ] && [ -f "$D/config.json" ]; then
        say "prep: checkpoint $M (+ $D) taken as it is (QB_SYNTH=keep)"
    elif synth_ok; then
        say "prep: checkpoint $M (+ $D) there already"
    else
        rm -rf "$M" "$D" "$M8" "$M4" "$D8"
        timeout 300 "$DSPARK" synth --like "$LIKE" --out "$M" --drafter --seed 0 >"$LOGS/synth.log" 2>&1
        rc=$?
        say "prep: synth rc=$rc in $(($(date +%s) - t)) s"
        [ $rc -eq 0 ] || {
            tail -5 "$LOGS/synth.log"
            touch "$STATE/synth.failed"
            exit 1
        }
    fi
    # llama.cpp's converter needs a tokenizer (the real Qwen3 one; dspark ignores it): written
    # here, before anything reads the directory.
    bash "$REPO/bench/put_qwen3_tokenizer.sh" "$M" || say "prep: could not write the tokenizer into $M"
    touch "$STATE/synth.ready"
fi

# ---- prep 4: dspark quantize --------------------------------------------------------------------------
quantize_one() { # SRC DST BITS: DST/.qb-ok names the source's signature, bits and group
    local want
    want="$(st_sig "$1") bits $3 group $GROUP"
    if [ "$(cat "$2/.qb-ok" 2>/dev/null)" = "$want" ]; then
        echo "$2 there already"
        return 0
    fi
    rm -rf "$2" "$2.tmp"
    local need=$(($(st_bytes "$1") * ($3 * 2 + 1) / 32)) # bits/16 of the bf16 bytes + a bf16 scale and bias a group of 64
    [ "$(free_bytes "$2")" -gt $((need + 1000000000)) ] || {
        echo "$2: $(($(free_bytes "$2") / 1000000)) MB free, needs ~$((need / 1000000)) MB"
        return 1
    }
    local t
    t=$(date +%s)
    "$DSPARK" quantize -m "$1" --bits "$3" --group "$GROUP" --out "$2.tmp" >"$LOGS/quantize_$(basename "$2").log" 2>&1 &&
        mv "$2.tmp" "$2" && echo "$want" >"$2/.qb-ok" && echo "$2: $(st_bytes "$2") bytes in $(($(date +%s) - t)) s"
}
if has_step prep && [ $DO_DSPARK = 1 ]; then
    t=$(date +%s)
    Q=()
    has_bench int8 && Q+=("$M $M8 8")
    has_bench int4 && Q+=("$M $M4 4")
    { has_bench d8 || { [ "$QT_DRAFTER" = d8 ] && { has_bench int8 || has_bench int4; }; }; } && Q+=("$D $D8 8")
    for q in "${Q[@]}"; do
        # shellcheck disable=SC2086 # "SRC DST BITS"
        quantize_one $q >"$LOGS/qb_$(basename "$(echo $q | cut -d' ' -f2)").txt" 2>&1 &
        QPIDS+=($!)
    done
    qrc=0
    for p in "${QPIDS[@]}"; do wait "$p" || qrc=1; done
    QPIDS=()
    cat "$LOGS"/qb_*.txt 2>/dev/null
    say "prep: dspark quantize rc=$qrc in $(($(date +%s) - t)) s"
fi
df -h /tmp | tail -1 | awk '{print "/tmp: " $3 " used, " $4 " free"}'

# ---- time 5: dspark bench -----------------------------------------------------------------------------
lcpp_running() { [ -n "$BG" ] && kill -0 "$BG" 2>/dev/null; }
EST_DSPARK=${QB_EST_DSPARK_S:-60}
EST_LCPP=${QB_EST_LCPP_S:-45}
bench_one() { # NAME MODEL [DRAFTER]
    local name=$1 m=$2 d=${3:-} t
    [ -f "$m/config.json" ] || {
        say "time: bench $name skipped: no $m"
        return
    }
    [ -z "$d" ] || [ -f "$d/config.json" ] || {
        say "time: bench $name skipped: no $d"
        return
    }
    [ $(($(el) + EST_DSPARK)) -le "$BUDGET" ] || {
        say "time: bench $name skipped: ~$EST_DSPARK s would pass the budget ($BUDGET s): run again"
        return
    }
    t=$(date +%s)
    timeout 240 "$DSPARK" bench --backend "${QB_BACKEND:-cuda}" -m "$m" ${d:+-d "$d"} --prompt-len 64 --decode 64 --assume-tau "$TAU" \
        --json >"$OUTD/bench_$name.json" 2>"$LOGS/bench_$name.err"
    local rc=$?
    say "time: bench $name (${m##*/}${d:+ + ${d##*/}}) rc=$rc in $(($(date +%s) - t)) s"
    [ $rc -eq 0 ] || { grep -vE "^\s*$" "$LOGS/bench_$name.err" | tail -8; rm -f "$OUTD/bench_$name.json"; }
}
if has_step time && [ $DO_DSPARK = 1 ]; then
    STOPPED=0
    if lcpp_running; then
        kill -STOP -- -"$BG" && STOPPED=1
        say "time: llama.cpp background stopped for the dspark benches"
    fi
    sleep 1
    case $QT_DRAFTER in d8) QD=$D8 ;; bf16) QD=$D ;; *) QD="" ;; esac
    has_bench bf16 && bench_one bf16 "$M" "$D"
    has_bench d8 && bench_one d8 "$M" "$D8"
    has_bench int8 && bench_one int8 "$M8" "$QD"
    has_bench int4 && bench_one int4 "$M4" "$QD"
    if [ $STOPPED = 1 ]; then
        kill -CONT -- -"$BG"
        say "time: llama.cpp background continued"
    fi
fi

# ---- time 6: llama-bench ------------------------------------------------------------------------------
if has_step time && [ $DO_LCPP = 1 ]; then
    n_types=$(($(tr -cd , <<<"$LTYPES" | wc -c) + 1))
    need=$((EST_LCPP * n_types))
    if lcpp_running; then
        say "time: waiting for the llama.cpp background (until $((BUDGET - need)) s)"
        while lcpp_running && [ $(($(el) + need)) -le "$BUDGET" ]; do sleep 2; done
    fi
    if ! lcpp_running && grep -q "rc=[1-9]" "$STATE/lcpp-prep.rc" 2>/dev/null; then
        say "time: llama.cpp prep failed: $(tr '\n' ' ' <"$STATE/lcpp-prep.rc")"
        for f in "$LOGS"/lcpp-build.txt "$LOGS"/lcpp-convert.txt "$LOGS"/lcpp-quantize.txt; do
            [ -s "$f" ] && grep -E "FAILED|rror" "$f" | tail -5
        done
    elif lcpp_running; then
        say "time: llama.cpp not ready inside the budget ($(grep -ho '\[[0-9]*/[0-9]*\]' "$LOGS"/lcpp-build/llamacpp.log 2>/dev/null | tail -1) of the build): run again"
    elif [ $(($(el) + need)) -gt "$BUDGET" ]; then
        say "time: llama-bench skipped: ~$need s would pass the budget ($BUDGET s): run again"
    else
        t=$(date +%s)
        # The GGUFs stay for another call unless QB_CLEAN=1.
        LCPP_STEPS=bench LCPP_TYPES=$LTYPES LCPP_KEEP_GGUF=1 OUT=$LOGS/lcpp-bench bash bench/run_llamacpp.sh "$M" \
            >"$LOGS/lcpp_bench.txt" 2>&1
        rc=$?
        grep '^{"llamacpp_summary"' "$LOGS/lcpp_bench.txt" >"$STATE/lcpp_summary.jsonl"
        cp "$LOGS/lcpp-bench/llamacpp.log" "$OUTD/llamacpp.log" 2>/dev/null
        say "time: llama-bench ($LTYPES) rc=$rc in $(($(date +%s) - t)) s"
        [ $rc -eq 0 ] || grep -E "FAILED|error" "$LOGS/lcpp_bench.txt" | tail -5
    fi
fi

# ---- the background's end (QB_STEPS=prep, or llama.cpp left out of the timings) ---------------------
if lcpp_running; then
    say "waiting for the llama.cpp background (until $BUDGET s)"
    while lcpp_running && [ "$(el)" -lt "$BUDGET" ]; do sleep 2; done
    lcpp_running && say "llama.cpp background not done inside the budget: killed at the end (the same command again goes on from there)"
fi
[ -f "$STATE/lcpp-prep.rc" ] && say "llama.cpp prep: $(tr '\n' ' ' <"$STATE/lcpp-prep.rc")"

# ---- 7: summary ---------------------------------------------------------------------------------------
has_step time && python3 - "$OUTD" "$STATE/lcpp_summary.jsonl" "$TAU" "$LIKE" <<'EOF' | tee "$OUTD/summary.txt"
import json, os, statistics, sys
out, lsum, tau, like = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
nan = float("nan")
num = lambda x: float(x) if isinstance(x, (int, float)) else nan
runs = [("bf16", "bf16 target + bf16 drafter"), ("d8", "bf16 target + int8 drafter"),
        ("int8", "int8 target"), ("int4", "int4 target")]
J = {}
for k, _ in runs:
    p = os.path.join(out, f"bench_{k}.json")
    if os.path.exists(p):
        try:
            J[k] = json.load(open(p))
        except Exception as e:
            print(f"{p}: unreadable ({e})")
bws = [num(j.get("memory_bandwidth", {}).get("measured_bytes_per_s")) for j in J.values()]
bws = [b for b in bws if b == b and b > 0]
bw = statistics.median(bws) if bws else nan
dev = next((j["memory_bandwidth"].get("device") for j in J.values() if j.get("memory_bandwidth", {}).get("device")), "?")

def q_of(m):
    q = m.get("quantization") if m else None
    return f"int{int(q['bits'])} g{int(q['group_size'])}" if isinstance(q, dict) else "bf16"

print(f"\nIssue 42 must-show 3: {like} shape (synthetic, seed 0), batch 1, prompt 64, decode 64; device {dev}")
print(f"copy bandwidth measured by each dspark bench: {', '.join('%.3f' % (b / 1e12) for b in bws) or 'none'} TB/s "
      f"(median {bw / 1e12:.3f}); floor = bytes a token reads / that bench's own measurement\n")
hdr = ("run", "target", "drafter", "GB/token", "floor ms", "AR ms/tok", "% floor", "draft ms", "round ms",
       f"x AR tau{tau:g}", "loop x", "drafted==AR")
rows = []
for k, label in runs:
    j = J.get(k)
    if not j:
        rows.append((f"dspark {label}", "-", "-", "-", "-", "not run", "-", "-", "-", "-", "-", "-"))
        continue
    m, a, d = j.get("model", {}), j.get("ar_decode", {}), j.get("drafter", {})
    pj = next((p for p in j.get("projection", []) if abs(num(p.get("tau")) - tau) < 1e-9), {})
    dm = j.get("drafter_model")
    run = j.get("drafted_run", {})
    rows.append((f"dspark {label}", q_of(m), q_of(dm) if dm else "-", "%.3f" % (num(m.get("bytes_read_per_token")) / 1e9),
                 "%.3f" % num(a.get("floor_ms_per_token")), "%.3f" % num(a.get("ms_per_token")),
                 "%.1f" % num(a.get("pct_of_floor")), "%.3f" % num(d.get("draft_round_ms")) if d else "-",
                 "%.3f" % num(d.get("round_ms")) if d else "-", "%.2f" % num(pj.get("speedup_vs_ar")) if pj else "-",
                 "%.2f" % num(pj.get("speedup_vs_ar_loop_round")) if pj else "-",
                 str(run.get("tokens_equal_ar", "-")) if run else "-"))
L = []
if os.path.exists(lsum):
    for line in open(lsum):
        try:
            L.append(json.loads(line)["llamacpp_summary"])
        except Exception:
            pass
for ty in sorted({r["type"] for r in L}, key=lambda t: ("q8_0", "q4_0").index(t) if t in ("q8_0", "q4_0") else 9):
    for test in ("tg64", "tg64@d64"):
        r = next((r for r in L if r["type"] == ty and r["test"] == test and r.get("flash_attn") in (1, True, "1")), None)
        if not r:
            continue
        bpt = num(r.get("bytes_read_per_token"))
        fl = bpt / bw * 1e3 if bw == bw else nan
        rows.append((f"llama.cpp {ty.upper()} {test} (fa)", ty.upper(), "-", "%.3f" % (bpt / 1e9), "%.3f" % fl,
                     "%.3f" % num(r["ms_per_token"]), "%.1f" % (100 * fl / num(r["ms_per_token"])), "-", "-", "-", "-", "-"))
w = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
fmt = lambda r: "  ".join(str(c).ljust(w[i]) if i < 3 else str(c).rjust(w[i]) for i, c in enumerate(r))
print(fmt(hdr))
print("  ".join("-" * x for x in w))
for r in rows:
    print(fmt(r))
print("\nfloor ms: that run's bytes per token / its copy bandwidth (llama.cpp rows: / the median above; llama.cpp's bytes:")
print("  every GGUF tensor but token_embd, with its Q4_0 output.weight in Q6_K as llama-quantize makes it).")
print(f"x AR tau{tau:g}: tau * AR step / (draft round with tau context rows + verify of gamma+1), projected (random weights")
print("  accept nothing); loop x: the same with the round as the generation loop runs it.")
if "bf16" in J and "d8" in J:
    a, b = num(J["bf16"]["drafter"].get("draft_round_ms")), num(J["d8"]["drafter"].get("draft_round_ms"))
    print(f"int8 drafter's round {b:.3f} ms vs bf16's {a:.3f} ms: {b / a:.2f}x "
          f"(drafter weights {num(J['d8'].get('drafter_model', {}).get('weight_bytes')) / 1e9:.2f} GB vs "
          f"{num(J['bf16'].get('drafter_model', {}).get('weight_bytes')) / 1e9:.2f} GB)")
for k, ty in (("int8", "q8_0"), ("int4", "q4_0")):
    r = next((r for r in L if r["type"] == ty and r["test"] == "tg64@d64" and r.get("flash_attn") in (1, True, "1")), None)
    if k in J and r:
        a = num(J[k]["ar_decode"].get("ms_per_token"))
        print(f"dspark {k} AR {a:.3f} ms/token vs llama.cpp {ty.upper()} tg64@d64 {num(r['ms_per_token']):.3f}: "
              f"dspark {num(r['ms_per_token']) / a:.2f}x llama.cpp's speed")
print("\n" + json.dumps({"quant_bench": {k: {"ar_ms": num(j["ar_decode"].get("ms_per_token")),
                                             "pct_of_floor": num(j["ar_decode"].get("pct_of_floor")),
                                             "draft_round_ms": num(j.get("drafter", {}).get("draft_round_ms")),
                                             "bytes_per_token": num(j["model"].get("bytes_read_per_token"))}
                                         for k, j in J.items()},
                         "llamacpp": [{k: r.get(k) for k in ("type", "test", "flash_attn", "ms_per_token",
                                                            "bytes_read_per_token")} for r in L]}))
EOF

# The tail of every log, for what went wrong (device runs return at most 8 files).
for f in "$LOGS"/*.log "$LOGS"/*.err "$LOGS"/*.txt "$LOGS"/lcpp-*/llamacpp.log; do
    [ -s "$f" ] && { echo "==== $f"; tail -40 "$f"; }
done >"$OUTD/logs.txt" 2>/dev/null
if [ -n "${QB_CLEAN:-}" ]; then
    rm -rf "$M8" "$M4" "$D8" "${LCPP_ROOT:-/tmp/llamacpp}"/model-*.gguf*
    say "cleaned the quantized checkpoints and GGUFs"
fi
say "done"
