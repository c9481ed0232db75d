#!/usr/bin/env bash
# A screenshot of dspark serve's chat page with a streamed answer (issue 40,
# must-show 3): starts `dspark serve` on an ephemeral loopback port, opens
# /?q=QUESTION&autosend=1 in headless Chromium (the Debian package), waits
# until the page says the answer is complete (<body data-state="done">), and
# saves a PNG.
#
#   dev/chat_screenshot.sh [BUILD_DIR [OUT.png]]     (defaults: ./build, bench/journal/serve-chat.png)
#
# Environment: QUESTION (the question asked), MAX_TOKENS [96], TEMPERATURE [0],
# SERVE_ARGS (extra `dspark serve` arguments), WIDTH x HEIGHT [1000 x 700],
# CHROMIUM (the browser binary) [chromium].
# STOP_AFTER=S: press the page's Stop button S seconds into the answer instead
# of waiting for it; the page must then say "stopped" and the server's
# /metrics count the request as aborted (the disconnect cancelled it).
#
# Why the DevTools protocol and not `chromium --screenshot`: that one shoots
# at the load event (or a virtual-time budget), which does not wait for a
# streamed fetch body, so the answer is caught half-written. The protocol is
# spoken over --remote-debugging-pipe (JSON messages ended by NUL on fds 3
# and 4) with Python's standard library: no websocket package, no Node.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
out=${2:-$root/bench/journal/serve-chat.png}
chromium=${CHROMIUM:-chromium}
question=${QUESTION:-Who wrote Pride and Prejudice, and what is it about?}
if ! command -v "$chromium" >/dev/null; then
  echo "chat_screenshot.sh: $chromium not found (apt-get install chromium)" >&2
  exit 2
fi
if [[ ! -x $build/dspark ]]; then
  echo "chat_screenshot.sh: $build/dspark not found" >&2
  exit 2
fi

tmp=$(mktemp -d /tmp/chat_screenshot.XXXXXX)
# shellcheck disable=SC2086 # SERVE_ARGS is a word list on purpose
"$build/dspark" serve --host 127.0.0.1 --port 0 ${SERVE_ARGS:-} 2>"$tmp/serve.log" &
server=$!
cleanup() {
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
url=
for _ in $(seq 1 600); do
  url=$(grep -o 'listening on http://[^ ]*' "$tmp/serve.log" | head -1 | sed 's/listening on //') || true
  [[ -n $url ]] && break
  kill -0 "$server" 2>/dev/null || { cat "$tmp/serve.log" >&2; exit 2; }
  sleep 0.2
done
[[ -n $url ]] || { echo "chat_screenshot.sh: dspark serve did not start" >&2; exit 2; }

python3 - "$chromium" "$url" "$question" "$out" "${MAX_TOKENS:-96}" "${TEMPERATURE:-0}" \
  "${WIDTH:-1000}" "${HEIGHT:-700}" "$tmp/profile" "${STOP_AFTER:-}" <<'PY'
import base64, json, os, re, subprocess, sys, time, urllib.parse, urllib.request

chromium, url, question, out, max_tokens, temperature, width, height, profile, stop_after = sys.argv[1:]
page = url.rstrip("/") + "/?" + urllib.parse.urlencode(
    {"q": question, "autosend": "1", "max_tokens": max_tokens, "temperature": temperature})

# fd 3: commands to the browser; fd 4: its answers and events.
cmd_r, cmd_w = os.pipe()
evt_r, evt_w = os.pipe()


def child_fds():
    # Via fds above 3 and 4 first: the pipes' own numbers may be 3 or 4 the other way round.
    a, b = os.dup(cmd_r), os.dup(evt_w)
    hi_a, hi_b = os.dup2(a, 100), os.dup2(b, 101)
    os.dup2(hi_a, 3)
    os.dup2(hi_b, 4)


browser = subprocess.Popen(
    [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
     "--remote-debugging-pipe", f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    pass_fds=(3, 4), preexec_fn=child_fds)
os.close(cmd_r)
os.close(evt_w)
wfile = os.fdopen(cmd_w, "wb", buffering=0)
rfile = os.fdopen(evt_r, "rb", buffering=0)
pending = b""
next_id = 0


def call(method, params=None, session=None, timeout=60):
    """Sends one command and returns its result (events in between are skipped)."""
    global next_id, pending
    next_id += 1
    msg = {"id": next_id, "method": method, "params": params or {}}
    if session:
        msg["sessionId"] = session
    wfile.write(json.dumps(msg).encode() + b"\0")
    deadline = time.monotonic() + timeout
    while True:
        while b"\0" not in pending:
            if time.monotonic() > deadline:
                raise SystemExit(f"chat_screenshot: no answer to {method}")
            chunk = rfile.read(65536)
            if not chunk:
                raise SystemExit("chat_screenshot: the browser closed its pipe")
            pending += chunk
        raw, pending = pending.split(b"\0", 1)
        m = json.loads(raw)
        if m.get("id") == next_id:
            if "error" in m:
                raise SystemExit(f"chat_screenshot: {method}: {m['error']}")
            return m.get("result", {})


try:
    target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    call("Emulation.setDeviceMetricsOverride",
         {"width": int(width), "height": int(height), "deviceScaleFactor": 1, "mobile": False}, session)
    call("Page.enable", {}, session)
    call("Page.navigate", {"url": page}, session)
    state, deadline, pressed = "", time.monotonic() + 300, None
    while state not in ("done", "error", "stopped"):
        if stop_after and state == "streaming" and pressed is None:
            time.sleep(float(stop_after))
            call("Runtime.evaluate", {"expression": "document.getElementById('stop').click()"}, session)
            pressed = time.monotonic()
        if time.monotonic() > deadline:
            raise SystemExit(f"chat_screenshot: the answer did not complete in 300 s (state {state!r})")
        time.sleep(0.25)
        r = call("Runtime.evaluate", {"expression": "document.body ? document.body.dataset.state : ''",
                                      "returnByValue": True}, session)
        state = r.get("result", {}).get("value") or ""
    stats = call("Runtime.evaluate", {"expression": "Array.from(document.querySelectorAll('.stats'))"
                                                    ".map(e => e.textContent).filter(Boolean).join(' | ')",
                                      "returnByValue": True}, session)["result"].get("value", "")
    time.sleep(0.3)  # the last paint
    png = base64.b64decode(call("Page.captureScreenshot", {"format": "png"}, session)["data"])
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "wb") as f:
        f.write(png)
    print(f"chat_screenshot: {out} ({len(png)} bytes), page state {state}; {stats}")
    if stop_after:
        # The abort closed the connection; the server cancels the request and counts it.
        aborted = None
        for _ in range(40):
            metrics = urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10).read().decode()
            m = re.search(r'^vllm:request_success_total\{[^}]*finished_reason="abort"[^}]*\}\s+(\S+)', metrics, re.M)
            aborted = float(m.group(1)) if m else None
            if aborted:
                break
            time.sleep(0.25)
        print(f"chat_screenshot: Stop pressed; /metrics counts {aborted} aborted request(s)")
        if state != "stopped" or not aborted:
            sys.exit(1)
    elif state != "done":
        sys.exit(1)
finally:
    try:
        call("Browser.close", timeout=10)
    except BaseException:
        pass
    try:
        browser.wait(timeout=10)
    except subprocess.TimeoutExpired:
        browser.kill()
PY
