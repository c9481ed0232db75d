#!/usr/bin/env bash
# Runs a command on the device with dev/pending/s40-batched-attention.patch applied (if the tree lacks it), e.g.
#   bash dev/pending/with-patch.sh env INV=1 TEMPS=1 PROFILES=mtbench-t1 LEVELS=1,8,64,256 bash bench/gpu_batch_8b.sh
cd "$(dirname "$0")/../.."
if ! grep -q ds_cu_attention_prefill_runs src/backend/cuda/cuda_internal.h; then # (a kept untracked file would block the apply)
  rm -f src/backend/cuda/attention_blocks.cu; git apply dev/pending/s40-batched-attention.patch || exit 1
fi
exec "$@"
