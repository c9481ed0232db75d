"""Hugging Face transformers AR decode timing on a (synthetic) checkpoint, for
comparison with `dspark bench`: bf16, sdpa attention, batch 1, greedy, random
prompt ids, a fixed number of new tokens (no early stop).

Decode time per token = (t(N new) - t(1 new)) / (N - 1), so the prefill is
taken out as `dspark bench` takes it out. Variants, each printed as one JSON
line as soon as it is measured: static cache (cache_implementation="static",
which transformers auto-compiles), static cache with compile disabled, and the
default dynamic cache.

usage: python3 bench/hf_decode.py MODEL_DIR [--prompt-len 64] [--new 64] [--reps 3]
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default="static_eager,dynamic,static_compiled")
    a = ap.parse_args()

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        a.model, dtype=torch.bfloat16, attn_implementation="sdpa", device_map="cuda")
    model.eval()
    torch.cuda.synchronize()
    print(json.dumps({"load_s": time.perf_counter() - t0, "torch": torch.__version__,
                      "transformers": __import__("transformers").__version__,
                      "device": torch.cuda.get_device_name(0)}), flush=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, a.prompt_len), generator=g).cuda()
    mask = torch.ones_like(ids)

    def gen(n, **kw):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 pad_token_id=0, **kw)
        torch.cuda.synchronize()
        assert out.shape[1] - a.prompt_len == n, out.shape
        return time.perf_counter() - t

    variants = {
        "static_compiled": dict(cache_implementation="static"),
        "static_eager": dict(cache_implementation="static", disable_compile=True),
        "dynamic": dict(),
    }
    for name in a.variants.split(","):
        kw = variants[name]
        try:
            tw = time.perf_counter()
            gen(a.new, **kw)  # warm-up (compiles, for static_compiled)
            gen(1, **kw)
            warm = time.perf_counter() - tw
            t1 = min(gen(1, **kw) for _ in range(a.reps))
            tn = min(gen(a.new, **kw) for _ in range(a.reps))
            per = (tn - t1) / (a.new - 1)
            print(json.dumps({"variant": name, "prompt_len": a.prompt_len, "new_tokens": a.new,
                              "warmup_s": warm, "time_1_new_s": t1, "time_n_new_s": tn,
                              "decode_ms_per_token": per * 1e3, "decode_tokens_per_s": 1 / per}), flush=True)
        except Exception as e:  # report and go on with the next variant
            print(json.dumps({"variant": name, "error": repr(e)[:500]}), flush=True)


if __name__ == "__main__":
    main()
