#!/usr/bin/env bash
# A kernel's instruction mix in Hopper machine code (sm_90a SASS), on a machine without a GPU: compiles one .cu
# of the CUDA backend and prints, per kernel whose name matches PATTERN, its registers, its instruction count and
# the count of each opcode that tells where the issue slots go (tensor-core products, shared loads, moves,
# integer arithmetic). Session 42 found the invariant wide GEMM's ~30 instructions a tensor-core product this way
# (6ae69e4). cuobjdump and nvdisasm come from NVIDIA's PyPI wheels (the toolkit here ships nvcc and ptxas only).
#   bash dev/sass_stats.sh src/backend/cuda/matmul_invariant.cu [PATTERN]
set -euo pipefail
src=${1:?usage: dev/sass_stats.sh FILE.cu [PATTERN]}
pattern=${2:-.}
tools=${DS_SASS_TOOLS:-$HOME/.cache/dspark-sass}
if [ ! -x "$tools/nvidia/cu13/bin/cuobjdump" ] || [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ]; then
  mkdir -p "$tools"
  pip download --quiet --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d "$tools"
  for w in "$tools"/nvidia_cuda_*.whl; do unzip -q -o "$w" -d "$tools"; done
fi
export PATH="$PATH:$tools/nvidia/cu13/bin"
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nvcc -cubin -arch=sm_90a -O3 -std=c++17 -DDS_X_BF16 -D_GNU_SOURCE -I"$root/src" -I"$root/include" -Xptxas -v \
  "$src" -o "$work/k.cubin" >"$work/ptxas.log" 2>&1 || { grep -E "error" "$work/ptxas.log" | head; exit 1; }
for fn in $(cuobjdump -sass "$work/k.cubin" | awk '/Function :/ {print $3}' | grep -E "$pattern"); do
  cuobjdump -sass -fun "$fn" "$work/k.cubin" | grep -E '^\s+/\*[0-9a-f]{4}\*/' |
    sed 's/ *\/\* 0x[0-9a-f]* \*\///; s/\/\*[0-9a-f]*\*\///' | awk '{$1 = $1; print}' >"$work/f.sass"
  regs=$(grep -A3 "entry function '$fn'" "$work/ptxas.log" | grep -o 'Used [0-9]* registers' | head -1 || true)
  printf '%s\n  %s, %d instructions:' "$fn" "$regs" "$(wc -l <"$work/f.sass")"
  for op in HMMA LDS LDG LDGSTS STS SHFL MOV IMAD.MOV IMAD FFMA FADD BAR; do # (IMAD counts IMAD.MOV too)
    printf ' %s %d' "$op" "$(grep -cE "^(@!?U?P[0-9T] )?$op([ .;]|$)" "$work/f.sass" || true)"
  done
  echo
done
