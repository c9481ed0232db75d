# Sourced by the device scripts from the repository root (what each of them
# set up alike before): the device's environment (.devdata/devenv.sh), OUT
# (made; default /tmp/<script name>), t (a line stamped with the seconds
# since the start), B=build-cuda, M8=/tmp/synth-qwen3-8b, and
#   ds_build [TARGET...]  configure B for Hopper (CUDA, sm_90a) and build all or
#                         the targets, log in $OUT/build.log; on failure its
#                         tail is printed and the status is nonzero
#   ds_synth_8b           the Qwen3-8B-shaped checkpoint with a DSpark drafter
#                         at $M8 (dspark synth --seed 0), made once a machine
source .devdata/devenv.sh
OUT=${OUT:-/tmp/$(basename "${0%.sh}")}
mkdir -p "$OUT"
T0=$(date +%s)
t() { echo "[$(($(date +%s) - T0)) s] $*"; }
B=build-cuda
M8=/tmp/synth-qwen3-8b
ds_build() {
  local targets=()
  for x in "$@"; do targets+=(--target "$x"); done
  cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DDS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG -DDS_SERVE=$DS_SERVE -DDS_OPENBLAS=${DS_OPENBLAS:-OFF} >"$OUT/build.log" 2>&1 &&
    cmake --build $B -j"$(nproc)" "${targets[@]}" >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; return 1; }
}
ds_synth_8b() {
  [ -f $M8/config.json ] && [ -f $M8-dspark/config.json ] ||
    timeout 240 ./$B/dspark synth --like qwen3-8b --out $M8 --drafter --seed 0 >"$OUT/synth.log" 2>&1
}
