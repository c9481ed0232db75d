"""DeepSpec's own Hugging Face speculative loop on the bundled pico pair, as
models/REFERENCE.md measured it: the peer our `dspark generate` numbers on the
pico models are compared with.

DeepSpec's code is imported unmodified from a copy outside the repository
(default .devdata/DeepSpec: `deepspec/` of github.com/deepseek-ai/DeepSpec,
see the SOURCE file there). Each drafted prompt runs DeepSpec's
`generate_decoding_sample` through `Qwen3DSparkEvaluator.generate_one_sample`
(`_propose` = `forward_dspark_draft_block` + `build_dspark_proposal`,
`verify_draft_tokens`, `_update`), with the models loaded by the evaluator's
own `build_models` (bf16, attn_implementation="sdpa"). Only DeepSpec's
process-group setup and its multi-GPU all-reduce of the metrics are left out:
the pooled counts are summed here exactly as `allreduce_response_metrics`
sums them and passed to its `build_metrics_row`.

AR is the target alone: prefill, then one token per forward with a
DynamicCache, argmax at T=0 (DeepSpec's `logits_to_probs` + multinomial
otherwise), the same prompt, stop token and token budget.

Per method one JSON line: tokens/s = generated tokens / wall-clock over all
prompts (prefill included, one warm-up prompt first, not counted), tau
(`acceptance_length`: mean accepted tokens per verify round incl. the
bonus/correction token), draft tokens per proposal, accept rate by position,
and at T=0 how many prompts give exactly the AR tokens ("greedy_eq_ar").

usage: python3 bench/hf_deepspec.py [--device cuda|cpu] [--limit N]
           [--methods ar,dspark,dflash] [--temperature 0] [--confidence-threshold 0]
           [--max-new-tokens 128] [--deepspec .devdata/DeepSpec]
"""
import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_deepspec(path):
    sys.path.insert(0, path)
    from deepspec.eval.dspark import Qwen3DSparkEvaluator
    from deepspec.utils import seed_all
    from deepspec.utils.sampling import logits_to_probs, sample_from_probs
    return Qwen3DSparkEvaluator, seed_all, logits_to_probs, sample_from_probs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--target", default=os.path.join(REPO, "models/pico-qwen3"))
    ap.add_argument("--dspark", default=os.path.join(REPO, "models/pico-qwen3-dspark"))
    ap.add_argument("--dflash", default=os.path.join(REPO, "models/pico-qwen3-dflash"))
    ap.add_argument("--prompts", default=os.path.join(REPO, "models/prompts-dev.jsonl"))
    ap.add_argument("--deepspec", default=os.path.join(REPO, ".devdata/DeepSpec"))
    ap.add_argument("--methods", default="ar,dspark,dflash")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--confidence-threshold", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=980406)
    ap.add_argument("--stop", default="0", help="comma-separated stop token ids")
    ap.add_argument("--limit", type=int, default=0, help="first N prompts only (0 = all)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    if a.threads:
        torch.set_num_threads(a.threads)
    Evaluator, seed_all, logits_to_probs, sample_from_probs = import_deepspec(a.deepspec)
    dev = torch.device(a.device)
    stop_ids = [int(x) for x in a.stop.split(",") if x != ""]
    prompts = [json.loads(l)["input_ids"] for l in open(a.prompts) if l.strip()]
    if a.limit:
        prompts = prompts[: a.limit]

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    info = {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
            "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "temperature": a.temperature,
            "confidence_threshold": a.confidence_threshold, "stop": stop_ids,
            "deepspec": open(os.path.join(a.deepspec, "SOURCE")).readline().split(",")[0].strip()
            if os.path.exists(os.path.join(a.deepspec, "SOURCE")) else a.deepspec}
    print(json.dumps({"info": info}), flush=True)

    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.bfloat16,
                                                  attn_implementation="sdpa").to(dev).eval()

    @torch.inference_mode()
    def ar_one(ids):
        input_ids = torch.tensor([ids], dtype=torch.long, device=dev)
        cache = DynamicCache()
        out = target(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        toks = []
        n = len(ids)
        while True:
            nxt = sample_from_probs(logits_to_probs(out.logits[:, -1:, :], a.temperature))  # [1, 1]
            t = int(nxt[0, 0].item())
            toks.append(t)
            if t in stop_ids or len(toks) >= a.max_new_tokens:
                return toks
            pos = torch.tensor([[n]], dtype=torch.long, device=dev)
            out = target(input_ids=nxt, position_ids=pos, past_key_values=cache, use_cache=True)
            n += 1

    def make_evaluator(draft_path):
        ev = Evaluator.__new__(Evaluator)  # no BaseEvaluator.__init__: it sets up torch.distributed
        ev.args = SimpleNamespace(target_name_or_path=a.target, draft_name_or_path=draft_path,
                                  temperature=a.temperature, confidence_threshold=a.confidence_threshold,
                                  max_new_tokens=a.max_new_tokens, tensorboard_dir=None, step=None,
                                  seed=a.seed)
        ev.device = dev
        ev.global_rank, ev.world_size = 0, 1
        ev.tasks = []
        ev.metrics_rows = []
        _, ev.draft_model, ev.tokenizer = ev.build_models()
        ev.target_model = target  # same weights build_models loads; one copy
        ev.confidence_head_recorder = None  # calibration statistics only
        return ev

    def summary(ev, responses):
        # allreduce_response_metrics without the all-reduce
        k = ev.max_proposal_tokens
        s = {"sample_count": len(responses), "proposal_count": 0, "acceptance_length_sum": 0,
             "proposal_length_sum": 0, "proposals_at_pos": [0] * k, "accepted_at_pos": [0] * k}
        for r in responses:
            for acc_len, prop_len, acc_draft in zip(r.acceptance_lengths, r.proposal_lengths,
                                                    r.accepted_draft_lengths):
                s["proposal_count"] += 1
                s["acceptance_length_sum"] += int(acc_len)
                s["proposal_length_sum"] += int(prop_len)
                for p in range(k):
                    s["proposals_at_pos"][p] += prop_len > p
                    s["accepted_at_pos"][p] += int(acc_draft) > p
        return s

    def run(method, one):
        seed_all(a.seed)
        one(0, prompts[0])  # warm-up, not counted
        sync()
        outs, t_all = [], 0.0
        for i, ids in enumerate(prompts):
            seed_all(a.seed + i)  # as DeepSpec's run_dataset
            sync()
            t = time.perf_counter()
            outs.append(one(i, ids))
            sync()
            t_all += time.perf_counter() - t
        return outs, t_all

    ar_tokens = None
    methods = [m for m in a.methods.split(",") if m]
    for method in methods:
        if method == "ar":
            outs, t = run("ar", lambda i, ids: ar_one(ids))
            ar_tokens = outs
            n = sum(len(o) for o in outs)
            print(json.dumps({"method": "ar", "prompts": len(outs), "generated_tokens": n, "time_s": t,
                              "tokens_per_s": n / t, "tau": 1.0}), flush=True)
            continue
        ev = make_evaluator({"dspark": a.dspark, "dflash": a.dflash}[method])

        def spec_one(i, ids, ev=ev):
            input_ids = torch.tensor([ids], dtype=torch.long, device=dev)
            return ev.generate_one_sample(input_ids=input_ids, stop_token_ids=stop_ids)

        outs, t = run(method, spec_one)
        toks = [o.output_ids[0, o.num_input_tokens:].tolist() for o in outs]
        n = sum(len(x) for x in toks)
        row = ev.build_metrics_row(dataset_name="dev", metric_summary=summary(ev, outs))
        rec = {"method": method, "prompts": len(outs), "generated_tokens": n, "time_s": t,
               "tokens_per_s": n / t, "tau": row["acceptance_length"],
               "draft_tokens_per_proposal": row["draft_tokens_per_proposal"],
               "verify_rounds": sum(o.verify_count for o in outs),
               "accept_rates_by_position": row["accept_rates_by_position"]}
        if ar_tokens is not None and a.temperature == 0:
            rec["greedy_eq_ar"] = sum(x == y for x, y in zip(toks, ar_tokens))
        print(json.dumps(rec), flush=True)
        del ev


if __name__ == "__main__":
    main()
