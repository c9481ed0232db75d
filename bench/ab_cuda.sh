#!/usr/bin/env bash
# One device call's worth of same-call A/B on the Qwen3-8B-shaped synthetic
# checkpoint: builds the working tree (and, with BASE_FILES, a second tree
# in /tmp/base that has HEAD's versions of those files), runs the GPU tests
# (TESTS=1), then `dspark bench` twice per variant, alternating (each line
# also kept in bench.txt: a long run's output tail may lose them), and with
# TRACE_ENV a traced bench whose attention launches it summarizes per block
# (quantiles of wait, prologue, key loop, drain; us from the launch before), the
# critical paths of a decode, a verify and a draft, and the draft head's walk per step;
# KEEP_TRACE=1 also brings the trace back (ab/trace.txt.xz in $OUT/ab.tar.xz; the 8B bench's trace is
# ~700 MB of text: with TESTS=1 and a round of bench, a traced call takes 400-500 s).
#
#   bash bench/make_devdata.sh            # here, once per checkout
#   # on the device (carry: [".devdata/root.tar.xz", ".devdata/tls.tar.xz", ".devdata/devenv.sh"]: the tracked tree
#   # is ~61 MiB and .devdata/root, which a local build unpacks, would pass the 64 MiB a call carries), e.g.
#   TESTS=1 BASE_FILES="src/backend/cuda/attention.cu" bash bench/ab_cuda.sh
#   VARIANTS="graphs=DS_X=1 opbyop=DS_CUDA_GRAPHS=0" TRACE_ENV=DS_X=1 bash bench/ab_cuda.sh
#   BASE_FILES=- bash bench/ab_cuda.sh    # an A/A: the base is the working tree itself, built in /tmp/base
#   BASE_REV=935d2bd BASE_FILES="src/backend/cuda/matmul_ring.cu" bash bench/ab_cuda.sh  # the base's files from a rev
#   (or BASE_FROM=DIR: from DIR/<file>, e.g. a carried .devdata/base made by `git archive REV FILES | tar -x -C DIR`)
# The device's .git is the session's first commit, not the local HEAD: without BASE_FROM, the base's
# files come from there.
#
# CMAKE_EXTRA: more cmake flags for the working tree's build only, e.g. BASE_FILES=- CMAKE_EXTRA=-DDS_X_BF16=ON
# benches the default build ("base") against the DS_X_BF16 one.
# ROUNDS: benches per variant (default 2), alternating.
# VERIFY_ALL=1: each bench line also lists the verify of n = 1..gamma+1 rows (a verify's cost by row count).
# Without TESTS only dspark_cli is built (a fresh machine's build: ~75 s with the tests, less without).
# TESTS_ENV (with TESTS): the test_cuda_* op tests and test_cuda_graphs (ring kernels) again with ENV=V[,ENV2=V].
# VARIANTS: space-separated name=ENV=V[,ENV2=V] run with the new binary
# (default "new=DS_X=1"); with BASE_FILES the base binary runs first as
# "base". Logs in /tmp/ab (tarred to $OUT/ab.tar.xz when OUT is set).
# The kernels' tuning is constants in the source (README: the few switches
# the engine reads), so a tuning A/B is BASE_FILES / BASE_REV against the
# working tree with the constant changed, or an experiment's own variable
# read in the working tree only.
set -uo pipefail
cd "$(dirname "$0")/.."
source .devdata/devenv.sh
T0=$(date +%s)
t() { echo "[$(($(date +%s) - T0)) s] $*"; }
B=build-cuda
M=${SYNTH_DIR:-/tmp/synth-qwen3-8b}
R=/tmp/ab
rm -rf $R && mkdir -p $R
CM="-DCMAKE_BUILD_TYPE=Release -DDS_CUDA=ON -DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG"
if [ -n "${BASE_FILES:-}" ]; then
    rm -rf /tmp/base && mkdir -p /tmp/base
    tar --exclude=./build-cuda --exclude=./.git -cf - . | tar -C /tmp/base -xf -
    for f in $BASE_FILES; do
        [ "$f" = - ] || { [ -n "${BASE_FROM:-}" ] && cp "$BASE_FROM/$f" /tmp/base/"$f"; } ||
            git show "${BASE_REV:-HEAD}":"$f" >/tmp/base/"$f"
    done
    (cd /tmp/base && cmake -S . -B build-cuda $CM >$R/build_base.log 2>&1 &&
        cmake --build build-cuda -j6 --target dspark_cli >>$R/build_base.log 2>&1
     echo $? >$R/build_base.rc) &
fi
cmake -S . -B $B $CM ${CMAKE_EXTRA:-} >$R/build.log 2>&1 && cmake --build $B -j$([ -n "${BASE_FILES:-}" ] && echo 10 || nproc) \
    $([ -n "${TESTS:-}" ] || echo --target dspark_cli) >>$R/build.log 2>&1
rc=$?
wait
[ $rc -eq 0 ] || { grep -E "error" $R/build.log | head; tail -20 $R/build.log; exit 1; }
[ -z "${BASE_FILES:-}" ] || [ "$(cat $R/build_base.rc)" = 0 ] || { tail -20 $R/build_base.log; exit 1; }
[ -f $M.done ] || { timeout 200 ./$B/dspark synth --like qwen3-8b --out $M --drafter --seed 0 >$R/synth.log 2>&1 &&
    touch $M.done; }
t built
if [ -n "${TESTS:-}" ]; then
    CUDA_OP_TESTS="test_cuda_elementwise test_cuda_matmul test_cuda_attention test_cuda_norm_rope test_cuda_sample test_cuda_markov"
    for t in $CUDA_OP_TESTS; do
        timeout 120 ./$B/tests/$t >$R/$t.log 2>&1
        echo "$t rc=$? $(tail -1 $R/$t.log)"
    done
    timeout 120 ./$B/tests/test_cuda_graphs >$R/graphs.log 2>&1
    echo "test_cuda_graphs rc=$? $(tail -1 $R/graphs.log)"
    # an experiment's tests get 60 s each (a hung experiment costs no more)
    [ -z "${TESTS_ENV:-}" ] || { for t in $CUDA_OP_TESTS; do
            env $(echo "$TESTS_ENV" | tr , ' ') timeout 60 ./$B/tests/$t >$R/${t}_env.log 2>&1
            echo "$t with $TESTS_ENV rc=$? $(tail -1 $R/${t}_env.log)"
        done
        env $(echo "$TESTS_ENV" | tr , ' ') timeout 60 ./$B/tests/test_cuda_graphs --ring >$R/graphs_env.log 2>&1
        echo "test_cuda_graphs, ring kernels, with $TESTS_ENV rc=$? $(tail -1 $R/graphs_env.log)"; }
    timeout 120 ./$B/tests/test_cuda_graphs --ring >$R/graphs_ring.log 2>&1
    echo "test_cuda_graphs, ring kernels at the test shapes rc=$? $(tail -1 $R/graphs_ring.log)"
    DS_BACKEND=cuda timeout 200 ctest --test-dir $B -R '^test_(qwen3|dspark|gemma4|dspark_gemma4|gemma4_unified|pico|sample_ops)$' \
        -j6 >$R/golden.log 2>&1
    echo "goldens (DS_BACKEND=cuda) rc=$? $(grep -E 'tests passed' $R/golden.log)"
    t tests
fi
bench() { # name binary env
    env $3 timeout 100 $2 bench --backend cuda -m $M -d $M-dspark --prompt-len 64 --decode 64 --json 2>/dev/null |
        python3 -c "
import json, sys
j = json.load(sys.stdin); v = {r['rows']: r['ms'] for r in j['verify']}; ar = j['ar_decode']['ms_per_token']
c = {r['context_rows']: r['ms'] for r in j['drafter'].get('draft_with_context_ms', [])}
lr = {r['context_rows']: r['ms'] for r in j['drafter'].get('loop_round_ms', [])}
print('%-10s AR %.3f  verify-1 %.3f verify-8 %.3f  draft %.3f  round %.3f = %.3f AR%s%s%s%s  prefill %.0f tok/s' % ('$1', ar, v[1], v[8],
      j['drafter']['draft_round_ms'], j['drafter']['round_ms'], j['drafter']['round_ms'] / ar,
      ('  (with 4 context rows %.3f = %.3f AR)' % (c[4] + v[8], (c[4] + v[8]) / ar)) if 4 in c else '',
      ('  loop round 1 / 4 context rows %.3f / %.3f = %.3f / %.3f AR' % (lr[1], lr[4], lr[1] / ar, lr[4] / ar)) if 4 in lr else '',
      '' if j.get('drafted_run', {}).get('tokens_equal_ar', True) else '  DRAFTED != AR',
      ('  verify 1..%d: ' % max(v) + ' '.join('%.3f' % v[n] for n in sorted(v))) if '${VERIFY_ALL:-}' else '',
      j['prefill']['tokens_per_s']))" |
        tee -a $R/bench.txt
}
# The base runs first in odd rounds and last in even ones: session 16's calls 5-6 (in 5 the base was the new
# tree's code, an A/A by accident) had it first every round and slower by 0.03 ms (AR) and 0.1 (verify-8).
for i in $(seq ${ROUNDS:-2}); do
    [ -z "${BASE_FILES:-}" ] || [ $((i % 2)) = 0 ] || bench base /tmp/base/build-cuda/dspark DS_X=1
    for v in ${VARIANTS:-new=DS_X=1}; do bench "${v%%=*}" ./$B/dspark "$(echo "${v#*=}" | tr , ' ')"; done
    [ -z "${BASE_FILES:-}" ] || [ $((i % 2)) = 1 ] || bench base /tmp/base/build-cuda/dspark DS_X=1
done
t bench
# Each variant's medians over its rounds, and its AR against the first variant's (base first where there is one).
python3 - $R/bench.txt <<'PY'
import collections, re, statistics, sys
runs = collections.OrderedDict()
for l in open(sys.argv[1]):
    f = l.split()
    if len(f) > 12 and f[1] == "AR":
        lp = re.search(r"loop round 1 / 4 context rows \S+ / \S+ = \S+ / (\S+) AR", l)
        runs.setdefault(f[0], []).append((float(f[2]), float(f[6]), float(f[8]), float(f[12]),
                                          float(lp.group(1)) if lp else float("nan")))
if len(runs) > 1:
    first = statistics.median(r[0] for r in next(iter(runs.values())))
    print("medians    AR     vs first  verify-8  draft  draft+verify-8 (AR steps)  loop round, 4 context rows (AR steps)")
    for name, rs in runs.items():
        m = [statistics.median(r[i] for r in rs) for i in range(5)]
        print("%-10s %.3f  %+6.2f %%   %.3f    %.3f  %.3f                      %.3f" % (name, m[0], 100 * (m[0] / first - 1),
                                                                                     m[1], m[2], m[3], m[4]))
PY
if [ -n "${TRACE_ENV:-}" ]; then
    env $(echo "$TRACE_ENV" | tr , ' ') DS_CUDA_RING_TRACE=$R/trace.txt timeout 120 ./$B/dspark bench --backend cuda \
        -m $M -d $M-dspark --prompt-len 64 --decode 8 --reps 1 >/dev/null 2>&1
    python3 bench/ring_timeline.py $R/trace.txt --attention-blocks
    # a decode step's and a verify step's critical path by kind of launch
    for m in 1 8; do echo "critical path, $m row(s):"; python3 bench/ring_timeline.py $R/trace.txt --rows $m --summary; done
    echo "critical path, a draft (a verify's LM head to the drafter's):"
    python3 bench/ring_timeline.py $R/trace.txt --draft --summary
    echo "the greedy draft's head (bounds kernel and walk, per step):"
    python3 bench/ring_timeline.py $R/trace.txt --walk
    # KEEP_TRACE=1: the trace comes back in ab.tar.xz (ab/trace.txt.xz) for ring_timeline.py's other modes here
    if [ -n "${KEEP_TRACE:-}" ]; then xz -T0 -3 $R/trace.txt; else rm -f $R/trace.txt; fi
fi
[ -z "${OUT:-}" ] || tar -C /tmp -cJf "$OUT/ab.tar.xz" ab
t done
