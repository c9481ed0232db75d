#!/usr/bin/env python3
"""The official `openai` Python package against `dspark serve` (issue 40).

A client nobody here wrote: whatever it sends (its headers, its JSON, its
SSE parser) is what real users send. The script starts the server itself on
an ephemeral loopback port with an API key, then checks completions and chat
completions, streamed and not, usage, stop strings, and the errors a client
sees as exceptions (400 bad field, 401 wrong key, 404), a stream closed
mid-answer (counted as aborted by /metrics), then SIGTERM -> exit 0.

    python3 tests/openai_client.py [PATH/TO/dspark] [-- extra `dspark serve` args]

The binary comes from argv[1], else $DSPARK_BIN, else ./build/dspark. Exits 77
(ctest's skip) when the `openai` package is missing; prints
"N passed, N failed" and exits 1 if any check failed.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

try:
    import openai
except ImportError:
    print("SKIP: the openai Python package is not installed (pip install openai)")
    sys.exit(77)

API_KEY = "sk-dspark-test"
PROMPT = "It is a truth universally acknowledged"
QUESTION = "Who wrote Pride and Prejudice?"
MAX_TOKENS = 24

passed = 0
failed = 0


def check(name, fn):
    """Runs one check; an exception or a failed assert is that check's failure."""
    global passed, failed
    try:
        fn()
    except Exception as e:  # every failure is reported, the rest still runs
        failed += 1
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
    else:
        passed += 1
        print(f"ok   {name}", flush=True)


def start_server(binary, extra):
    """Starts dspark serve on port 0; returns (process, base URL, log lines)."""
    cmd = [binary, "serve", "--host", "127.0.0.1", "--port", "0", "--api-key", API_KEY] + extra
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, errors="replace")
    log = []
    found = threading.Event()
    url = []

    def drain():  # keep reading stderr so the server never blocks on a full pipe
        for line in proc.stderr:
            log.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m and not found.is_set():
                url.append(m.group(1).rstrip("/"))
                found.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + 120
    while not found.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.stderr.write("".join(log))
            raise SystemExit(f"dspark serve did not start listening ({' '.join(cmd)})")
    return proc, url[0], log


def status_of(exc):
    return getattr(exc, "status_code", None)


def expect_error(fn, cls, status, field=None):
    """fn must raise cls with HTTP status, with an OpenAI error object naming field."""
    try:
        fn()
    except cls as e:
        assert status_of(e) == status, f"status {status_of(e)}, expected {status}"
        body = e.body if isinstance(e.body, dict) else {}
        # The client unwraps {"error": {...}} into e.body; a message is what users read.
        msg = body.get("message") if "message" in body else (body.get("error") or {}).get("message")
        assert isinstance(msg, str) and msg, f"no error message in {e.body!r}"
        if field:
            assert field in msg, f"the message {msg!r} does not name {field!r}"
        return
    raise AssertionError(f"no {cls.__name__} raised")


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        i = args.index("--")
        args, extra = args[:i], args[i + 1:]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binary = args[0] if args else os.environ.get("DSPARK_BIN", os.path.join(root, "build", "dspark"))
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"{binary}: no dspark binary (pass its path or set DSPARK_BIN)")

    proc, url, log = start_server(binary, extra)
    print(f"dspark serve at {url} (openai {openai.__version__})", flush=True)
    # max_retries=0: a retried 429/503 would hide what the server answered.
    client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
    state = {}

    try:
        def models():
            page = client.models.list()
            ids = [m.id for m in page.data]
            assert ids, "GET /v1/models listed no model"
            state["model"] = ids[0]
        check("models.list", models)
        model = state.get("model", "dspark")

        def completion():
            r = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
            assert r.object == "text_completion", r.object
            assert len(r.choices) == 1
            c = r.choices[0]
            assert isinstance(c.text, str) and c.text, f"empty text {c.text!r}"
            assert c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason!r}"
            u = r.usage
            assert u is not None, "no usage"
            assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= MAX_TOKENS, u
            assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
            state["text"] = c.text
            state["completion_usage"] = u
        check("completions.create", completion)

        def completion_stream():
            text, usage, finish, chunks = "", None, None, 0
            for ch in client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True):
                chunks += 1
                if ch.choices:
                    text += ch.choices[0].text or ""
                    finish = ch.choices[0].finish_reason or finish
                if ch.usage:
                    usage = ch.usage
            assert chunks >= 2, f"{chunks} chunks"
            assert finish in ("stop", "length"), f"finish_reason {finish!r}"
            assert usage is not None, "no usage in the stream's last event"
            if "text" in state:  # T = 0: the streamed answer is the non-streamed one
                assert text == state["text"], f"streamed {text!r} != {state['text']!r}"
                assert usage.completion_tokens == state["completion_usage"].completion_tokens, usage
        check("completions.create stream", completion_stream)

        def completion_stream_usage_option():
            # stream_options.include_usage is how current OpenAI clients ask for usage.
            usage = None
            for ch in client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
                usage = ch.usage or usage
            assert usage is not None and usage.completion_tokens > 0, usage
        check("completions.create stream_options.include_usage", completion_stream_usage_option)

        def chat():
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                               max_tokens=MAX_TOKENS, temperature=0)
            assert r.object == "chat.completion", r.object
            m = r.choices[0].message
            assert m.role == "assistant", m.role
            assert isinstance(m.content, str) and m.content, f"empty content {m.content!r}"
            assert r.choices[0].finish_reason in ("stop", "length")
            assert r.usage and r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0, r.usage
            state["chat"] = m.content
        check("chat.completions.create", chat)

        def chat_stream():
            text, usage, finish = "", None, None
            for ch in client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                                     max_tokens=MAX_TOKENS, temperature=0, stream=True):
                assert ch.object == "chat.completion.chunk", ch.object
                if ch.choices:
                    text += ch.choices[0].delta.content or ""
                    finish = ch.choices[0].finish_reason or finish
                if ch.usage:
                    usage = ch.usage
            assert finish in ("stop", "length"), f"finish_reason {finish!r}"
            assert usage is not None, "no usage in the stream's last event"
            if "chat" in state:
                assert text == state["chat"], f"streamed {text!r} != {state['chat']!r}"
        check("chat.completions.create stream", chat_stream)

        def sampling_seed():
            kw = dict(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=1.0, top_p=0.9, seed=7)
            a = client.completions.create(**kw).choices[0].text
            b = client.completions.create(**kw).choices[0].text
            assert a == b, f"seed 7 twice: {a!r} != {b!r}"
        check("temperature/top_p/seed: the same seed, the same answer", sampling_seed)

        def stop_string():
            text = state["text"]
            # A stop string from the middle of the known answer: the answer ends before it.
            words = [w for w in re.findall(r"\S+", text)]
            assert len(words) >= 3, f"answer too short to cut: {text!r}"
            stop = words[len(words) // 2]
            r = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                          stop=[stop])
            c = r.choices[0]
            assert stop not in c.text, f"{stop!r} in {c.text!r}"
            assert text.startswith(c.text), f"{c.text!r} is not a prefix of {text!r}"
            assert c.finish_reason == "stop", c.finish_reason
        check("stop strings", stop_string)

        def aborted_count():
            text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
            m = re.search(r'^vllm:request_success_total\{[^}]*finished_reason="abort"[^}]*\}\s+(\S+)', text, re.M)
            return float(m.group(1)) if m else 0.0

        def stream_close():
            # A client that closes its stream mid-answer: the server cancels the request.
            before = aborted_count()
            stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=400, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
            got = 0
            for _ in stream:
                got += 1
                if got == 2:
                    break
            stream.close()
            deadline = time.monotonic() + 30
            while aborted_count() <= before:
                assert time.monotonic() < deadline, "the server did not count the closed stream as aborted"
                time.sleep(0.2)
        check("a stream closed mid-answer is aborted (/metrics)", stream_close)

        check("400 a bad field (temperature -1)", lambda: expect_error(
            lambda: client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=-1),
            openai.BadRequestError, 400, "temperature"))
        check("400 a bad field (max_tokens 0)", lambda: expect_error(
            lambda: client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=0),
            openai.BadRequestError, 400, "max_tokens"))
        check("400 messages missing", lambda: expect_error(
            lambda: client.chat.completions.create(model=model, messages=[]),
            openai.BadRequestError, 400, "messages"))

        def wrong_key():
            bad = openai.OpenAI(base_url=url + "/v1", api_key="sk-wrong", max_retries=0, timeout=60)
            expect_error(lambda: bad.completions.create(model=model, prompt=PROMPT, max_tokens=4),
                         openai.AuthenticationError, 401)
        check("401 a wrong API key", wrong_key)

        check("404 an unknown model route", lambda: expect_error(
            lambda: client.models.retrieve("no-such-model"), openai.NotFoundError, 404))
        check("404 an unknown path", lambda: expect_error(
            lambda: client.get("/no/such/path", cast_to=object), openai.NotFoundError, 404))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed after 60 s"

    def clean_exit():
        assert rc == 0, f"dspark serve exited {rc} after SIGTERM"
    check("SIGTERM: exit 0", clean_exit)
    if failed:
        sys.stderr.write("--- dspark serve's log ---\n" + "".join(log[-50:]))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
