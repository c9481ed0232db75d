#!/usr/bin/env bash
# Records the engine's own pinned values (testdata/pinned/pico.json) for both
# build variants: the hashes of test_host_numerics and test_pico's counts.
# Run it only after a deliberate change of numerics, and say so in the commit:
# the values hold bit for bit on every host, so a test that disagrees with
# them otherwise has found a real change.
set -euo pipefail
cd "$(dirname "$0")/.."
for variant in ON OFF; do
  dir=build-pin-x-bf16-$variant
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DDS_CUDA=OFF -DDS_X_BF16=$variant >/dev/null
  cmake --build "$dir" -j"$(nproc)" --target test_host_numerics test_pico
  DS_PIN_WRITE=1 "$dir/tests/test_host_numerics"
  DS_PIN_WRITE=1 "$dir/tests/test_pico"
done
git diff --stat testdata/pinned/pico.json
