#!/usr/bin/env bash
# A device call carries the working tree as it is, other people's unfinished
# edits included. To build what is committed (HEAD) there instead:
#   here:   bash bench/at_head.sh --save   (writes .devdata/wip.diff and .devdata/wip_untracked.txt)
#   device: bash bench/at_head.sh && bash bench/gpu_check.sh
#           (carry .devdata/wip.diff and .devdata/wip_untracked.txt too)
# --save records the tracked changes (git diff HEAD, binary) and the
# untracked files; on the device the diff is applied in reverse (git apply
# needs no repository) and the untracked files are deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--save" ]; then
  mkdir -p .devdata
  git diff HEAD --binary >.devdata/wip.diff
  git ls-files --others --exclude-standard >.devdata/wip_untracked.txt
  echo "saved: $(wc -l <.devdata/wip_untracked.txt) untracked files, a diff of $(wc -c <.devdata/wip.diff) bytes"
  exit 0
fi
[ -f .devdata/wip.diff ] || { echo "at_head: no .devdata/wip.diff (run --save here first)"; exit 1; }
[ -s .devdata/wip.diff ] && git apply -R .devdata/wip.diff
while IFS= read -r f; do [ -n "$f" ] && rm -f -- "$f"; done <.devdata/wip_untracked.txt
echo "at_head: the tree is HEAD"
