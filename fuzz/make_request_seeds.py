#!/usr/bin/env python3
"""Seeds for fuzz_request (OpenAI request bodies): writes them into
build-fuzz/corpus/request/ (or the directory given), then
`bash fuzz/corpus.sh pack request`. Each input is one byte choosing the
endpoint ('0' completions, '1' chat: even / odd) and the body."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build-fuzz", "corpus", "request")
os.makedirs(OUT, exist_ok=True)
n = 0


def put(kind, body):
    global n
    data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
    with open(os.path.join(OUT, f"seed_{n:03d}"), "wb") as f:
        f.write(kind.encode() + data)
    n += 1


PROMPT = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who wrote Pride and Prejudice?"}]
# valid completions
put("0", {"prompt": PROMPT})
put("0", {"model": "pico-qwen3", "prompt": PROMPT, "max_tokens": 16, "temperature": 0.7, "top_p": 0.9,
          "top_k": 40, "seed": 42, "stop": ["\n", "man in"], "n": 1, "stream": True,
          "stream_options": {"include_usage": True}, "return_token_ids": True, "ignore_eos": False})
put("0", {"prompt": [17, 42, 9, 1000], "max_tokens": 4, "stop": "ack"})
put("0", {"prompt": [[5, 6, 7]], "seed": -1, "top_k": -1, "logprobs": None, "echo": False, "best_of": 1,
          "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "suffix": "", "user": "u"})
put("0", {"prompt": [PROMPT], "stop": ["t a s", "universally ack", "\u00e9\u4e2d"], "max_tokens": 1})
put("0", {"prompt": "caf\u00e9 \u4e2d\u6587 \ud83d\ude00 tab\there\nnew line \"quoted\" back\\slash",
          "stop": ["\ud83d\ude00", "\u6587 "]})
put("0", {"prompt": PROMPT, "stop": ["a" * 256]})
put("0", {"prompt": PROMPT, "stop": [str(i) for i in range(16)]})
put("0", {"prompt": PROMPT, "response_format": {"type": "text"}, "tools": [], "max_tokens": None, "stop": None})
# valid chat
put("1", {"model": "pico-qwen3", "messages": MSGS, "max_tokens": 20, "stream": True})
put("1", {"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                           {"type": "text", "text": "b"}]},
                       {"role": "user", "content": "q"}, {"role": "assistant", "content": "r"},
                       {"role": "user", "content": "s", "name": "x"}],
          "max_completion_tokens": 4, "max_tokens": 100, "stop": ["\nUser:"]})
# broken: JSON
put("0", b'{"prompt": "x"')
put("0", b'{"prompt": "x"} {}')
put("0", b'[1, 2]')
put("0", b'')
put("0", b'{"prompt": "\xff\xfe bad utf8"}')
put("0", b'{"prompt": "nul \\u0000 inside", "stop": "\\u0000"}')
put("0", b'{"prompt": "x", "max_tokens": 1e400}')
put("0", b'{"prompt": "x", "temperature": NaN}')
put("0", b'{"prompt": ' + b'[' * 200 + b']' * 200 + b'}')
# broken: fields
for body in [{}, {"prompt": 5}, {"prompt": ["a", "b"]}, {"prompt": [1, -2]}, {"prompt": [1, 2.5]},
             {"prompt": []}, {"prompt": [[]]}, {"prompt": [1, 2147483648]},
             {"prompt": "x", "max_tokens": 0}, {"prompt": "x", "max_tokens": "9"},
             {"prompt": "x", "max_tokens": 16777217}, {"prompt": "x", "temperature": -1},
             {"prompt": "x", "temperature": 1e39}, {"prompt": "x", "top_p": 0}, {"prompt": "x", "top_p": 1.5},
             {"prompt": "x", "top_k": -2}, {"prompt": "x", "seed": 1.5}, {"prompt": "x", "seed": 9.3e18},
             {"prompt": "x", "n": 2}, {"prompt": "x", "stream": 1}, {"prompt": "x", "stream_options": 1},
             {"prompt": "x", "stop": 3}, {"prompt": "x", "stop": ["a", 3]}, {"prompt": "x", "stop": ["b" * 257]},
             {"prompt": "x", "stop": [str(i) for i in range(17)]}, {"prompt": "x", "logprobs": 2},
             {"prompt": "x", "echo": True}, {"prompt": "x", "presence_penalty": 0.5}, {"prompt": "x", "best_of": 3},
             {"prompt": "x", "model": 7}, {"prompt": "x", "model": "m" * 300}, {"prompt": "x", "logit_bias": {"1": 2}},
             {"prompt": "x", "response_format": {"type": "json_object"}}, {"prompt": "x", "ignore_eos": "yes"}]:
    put("0", body)
for body in [{"messages": []}, {"messages": "hi"}, {"messages": [1]}, {"messages": [{"role": "user"}]},
             {"messages": [{"role": 1, "content": "a"}]}, {"messages": [{"role": "robot", "content": "a"}]},
             {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
             {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
             {"messages": [{"role": "user", "content": None}]},
             {"messages": [{"role": "user", "content": "a"}], "tools": [{}]},
             {"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": -1},
             {"messages": [{"role": "user", "content": "a"}] * 1025}]:
    put("1", body)
print(f"{n} seeds in {OUT}")
