#!/usr/bin/env bash
# Issue 39's T=1 question on the GPU: the bundled pair's drafted generation
# vs plain decoding at T = 0 and T = 1 (32 dev prompts x 128 tokens, seeds
# fixed), then the same T = 1 runs with DS_CUDA_PROFILE=1 (per-op GPU time at
# exit; graphs off) to see where a sampled round's time goes. Reuses
# build-cuda/ from bench/gpu_check.sh on a warm machine. Logs in $OUT.
#   run (carry [".devdata/root.tar.xz", ".devdata/tls.tar.xz", ".devdata/devenv.sh"]): bash bench/gpu_t1.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
ds_build dspark_cli || exit 1 # incremental: a warm machine's build follows the tree
gen() { # label args...
  local l=$1; shift
  timeout 120 ./$B/dspark generate --backend cuda --json --prompt-file models/prompts-dev.jsonl -n 128 "$@" \
    >"$OUT/gen_$l.jsonl" 2>"$OUT/gen_$l.err"
  local rc=$?
  t "$l rc=$rc: $(grep '"summary"' "$OUT/gen_$l.jsonl" | python3 -c 'import json,sys
for l in sys.stdin:
    j=json.loads(l); print("%s %.1f tokens/s, tau %s, draft %s" % (j["summary"], j["tokens_per_s"], j.get("acceptance_length","-"), {k:v for k,v in j.items() if "draft" in k or "verify" in k}))')"
}
for rep in 1 2; do
  gen ar_t0_$rep --no-draft
  gen sd_t0_$rep
  gen ar_t1_$rep --no-draft --temp 1 --seed 1
  gen sd_t1_$rep --temp 1 --seed 1
done
DS_CUDA_PROFILE=1 gen prof_ar_t1 --no-draft --temp 1 --seed 1
grep -v '^{' "$OUT/gen_prof_ar_t1.err" | head -40
DS_CUDA_PROFILE=1 gen prof_sd_t1 --temp 1 --seed 1
grep -v '^{' "$OUT/gen_prof_sd_t1.err" | head -40
DS_CUDA_PROFILE=1 gen prof_sd_t0
grep -v '^{' "$OUT/gen_prof_sd_t0.err" | head -40
