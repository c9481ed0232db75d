#!/usr/bin/env bash
# Starts `dspark serve` on an ephemeral loopback port (the bundled pair unless
# SERVE_ARGS says otherwise), runs bench/serve_load against it at each client
# count, and prints one Markdown table (issue 40's serve_load measurement).
#
#   bench/serve_load.sh [BUILD_DIR]            (default: ./build)
#
# Environment (defaults in brackets):
#   CLIENTS      client counts, space-separated          [1 16 64]
#   DURATION     seconds a run                            [60]
#   MAX_TOKENS   max_tokens a request                     [64]
#   TEMPERATURE  temperature                              [0]
#   SERVE_ARGS   extra `dspark serve` arguments, e.g. "--batch 64 -m DIR -d DIR"
#   LOAD_ARGS    extra serve_load arguments, e.g. "--chat"
#   GENERATE_ARGS  with CHECK=1: `dspark generate`'s -m/-d, the same pair as SERVE_ARGS names
#   CHECK=1      at T = 0, also check every answer: against the first answer to
#                the same prompt (--check-t0) and against `dspark generate`'s
#                offline answer for it (--offline), the same prompt text and max_tokens
#   OUT          folder for the JSON results and the server's log [a temp dir]
#
# On random synth weights (a real model's shape, e.g. on the GPU), every answer
# max_tokens long and counted by its ids:
#   SERVE_ARGS="--backend cuda -m SYNTH -d SYNTH_DRAFTER --tokenizer TOK --batch 64" \
#   LOAD_ARGS="--ids --ignore-eos --token-ids" bench/serve_load.sh build
# The must-show run of issue 40 (64 clients, 10 minutes, every answer checked):
#   CLIENTS=64 DURATION=600 CHECK=1 bench/serve_load.sh build
# Exit status: 0 when every run had 0 errors, 0 lost and (CHECK=1) 0 mismatches,
# and the server exited 0 on SIGTERM at the end.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dspark=$build/dspark
load=$build/bench/serve_load
for bin in "$dspark" "$load"; do
  if [[ ! -x $bin ]]; then
    echo "serve_load.sh: $bin not found (cmake --build $build --target dspark_cli serve_load)" >&2
    exit 2
  fi
done
CLIENTS=${CLIENTS:-1 16 64}
DURATION=${DURATION:-60}
MAX_TOKENS=${MAX_TOKENS:-64}
TEMPERATURE=${TEMPERATURE:-0}
out=${OUT:-$(mktemp -d /tmp/serve_load.XXXXXX)}
mkdir -p "$out"
log=$out/serve.log

# shellcheck disable=SC2086 # SERVE_ARGS and LOAD_ARGS are word lists on purpose
"$dspark" serve --host 127.0.0.1 --port 0 ${SERVE_ARGS:-} 2>"$log" &
server=$!
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  if kill -0 "$server" 2>/dev/null; then
    kill -TERM "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
}
trap cleanup EXIT

# The server prints "listening on http://HOST:PORT" once it accepts connections.
url=
for _ in $(seq 1 600); do
  url=$(grep -o 'listening on http://[^ ]*' "$log" | head -1 | sed 's/listening on //') || true
  [[ -n $url ]] && break
  if ! kill -0 "$server" 2>/dev/null; then
    echo "serve_load.sh: dspark serve exited before listening:" >&2
    cat "$log" >&2
    exit 2
  fi
  sleep 0.2
done
if [[ -z $url ]]; then
  echo "serve_load.sh: dspark serve did not print 'listening on' within 120 s (log: $log)" >&2
  exit 2
fi
echo "serve_load.sh: dspark serve (pid $server) at $url; results in $out" >&2

check_args=()
if [[ ${CHECK:-0} == 1 ]]; then
  # The offline answers: the same prompts as serve_load sends them, through
  # `dspark generate` with the server's model pair and max_tokens.
  # shellcheck disable=SC2086
  "$load" ${LOAD_ARGS:-} --write-prompts "$out/prompts.jsonl"
  gen_flags=()
  [[ " ${LOAD_ARGS:-} " == *" --chat "* ]] && gen_flags+=(--chat)
  [[ " ${LOAD_ARGS:-} " == *" --ignore-eos "* ]] && gen_flags+=(--ignore-eos)
  # shellcheck disable=SC2086
  if "$dspark" generate ${GENERATE_ARGS:-} --prompt-file "$out/prompts.jsonl" -n "$MAX_TOKENS" \
    --temp "$TEMPERATURE" --json "${gen_flags[@]}" >"$out/offline.jsonl"; then
    check_args=(--check-t0 --offline "$out/offline.jsonl")
  else
    # e.g. --chat on a model without a chat template: the server renders a plain
    # transcript that generate does not; the answers are still checked against each other.
    echo "serve_load.sh: no offline answers (dspark generate failed, above): checking repeats only (--check-t0)" >&2
    check_args=(--check-t0)
  fi
fi

rows=$out/rows.md
: >"$rows"
status=0
for c in $CLIENTS; do
  echo "serve_load.sh: $c clients, $DURATION s" >&2
  # shellcheck disable=SC2086
  "$load" --url "$url" --clients "$c" --duration "$DURATION" --max-tokens "$MAX_TOKENS" \
    --temperature "$TEMPERATURE" --server-pid "$server" --json "$out/c$c.json" --row "$rows" \
    "${check_args[@]}" ${LOAD_ARGS:-} | tee "$out/c$c.txt" || status=1
done

# A clean stop is part of the run: SIGTERM must drain and exit 0.
kill -TERM "$server"
server_rc=0
wait "$server" || server_rc=$?
echo "serve_load.sh: dspark serve exited $server_rc after SIGTERM" >&2
[[ $server_rc == 0 ]] || status=1

echo
echo "dspark serve ${SERVE_ARGS:-(bundled pair)}; serve_load max_tokens $MAX_TOKENS, T $TEMPERATURE ${LOAD_ARGS:-}; $(nproc) CPUs"
echo
echo "| clients | s | requests | req/s | out tok/s | TTFT p50 ms | TTFT p99 ms | ITL/event p50 ms | ITL/event p99 ms | tok/event | decode tok/s/req p50 | errors | lost | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
cat "$rows"
exit $status
