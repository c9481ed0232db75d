#!/usr/bin/env bash
# The committed corpora are one fuzz/corpus/<harness>.tar.xz each (hundreds of
# small files would cost a device call's tree ~4 KB apiece).
#   bash fuzz/corpus.sh unpack            # every tarball into build-fuzz/corpus/<harness>/
#   bash fuzz/corpus.sh pack <harness>    # build-fuzz/corpus/<harness>/ back into its tarball
# Deterministic tarballs (sorted names, fixed owner and time), so an unchanged
# corpus packs to the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
dst=build-fuzz/corpus
case "${1:-}" in
unpack)
  for tb in fuzz/corpus/*.tar.xz; do
    name=$(basename "$tb" .tar.xz)
    rm -rf "$dst/$name" && mkdir -p "$dst/$name"
    tar -xJf "$tb" -C "$dst/$name"
  done ;;
pack)
  name=${2:?harness name}
  [ -d "$dst/$name" ] || { echo "no $dst/$name (unpack first)" >&2; exit 1; }
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$dst/$name" -cf - . | xz -9 >"fuzz/corpus/$name.tar.xz"
  echo "fuzz/corpus/$name.tar.xz: $(ls "$dst/$name" | wc -l) inputs, $(du -h "fuzz/corpus/$name.tar.xz" | cut -f1)" ;;
*) echo "usage: $0 unpack | pack <harness>" >&2; exit 2 ;;
esac
