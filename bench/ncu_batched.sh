#!/usr/bin/env bash
# The second call after gpu_batch_check.sh, on the still-warm machine (its build and /tmp/synth-qwen3-8b
# kept): ncu on the grouped attention kernel and on the batched Markov walk's step kernel at 256 in flight.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
ds_build dspark_cli || exit 1
M=$M8; ds_synth_8b; t "ready"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 90 $NCU --clock-control none -k regex:attn_blocks --launch-skip 100 -c 1 --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section LaunchStats ./$B/dspark bench --concurrency 256 --arms fixed --backend cuda -m $M -d $M-dspark \
  --temp 0 --sim-acceptance bench/profiles/mtbench-t1.json --prompt-len 128 --decode 16 > $OUT/ncu_blocks.txt 2>&1; t "ncu rc=$?"
grep -E "attn_blocks|Duration|DRAM Through|L2 Cache Through|L1/TEX Cache Through|Compute \(SM\)|Achieved Occ|Registers Per|Warp Cycles Per Issued|Grid Size|Waves" $OUT/ncu_blocks.txt | head -14
timeout 90 $NCU --clock-control none -k regex:markov_seqs_step --launch-skip 20 -c 1 --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis ./$B/dspark bench --concurrency 256 --arms fixed \
  --backend cuda -m $M -d $M-dspark --temp 1 --sim-acceptance bench/profiles/mtbench-t1.json --prompt-len 128 --decode 16 \
  > $OUT/ncu_markov.txt 2>&1; t "ncu markov rc=$?"
grep -E "markov_seqs|Duration|DRAM Through|Compute \(SM\)|Achieved Occ|Registers Per|Warp Cycles Per Issued|Grid Size|Issue Slots|FMA|Stall" $OUT/ncu_markov.txt | head -16
t done
