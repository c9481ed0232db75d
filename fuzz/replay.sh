#!/usr/bin/env bash
# Builds the libFuzzer harnesses with clang (ASan + UBSan) in build-fuzz and
# replays every committed corpus once (-runs=0: each input executed, no new
# ones generated). Fails on any crash, leak, sanitizer report or timeout.
# What .ci/run calls; about a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

CC=clang cmake -S fuzz -B build-fuzz >/dev/null
cmake --build build-fuzz -j"$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
bash fuzz/corpus.sh unpack
for dir in build-fuzz/corpus/*/; do
  name=$(basename "$dir")
  if "./build-fuzz/fuzz_$name" "$dir" -runs=0 -timeout=10 >"$log" 2>&1; then
    echo "fuzz replay: $name: $(ls "$dir" | wc -l) inputs, $(grep -o 'cov: [0-9]*' "$log" | tail -1)"
  else
    cat "$log"
    echo "fuzz replay: $name FAILED (rerun: ./build-fuzz/fuzz_$name $dir -runs=0)"
    exit 1
  fi
done
echo "fuzz replay: all corpora pass"
