#!/usr/bin/env python3
"""DeepSpec's own trainer step, timed on a `dspark datagen` cache: the baseline of
issue 41's must-show 3 (training tokens/s, ours vs DeepSpec's PyTorch trainer, same
GPU, same data, same run: bench/train_throughput.sh runs both).

What runs is DeepSpec's BaseTrainer.train loop body as its recipe configures it
(deepspec/trainer/base_trainer.py @ afdfa7c; config/dspark/dspark_qwen3_*.py):
Qwen3DSparkModel in bf16 under FSDP (no_shard, MixedPrecision bf16), optionally
torch.compile(dynamic=True) (the configs' torch_compile=True), flex_attention with
DeepSpec's own training mask and anchor sampling, compute_dspark_loss, backward per
micro-batch of --local sequences (CacheCollator padding), FSDP.clip_grad_norm_,
BF16Optimizer (fp32 master AdamW + its cosine schedule). Only the data loader is
replaced: sequences come from the cache in order (scripts/train_cache.py), padded
by DeepSpec's CacheCollator. DeepSpec itself is not part of this repository: pass a
checkout with --deepspec.

    python3 bench/train_deepspec.py --deepspec DIR --cache CACHE --drafter DRAFTER_DIR \
        [--batch 64] [--local 1] [--steps 30] [--warmup 5] [--compile] [--anchors 64]

Prints one JSON line: tokens/s (cache tokens consumed, as `dspark train` counts them),
ms/step over the timed steps, the final loss.
"""
import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))
from train_cache import TrainCache  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deepspec", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--drafter", required=True, help="a DeepSpec-format drafter (its weights are the start)")
    ap.add_argument("--batch", type=int, default=64, help="sequences an optimizer step (global batch)")
    ap.add_argument("--local", type=int, default=1, help="sequences a micro-batch (local_batch_size)")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps timed")
    ap.add_argument("--warmup", type=int, default=5, help="optimizer steps run before timing")
    ap.add_argument("--anchors", type=int, default=0, help="num_anchors (0: the drafter config's)")
    ap.add_argument("--compile", action="store_true", help="torch.compile(dynamic=True), as the recipe configs")
    a = ap.parse_args()

    sys.path.insert(0, a.deepspec)
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    import deepspec.modeling.dspark.qwen3.modeling as dsm
    from deepspec.data import CacheCollator
    from deepspec.modeling.dspark.loss import compute_dspark_loss
    from deepspec.utils.optim import BF16Optimizer

    dev = torch.device("cuda")
    model = dsm.Qwen3DSparkModel.from_pretrained(a.drafter, dtype=torch.bfloat16, attn_implementation="flex_attention")
    if a.anchors:
        model.num_anchors = a.anchors  # read from the config at construction
    model = model.to(dev)
    model.set_embedding_head_trainable(False)
    model = FSDP(model, use_orig_params=True, sharding_strategy=ShardingStrategy.NO_SHARD,
                 mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16))
    if a.compile:
        model = torch.compile(model, dynamic=True)
    model.train()
    total = a.warmup + a.steps
    opt = BF16Optimizer(model, lr=6e-4, total_steps=total, warmup_ratio=0.04, weight_decay=0.0)

    cache = TrainCache(a.cache)
    n_seqs = len(cache)
    collate = CacheCollator()

    def sample(i):
        s = cache[i % n_seqs]
        bf = lambda x: torch.from_numpy(x.view("int16")).view(torch.bfloat16)  # noqa: E731
        return {"input_ids": torch.from_numpy(s["ids"].astype("int64")),
                "loss_mask": torch.from_numpy(s["mask"].astype("int64")),
                "target_hidden_states": bf(s["taps"]), "target_last_hidden_states": bf(s["final_hidden"])}

    accum = max(1, a.batch // a.local)
    nxt, tokens, t0, loss_v = 0, 0, None, float("nan")
    for step in range(total):
        if step == a.warmup:
            torch.cuda.synchronize()
            t0, tokens = time.perf_counter(), 0
        for k in range(accum):
            feats = [sample(nxt + j) for j in range(a.local)]
            nxt += a.local
            tokens += sum(int(f["input_ids"].shape[0]) for f in feats)
            b = {key: v.to(dev, non_blocking=True) for key, v in collate(feats).items()}
            ctx = model.no_sync() if (k + 1 < accum and hasattr(model, "no_sync")) else torch.enable_grad()
            with ctx:
                out = model(input_ids=b["input_ids"], target_hidden_states=b["target_hidden_states"],
                            loss_mask=b["loss_mask"], target_last_hidden_states=b["target_last_hidden_states"])
                loss = compute_dspark_loss(outputs=out, loss_decay_gamma=4.0, ce_loss_alpha=0.1, l1_loss_alpha=0.9,
                                           confidence_head_alpha=1.0) / accum
                loss.backward()
            loss_v = loss.item() * accum
        inner = model._orig_mod if hasattr(model, "_orig_mod") else model
        FSDP.clip_grad_norm_(inner, 1.0)
        opt.step()
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    print(json.dumps({"trainer": "deepspec", "gpu": torch.cuda.get_device_name(0), "batch": a.batch,
                      "local": a.local, "compile": a.compile, "steps_timed": a.steps,
                      "ms_per_step": 1e3 * secs / a.steps, "tokens_per_s": tokens / secs, "last_loss": loss_v,
                      "torch": torch.__version__}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
