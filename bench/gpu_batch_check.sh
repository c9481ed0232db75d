#!/usr/bin/env bash
# One device call on the batched engine (issue 39): the GPU tests it rests on (attention paged == contiguous bit
# for bit, the Markov walks, the matmuls' row invariance, DS_CUDA_INVARIANT=1 test_batch), then at the Qwen3-8B
# shape the T=1 table at 1 / 8 / 64 / 256 with --trace (Algorithm 1's drafted steps, predicted vs measured), each
# level's speculation ceiling and decode TFLOP/s, per-op profiles at 256 (AR, fixed) and at 8 (fixed, T=1), and
# the single-request engine's round (concurrency 1's reference). ~9 min on a fresh H100; QUICK=1: the tests only.
#   run (carry [".devdata/root.tar.xz", ".devdata/tls.tar.xz", ".devdata/devenv.sh"]): bash bench/gpu_batch_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
# QUICK=1 (a short device budget): the tests only
if [ -n "${QUICK:-}" ]; then ds_build test_cuda_attention test_batch test_cuda_matmul test_cuda_markov || exit 1
else ds_build dspark_cli test_cuda_attention test_batch test_cuda_matmul test_cuda_markov || exit 1; fi
t built
timeout 100 $B/tests/test_cuda_attention >$OUT/att.log 2>&1; t "test_cuda_attention rc=$?"; grep -E "passed|FAIL|fail" $OUT/att.log | tail -6
timeout 60 $B/tests/test_cuda_markov >$OUT/markov.log 2>&1; t "test_cuda_markov rc=$?"; grep -E "passed|FAIL|fail" $OUT/markov.log | tail -3
timeout 60 $B/tests/test_cuda_matmul >$OUT/mm.log 2>&1; t "test_cuda_matmul rc=$?"; grep -E "passed|FAIL|fail" $OUT/mm.log | tail -3
DS_BACKEND=cuda DS_CUDA_INVARIANT=1 timeout 100 $B/tests/test_batch >$OUT/batch.log 2>&1; t "test_batch inv rc=$?"; grep -E "differ|FAIL|passed" $OUT/batch.log | tail -4
[ -n "${QUICK:-}" ] && exit 0
M=$M8; ds_synth_8b; t "synth rc=$?"
timeout 200 ./$B/dspark bench --concurrency 1,8,64,256 --backend cuda -m $M -d $M-dspark --temp 1 --sim-acceptance bench/profiles/mtbench-t1.json \
  --prompt-len 128 --decode 64 --sps-cache $OUT/sps.json --trace $OUT/trace.jsonl --json > $OUT/j1.json 2>$OUT/j1.err
t "table rc=$?"; tail -3 $OUT/j1.err
python3 - "$OUT" <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + '/j1.json'))
for lv in d['levels']:
    c = lv.get('ceiling')
    if c: print(lv['concurrency'], 'ceiling x AR: free drafter %.2f (%.0f tokens), with draft pass %.1f ms %.2f (%.0f tokens)' % (c['free_drafter_x_ar'], c['free_drafter_verify_tokens'], 1e3 * c['draft_pass_s'], c['with_draft_pass_x_ar'], c['with_draft_pass_verify_tokens']))
    for a in ('ar', 'fixed', 'confidence'):
        x = lv[a]
        print(lv['concurrency'], a, round(x['tokens_per_s']), 'tau %.2f' % x['tau'], 'steps', x['steps'], 'rows', x['rows'],
              'ver', x['verified_drafts'], 'draft_s %.2f' % x['draft_s'], 'passes', x.get('draft_passes'), 'pass ms %.1f' % (1e3 * x.get('draft_pass_s', 0)), 'skips', x['draft_skips'], 'probes', x.get('draft_probes'), 'unmeas', x.get('draft_unmeasured'), 'fwd %.2f' % x['forward_s'], 'decode step ms %.2f' % (1e3 * x.get('decode_step_s', 0)), 'decode TFLOP/s %.0f' % x.get('decode_tflops', 0))
shown = {}
run = None # Algorithm 1's drafted steps and the predictions (--trace), per level
for line in open(sys.argv[1] + '/trace.jsonl'):
    x = json.loads(line)
    if 'run' in x:
        run = (x['run']['arm'], x['run']['concurrency'])
        continue
    if run[0] == 'Algorithm 1' and x['drafted']:
        shown[run] = shown.get(run, 0) + 1
        if shown[run] > 8: continue
        print(run[1], 'step', x['step'], x['why'], 'R', x['decoding'], 'rows', x['rows'], 'pf', x['prefill_rows'],
              'draft pred/meas ms %.1f/%.1f' % (1e3 * x['draft_cost_pred'], 1e3 * x['draft_s']),
              'fwd pred/meas ms %.1f/%.1f' % (1e3 * x['step_pred'], 1e3 * x['forward_s']),
              'plain %.1f' % (1e3 * x['plain_pred']), 'tokens pred/meas %.1f/%d' % (x['tau_pred'], x['tokens']))
print('Algorithm 1 drafted steps per (arm, level):', shown)
c = json.load(open(sys.argv[1] + '/sps.json'))
print([(b['tokens'], round(b['seconds'] * 1e3, 2)) for b in c['buckets']])
PY
for arm in ar fixed; do
  DS_CUDA_PROFILE=1 timeout 100 ./$B/dspark bench --concurrency 256 --arms $arm --backend cuda -m $M -d $M-dspark --temp 0 \
    --sim-acceptance bench/profiles/mtbench-t1.json --prompt-len 128 --decode 32 > $OUT/p_$arm.txt 2>$OUT/p_$arm.err
  t "$arm profile rc=$?"; tail -1 $OUT/p_$arm.txt; grep -E "in ops|attention|linear|markov" $OUT/p_$arm.err
done
# concurrency 8, T=1: where the fixed round cost ~2.8 AR steps in s40 (single engine: 1.28); which ops
DS_CUDA_PROFILE=1 timeout 100 ./$B/dspark bench --concurrency 8 --arms fixed --backend cuda -m $M -d $M-dspark --temp 1 \
  --sim-acceptance bench/profiles/mtbench-t1.json --prompt-len 128 --decode 32 --json > $OUT/p8.json 2>$OUT/p8.err
t "fixed c=8 profile rc=$?"; grep -E "in ops" -A28 $OUT/p8.err | head -30
python3 -c "import json,sys; x=json.load(open(sys.argv[1]))['levels'][0]['fixed']; print({k: x[k] for k in ('tokens_per_s','steps','draft_pass_s','decode_step_s','forward_s','draft_s') if k in x})" $OUT/p8.json
# concurrency 1 against the single-request engine: its round in AR steps (decode_step_s fixed / AR above)
timeout 120 ./$B/dspark bench --backend cuda -m $M -d $M-dspark --reps 5 --decode 64 --bandwidth-mib 0 > $OUT/single.txt 2>&1
t "single engine rc=$?"; grep -E "AR step|draft \+ verify|round" $OUT/single.txt | head -6
(cd $OUT && tar cJf logs.tar.xz --remove-files $(ls | grep -v '^logs.tar.xz$')) # (8 files at most come back)
t done
