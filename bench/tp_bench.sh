#!/usr/bin/env bash
# Issue 43, must-show 1: tensor parallel on several GPUs of one host. AR decode ms/token of the Qwen3-8B shape on
# 1 GPU vs --tp 2 (and 4/8 where the host has them), the Qwen3-32B shape on 2 GPUs, and drafted rounds under TP,
# on `dspark synth` checkpoints (random bf16 weights of the real shapes), all in one device call:
#   device (kind nvidia-h100-x2 or larger): bash bench/tp_bench.sh
#   (carry the .devdata files gpu_check.sh names; the 32B shape needs ~66 GB of disk and 2 x 80 GB GPUs)
# Logs in $OUT (or /tmp/tp_bench). NCCL_NVLS_ENABLE=0: NVLink multicast stays off (KINDS.md).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
export NCCL_NVLS_ENABLE=0
NEW=${NEW:-128}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
NG=$(nvidia-smi -L | wc -l)
ds_build || exit 1
t "built ($(grep -o 'NCCL .*' "$OUT/build.log" | head -1))"
DS_BACKEND=cuda ./$B/tests/test_tp >"$OUT/test_tp.log" 2>&1; t "test_tp on the GPUs rc=$? $(tail -1 "$OUT/test_tp.log")"
run() { # label, model, drafter ('' for none), tp
  local d=(); [ -n "$3" ] && d=(-d "$3") || d=(--no-draft)
  ./$B/dspark generate --backend cuda -m "$2" "${d[@]}" --tp "$4" --prompt-file /tmp/tp_prompts.jsonl -n $NEW \
    --ignore-eos --json >"$OUT/$1.jsonl" 2>"$OUT/$1.err"
  local rc=$?
  python3 - "$OUT/$1.jsonl" "$1" "$rc" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows: print(sys.argv[2], "rc", sys.argv[3], "no output"); sys.exit()
dec = [r["decode_tokens_per_s"] for r in rows if r.get("decode_tokens_per_s")]
tau = [r.get("tau") for r in rows if r.get("tau")]
print("%-22s %d prompts: decode %.3f ms/token (median of %d)%s" % (sys.argv[2], len(rows),
      1e3 / sorted(dec)[len(dec) // 2], len(dec), "" if not tau else ", tau %.2f" % (sum(tau) / len(tau))))
PY
}
python3 -c "import json; [print(json.dumps({'input_ids': list(range(100 + i, 164 + i))})) for i in range(4)]" >/tmp/tp_prompts.jsonl
S8=$M8
ds_synth_8b; t "synth 8B rc=$?"
run q8_tp1 $S8 "" 1
for n in 2 4 8; do [ $NG -ge $n ] && run q8_tp$n $S8 "" $n; done
run q8_tp1_drafted $S8 $S8-dspark 1
[ $NG -ge 2 ] && run q8_tp2_drafted $S8 $S8-dspark 2
./$B/dspark bench --backend cuda -m $S8 --prompt-len 64 --decode 32 --json >"$OUT/bench8.json" 2>"$OUT/bench8.err"
t "bench 8B (1 GPU: its copy-bandwidth floor) rc=$?"; grep -iE "floor|bandwidth" "$OUT/bench8.err" | head -3
if [ $NG -ge 2 ] && [ "$(df --output=avail -B1G /tmp | tail -1)" -gt 70 ]; then
  rm -rf $S8 $S8-dspark
  S32=/tmp/synth-qwen3-32b
  ./$B/dspark synth --like qwen3-32b --out $S32 --seed 0 >"$OUT/synth32.log" 2>&1; t "synth 32B rc=$?"
  run q32_tp2 $S32 "" 2
  [ $NG -ge 4 ] && run q32_tp4 $S32 "" 4
fi
t done
