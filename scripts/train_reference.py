#!/usr/bin/env python3
"""PyTorch reference for DSpark drafter training (the DeepSpec recipe, SPEC §7).

Writes the goldens the C/CUDA trainer (issue 41) must match:
testdata/fixtures/qwen3-tiny-train/golden.safetensors + golden.json.
Not part of the engine's build or tests: those read the golden files only.

    python3 scripts/train_reference.py                       # regenerate
    python3 scripts/train_reference.py --check-deepspec DIR  # + compare with DeepSpec itself

Needs torch (CPU is enough), safetensors, numpy. `--check-deepspec DIR`
(DIR = a checkout of deepseek-ai/DeepSpec) also needs transformers; it
imports DeepSpec's model and loss unchanged and records the agreement in
golden.json ("deepspec_check").

What is computed (own code; the DeepSpec source each part corresponds to,
paths inside deepseek-ai/DeepSpec @ afdfa7c):

* Target forward (Qwen3, fp32, causal, one sequence at a time, no cache):
  taps = raw outputs of decoder layers target_layer_ids, concatenated in
  config order (scripts/data/prepare_target_cache.py:
  run_target_forward_with_hooks, forward hooks on backbone.layers[l]);
  final hidden = backbone last_hidden_state (after the final RMSNorm).
  Checked here against the qwen3-tiny fixture's golden target tensors.
* Batch: padded with zeros like deepspec/data/target_cache_dataset.py:
  CacheCollator (_pad_1d_batch / _pad_hidden_batch); loss_mask 0 on the
  prompt and on padding, 1 on the target-generated continuation.
* Anchors (deepspec/modeling/dspark/common.py: sample_anchor_positions /
  build_anchor_candidate_mask): candidates are positions i < S-1 with
  loss_mask[i] and loss_mask[i+1]; up to num_anchors distinct ones, sorted;
  when a row has fewer candidates the rest are dummy anchors (position 0,
  block_keep_mask False). Drawn here with a seeded numpy RNG (DeepSpec uses
  torch.rand) and the row's last candidate is always included, so that
  blocks that run past the data exercise the cumulative validity mask.
* Block input (common.py: create_noise_embed): ids [token_a, MASK*(g-1)],
  MASK everywhere for dummy blocks; positions a..a+g-1 (create_position_ids);
  context positions 0..S-1.
* Training mask (common.py: create_dspark_attention_mask): block query rows
  see context rows kv < a (strictly before the anchor) and the rows of their
  own block (bidirectional); nothing else; a dummy block sees nothing.
  DeepSpec uses flex_attention, whose output for a fully masked row is 0;
  here too (such rows carry zero loss weight: they never affect loss or grads).
* Drafter backbone (deepspec/modeling/dspark/qwen3/modeling.py:
  Qwen3DSparkModel._forward_backbone, Qwen3DSparkDecoderLayer.forward,
  Qwen3DSparkAttention.forward): ctx = hidden_norm(fc(taps)); per layer
  x = input_layernorm(h); q = q_norm(q_proj(x)); K = k_norm([k_proj(ctx);
  k_proj(x)]), V = [v_proj(ctx); v_proj(x)] (ctx skips input_layernorm);
  RoPE on q (block positions) and K (context ++ block positions); GQA;
  scale head_dim^-0.5; h += o_proj(attn); h += mlp(post_attention_layernorm(h));
  final norm.
* Labels / masks (Qwen3DSparkModel.forward + common.py: build_eval_mask):
  label index a+1+k clamped to S-1 (0 for dummy blocks); eval_mask =
  cumprod(index < S and loss_mask[index] and block kept); aligned target
  logits = lm_head(target_last_hidden[clamp(index-1, 0)]); Markov teacher
  forcing prev = [token_a, labels[:-1]] (token_a = input_ids[0] for a
  dummy block, as DeepSpec's gather does).
* Heads (deepspec/modeling/dspark/markov_head.py: VanillaMarkov.apply_block_logits;
  common.py: AcceptRatePredictor): draft logits = lm_head(h) +
  markov_w2(markov_w1[prev]); confidence logit = proj([h ; markov_w1[prev]]).
* Loss (deepspec/modeling/dspark/loss.py: _build_loss_weight_mask,
  _collect_local_terms, _compute_accept_rate_3d, _compute_local_l1_term,
  _build_loss; compute_dspark_loss with world_size 1):
  w = eval_mask * exp(-k / loss_decay_gamma), gamma 4, k = 0..g-1;
  ce   = sum(w * CE(draft_logits, labels)) / (sum(w) + 1e-6)
  l1   = sum(w * |softmax(draft) - softmax(target)|_1) / (sum(w) + 1e-6)
  conf = sum(w * BCEwithlogits(conf_logit, c*)) / (sum(w) + 1e-6),
         c* = clamp(1 - 0.5 |softmax(draft) - softmax(target)|_1, 0, 1), detached
  loss = 0.1 ce + 0.9 l1 + 1.0 conf   (config/dspark/*.py: ce_loss_alpha,
  l1_loss_alpha, confidence_head_alpha, loss_decay_gamma). draft = the
  Markov-corrected logits in all three terms.
* Optimizer (deepspec/utils/optim.py: BF16Optimizer, CosineAnnealingWarmupLR;
  deepspec/trainer/base_trainer.py: BaseTrainer.train): trainable = every
  drafter parameter except embed_tokens and lm_head (frozen copies of the
  target's: BaseTrainer.build_models -> initialize_embeddings_and_head);
  grad-norm clip to 1.0 over all trainable grads (clip coef =
  1 / (norm + 1e-6), applied when < 1); torch AdamW (betas 0.9/0.999,
  eps 1e-8, weight decay 0) on fp32 master weights; lr 6e-4 with
  W = int(0.04 * total_steps) warmup steps, then cosine. The lr DeepSpec's
  CosineAnnealingWarmupLR actually gives optimizer step s (0-based) is
      s <  W:  lr * (s+1) / W
      s >= W:  lr * (1 + cos(pi (s-W) / T)) / (1 + cos(pi / T)),  T = total_steps - W
  i.e. the textbook cosine divided by (1 + cos(pi/T))/2: at the hand-over
  the chainable CosineAnnealingLR recursion takes one extra step "backwards",
  so step W runs at lr * 2/(1 + cos(pi/T)) (slightly above the peak), step
  W+1 at exactly the peak, and every later step is scaled by the same
  factor. Checked against DeepSpec's class for total_steps in {10, 25, 50,
  51, 100, 1000, 12345} to 6e-15 relative (W = 0 included). Golden: the first
  10 steps of a total_steps = 50 schedule (W = 2), every step on the same
  fixed batch and anchors; the lr of every step is in golden.json.

Everything fp32 on CPU, single thread, deterministic algorithms. The run is
also repeated in float64 to measure the fp32 rounding noise floor, which is
what the README's tolerances are derived from.
"""

import argparse
import hashlib
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import save_file
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# DeepSpec recipe (config/dspark/dspark_qwen3_*.py)
CE_ALPHA, L1_ALPHA, CONF_ALPHA = 0.1, 0.9, 1.0
LOSS_DECAY_GAMMA = 4.0
LR, WARMUP_RATIO, WEIGHT_DECAY, MAX_GRAD_NORM = 6.0e-4, 0.04, 0.0, 1.0
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8
FROZEN = ("embed_tokens.weight", "lm_head.weight")

# The fixed batch: (prompt length, total length) per sequence; padded to S.
SEQS = [(8, 32), (6, 20), (5, 12)]
DATA_SEED = 4101
ANCHOR_SEED = 4102


# ---------------------------------------------------------------- basics
def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rope_tables(positions, head_dim, theta, dtype):
    # transformers' default RoPE: inv_freq in fp32, angle = pos * inv_freq
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    ang = positions.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    # x [..., heads, T, D]; cos/sin [..., T, D] broadcast over heads
    return x * cos.unsqueeze(-3) + rotate_half(x) * sin.unsqueeze(-3)


def attention(q, k, v, allowed, scale):
    """q [B,Hq,Tq,D], k/v [B,Hkv,Tk,D], allowed [B,Tq,Tk] bool.
    Softmax in the activation dtype; a row with no allowed key outputs 0."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    m = allowed.unsqueeze(1)
    s = s.masked_fill(~m, float("-inf"))
    any_row = m.any(-1, keepdim=True)
    s = torch.where(any_row, s, torch.zeros_like(s))  # keep fully masked rows finite
    p = torch.softmax(s, dim=-1) * any_row.to(s.dtype)
    return torch.matmul(p, v)


def mlp(x, W, pre):
    return F.linear(F.silu(F.linear(x, W[pre + "gate_proj.weight"])) * F.linear(x, W[pre + "up_proj.weight"]),
                    W[pre + "down_proj.weight"])


# ---------------------------------------------------------------- target
def target_forward(T, cfg, ids):
    """ids [S] -> (layer outputs [L,S,H] raw, final hidden [S,H], logits [S,V])."""
    eps, nh, nkv, hd = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    theta = cfg["rope_parameters"]["rope_theta"] if "rope_parameters" in cfg else cfg["rope_theta"]
    S = ids.shape[0]
    h = T["model.embed_tokens.weight"][ids]
    pos = torch.arange(S)
    cos, sin = rope_tables(pos, hd, theta, h.dtype)
    causal = (pos[None, :] <= pos[:, None])[None]
    outs = []
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        x = rms_norm(h, T[p + "input_layernorm.weight"], eps)
        q = F.linear(x, T[p + "self_attn.q_proj.weight"]).view(S, nh, hd)
        k = F.linear(x, T[p + "self_attn.k_proj.weight"]).view(S, nkv, hd)
        v = F.linear(x, T[p + "self_attn.v_proj.weight"]).view(S, nkv, hd)
        q = rms_norm(q, T[p + "self_attn.q_norm.weight"], eps).transpose(0, 1)[None]
        k = rms_norm(k, T[p + "self_attn.k_norm.weight"], eps).transpose(0, 1)[None]
        v = v.transpose(0, 1)[None]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = attention(q, k, v, causal, hd ** -0.5)[0].transpose(0, 1).reshape(S, nh * hd)
        h = h + F.linear(a, T[p + "self_attn.o_proj.weight"])
        h = h + mlp(rms_norm(h, T[p + "post_attention_layernorm.weight"], eps), T, p + "mlp.")
        outs.append(h)
    final = rms_norm(h, T["model.norm.weight"], eps)
    return torch.stack(outs), final, F.linear(final, T["lm_head.weight"])


# ---------------------------------------------------------------- batch
def build_batch(T, tcfg, dcfg, vocab):
    """Target-generated continuations of random prompts (T=1 sampling, seeded),
    then one full target forward per sequence for taps and final hidden."""
    g = torch.Generator().manual_seed(DATA_SEED)
    S = max(n for _, n in SEQS)
    B = len(SEQS)
    tap_ids = dcfg["target_layer_ids"]
    Hd = tcfg["hidden_size"]
    input_ids = torch.zeros(B, S, dtype=torch.int64)
    loss_mask = torch.zeros(B, S, dtype=torch.int64)
    taps = torch.zeros(B, S, len(tap_ids) * Hd, dtype=torch.float32)
    last = torch.zeros(B, S, Hd, dtype=torch.float32)
    for b, (plen, n) in enumerate(SEQS):
        ids = torch.randint(0, vocab, (plen,), generator=g)
        while ids.shape[0] < n:
            _, _, logits = target_forward(T, tcfg, ids)
            nxt = torch.multinomial(torch.softmax(logits[-1], -1), 1, generator=g)
            ids = torch.cat([ids, nxt])
        layers, final, _ = target_forward(T, tcfg, ids)
        input_ids[b, :n] = ids
        loss_mask[b, plen:n] = 1
        taps[b, :n] = torch.cat([layers[l] for l in tap_ids], dim=-1)  # tap id -1 unused here
        last[b, :n] = final
    return input_ids, loss_mask, taps, last


def choose_anchors(loss_mask, num_anchors):
    rng = np.random.default_rng(ANCHOR_SEED)
    lm = loss_mask.numpy() > 0
    B, S = lm.shape
    anchors = np.zeros((B, num_anchors), dtype=np.int64)
    keep = np.zeros((B, num_anchors), dtype=bool)
    for b in range(B):
        cand = [i for i in range(S - 1) if lm[b, i] and lm[b, i + 1]]
        if len(cand) <= num_anchors:
            pick = cand
        else:
            rest = [c for c in cand if c != cand[-1]]
            pick = [cand[-1]] + list(rng.choice(rest, num_anchors - 1, replace=False))
        pick = sorted(int(p) for p in pick)
        anchors[b, :len(pick)] = pick
        keep[b, :len(pick)] = True
    return torch.from_numpy(anchors), torch.from_numpy(keep)


# ---------------------------------------------------------------- drafter
def drafter_forward(P, cfg, batch, dtype):
    """The DeepSpec training forward (see module docstring). P: name -> tensor
    (trainable ones require grad). Returns a dict of intermediates."""
    input_ids, loss_mask, taps, last, anchors, keep = batch
    eps, nh, nkv, hd = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    theta = cfg["rope_parameters"]["rope_theta"] if "rope_parameters" in cfg else cfg["rope_theta"]
    g, mask_id = cfg["block_size"], cfg["mask_token_id"]
    B, S = input_ids.shape
    N = anchors.shape[1]
    Q = N * g
    taps, last = taps.to(dtype), last.to(dtype)

    ctx = rms_norm(F.linear(taps, P["fc.weight"]), P["hidden_norm.weight"], eps)  # [B,S,H]

    anchor_tok = torch.gather(input_ids, 1, anchors)  # [B,N]
    noise = torch.full((B, N, g), mask_id, dtype=torch.int64)
    noise[:, :, 0] = torch.where(keep, anchor_tok, torch.full_like(anchor_tok, mask_id))
    h = P["embed_tokens.weight"][noise.view(B, Q)]  # [B,Q,H]

    off = torch.arange(g)
    blk_pos = (anchors[:, :, None] + off).view(B, Q)
    all_pos = torch.cat([torch.arange(S)[None].expand(B, S), blk_pos], dim=1)
    cos_k, sin_k = rope_tables(all_pos, hd, theta, dtype)
    cos_q, sin_q = cos_k[:, S:], sin_k[:, S:]

    qblk = torch.arange(Q) // g
    kv = torch.arange(S + Q)
    anc_q = anchors[:, qblk]  # [B,Q]
    see_ctx = (kv[None, None, :] < S) & (kv[None, None, :] < anc_q[:, :, None])
    kv_blk = (kv - S).div(g, rounding_mode="floor")
    see_blk = (kv[None, None, :] >= S) & (kv_blk[None, None, :] == qblk[None, :, None])
    allowed = (see_ctx | see_blk) & keep[:, qblk][:, :, None]  # [B,Q,S+Q]

    for l in range(cfg["num_hidden_layers"]):
        p = f"layers.{l}."
        x = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q = F.linear(x, P[p + "self_attn.q_proj.weight"]).view(B, Q, nh, hd)
        q = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps).transpose(1, 2)
        kin = torch.cat([F.linear(ctx, P[p + "self_attn.k_proj.weight"]),
                         F.linear(x, P[p + "self_attn.k_proj.weight"])], dim=1).view(B, S + Q, nkv, hd)
        vin = torch.cat([F.linear(ctx, P[p + "self_attn.v_proj.weight"]),
                         F.linear(x, P[p + "self_attn.v_proj.weight"])], dim=1).view(B, S + Q, nkv, hd)
        k = rms_norm(kin, P[p + "self_attn.k_norm.weight"], eps).transpose(1, 2)
        v = vin.transpose(1, 2)
        q, k = apply_rope(q, cos_q, sin_q), apply_rope(k, cos_k, sin_k)
        a = attention(q, k, v, allowed, hd ** -0.5).transpose(1, 2).reshape(B, Q, nh * hd)
        h = h + F.linear(a, P[p + "self_attn.o_proj.weight"])
        h = h + mlp(rms_norm(h, P[p + "post_attention_layernorm.weight"], eps), P, p + "mlp.")
    hid = rms_norm(h, P["norm.weight"], eps).view(B, N, g, -1)

    lab_idx = anchors[:, :, None] + off + 1  # [B,N,g]
    safe = lab_idx.clamp(max=S - 1)
    safe = torch.where(keep[:, :, None], safe, torch.zeros_like(safe))
    labels = torch.gather(input_ids[:, None, :].expand(B, N, S), 2, safe)
    lm_at = torch.gather(loss_mask[:, None, :].expand(B, N, S), 2, safe)
    eval_mask = ((lab_idx < S) & (lm_at > 0) & keep[:, :, None]).to(torch.int32).cumprod(-1).bool()
    pred_idx = (safe - 1).clamp(min=0)
    tgt_hidden = torch.gather(last[:, None].expand(B, N, S, last.shape[-1]), 2,
                              pred_idx[..., None].expand(B, N, g, last.shape[-1]))
    tgt_logits = F.linear(tgt_hidden, P["lm_head.weight"])
    prev = torch.cat([anchor_tok[:, :, None], labels[:, :, :-1]], dim=-1)
    w1p = P["markov_head.markov_w1.weight"][prev]  # [B,N,g,r]
    draft = F.linear(hid, P["lm_head.weight"]) + F.linear(w1p, P["markov_head.markov_w2.weight"])
    conf = F.linear(torch.cat([hid, w1p], dim=-1), P["confidence_head.proj.weight"],
                    P["confidence_head.proj.bias"]).squeeze(-1)
    return dict(context_projected=ctx, block_hidden=hid, labels=labels, eval_mask=eval_mask,
                prev=prev, draft_logits=draft, target_logits=tgt_logits, confidence_logits=conf,
                noise_ids=noise, block_positions=blk_pos.view(B, N, g))


def dspark_loss(o):
    g = o["draft_logits"].shape[2]
    w = o["eval_mask"].to(o["draft_logits"].dtype) * torch.exp(
        -torch.arange(g, dtype=torch.float32) / LOSS_DECAY_GAMMA).to(o["draft_logits"].dtype)
    V = o["draft_logits"].shape[-1]
    ce_tok = F.cross_entropy(o["draft_logits"].reshape(-1, V), o["labels"].reshape(-1),
                             reduction="none").view_as(w)
    pd = torch.softmax(o["draft_logits"], -1)
    pt = torch.softmax(o["target_logits"], -1)
    l1_tok = (pd - pt).abs().sum(-1)
    cstar = (1.0 - 0.5 * l1_tok).clamp(0.0, 1.0).detach()
    bce_tok = F.binary_cross_entropy_with_logits(o["confidence_logits"], cstar, reduction="none")
    den = w.sum() + 1e-6
    ce = (ce_tok * w).sum() / den
    l1 = (l1_tok * w).sum() / den
    cf = (bce_tok * w).sum() / den
    loss = CE_ALPHA * ce + L1_ALPHA * l1 + CONF_ALPHA * cf
    return loss, dict(ce=ce, l1=l1, confidence=cf, weights=w, ce_tok=ce_tok, l1_tok=l1_tok,
                      bce_tok=bce_tok, cstar=cstar)


def lr_at(step, total_steps):
    """lr of optimizer step `step` (0-based) as DeepSpec's CosineAnnealingWarmupLR
    gives it (deepspec/utils/optim.py; see the module docstring for the quirk)."""
    W = int(WARMUP_RATIO * total_steps)
    if step < W:
        return LR * (step + 1) / W
    T = total_steps - W
    return LR * (1.0 + math.cos(math.pi * (step - W) / T)) / (1.0 + math.cos(math.pi / T))


def train(Pinit, cfg, batch, dtype, steps, total_steps, micro=None):
    """Returns (step-0 (parts, loss, grads, grad norm), per-step records, final params).
    micro=None: the whole batch is one micro-batch (DeepSpec local_batch_size = B,
    no accumulation). micro=[[0], [1], ...]: each listed row group is a micro-batch
    with its own loss normalisation, backward of loss_i / len(micro) each,
    gradients summed, then one clip + step (DeepSpec's local_batch_size 1 with
    gradient accumulation, as its recipe configs run)."""
    P = {k: v.to(dtype).clone() for k, v in Pinit.items()}
    names = [k for k in P if k not in FROZEN]
    for k in names:
        P[k].requires_grad_(True)
    opt = torch.optim.AdamW([P[k] for k in names], lr=LR, betas=ADAM_BETAS, eps=ADAM_EPS,
                            weight_decay=WEIGHT_DECAY, foreach=False)
    groups = micro if micro is not None else [list(range(batch[0].shape[0]))]

    def run(backward):
        parts = []
        for rows in groups:
            sub = batch if micro is None else tuple(x[rows] for x in batch)
            o = drafter_forward(P, cfg, sub, dtype)
            loss, t = dspark_loss(o)
            if backward:
                (loss / len(groups)).backward()
            parts.append((o, loss, t))
        tot = {k: sum(pt[2][k].item() for pt in parts) / len(groups) for k in ("ce", "l1", "confidence")}
        tot["loss"] = sum(pt[1].item() for pt in parts) / len(groups)
        return parts, tot

    recs, first = [], None
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        parts, tot = run(True)
        grads = {k: P[k].grad for k in names}
        norm = torch.sqrt(sum((gr.double() ** 2).sum() for gr in grads.values())).item()
        # torch.nn.utils.clip_grad_norm_: total norm (of per-tensor norms), coef clamped to 1
        tn = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(gr) for gr in grads.values()]))
        coef = torch.clamp(MAX_GRAD_NORM / (tn + 1e-6), max=1.0)
        if first is None:
            first = (parts, tot, {k: gr.detach().clone() for k, gr in grads.items()}, tn.item())
        for gr in grads.values():
            gr.mul_(coef)
        lr = lr_at(s, total_steps)
        for gp in opt.param_groups:
            gp["lr"] = lr
        opt.step()
        recs.append(dict(step=s, lr=lr, **tot, grad_norm=tn.item(), grad_norm_f64=norm, clip_coef=coef.item()))
    # loss after the last update
    with torch.no_grad():
        _, tot = run(False)
    recs.append(dict(step=steps, lr=None, **tot))
    return first, recs, {k: P[k].detach() for k in names}


def rel_err(a, b):
    a, b = a.double(), b.double()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp(min=1e-300)).item()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


# ---------------------------------------------------------------- DeepSpec check
ORIG_MASK = {}


def check_deepspec(ds_dir, drafter_dir, batch, total_steps, steps, ours_first, ours_recs, outs, micro=None):
    """Run DeepSpec's own Qwen3DSparkModel.forward + compute_dspark_loss + backward
    (+ its optimizer and scheduler) on the same batch and anchors; compare."""
    sys.path.insert(0, ds_dir)
    import torch.distributed as dist
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29513")
        dist.init_process_group("gloo", rank=0, world_size=1)
    import deepspec.modeling.dspark.qwen3.modeling as dsm
    from deepspec.modeling.dspark.loss import compute_dspark_loss
    from deepspec.utils.optim import BF16Optimizer
    import deepspec.utils.metrics as dsmetrics
    input_ids, loss_mask, taps, last, anchors, keep = batch

    groups = micro if micro is not None else [list(range(input_ids.shape[0]))]
    cur = {"rows": groups[0]}
    # fixed anchors instead of torch.rand
    dsm.sample_anchor_positions = lambda **kw: (anchors[cur["rows"]].clone(), keep[cur["rows"]].clone())
    dsm.create_dspark_attention_mask = ORIG_MASK.setdefault("f", dsm.create_dspark_attention_mask)
    res = {}

    def dense_mask(*, anchor_positions, block_keep_mask, seq_len, block_size, device):
        Bq, Nb = anchor_positions.shape
        Q = Nb * block_size
        qb = torch.arange(Q) // block_size
        kv = torch.arange(seq_len + Q)
        anc = anchor_positions[:, qb]
        ok = ((kv[None, None] < seq_len) & (kv[None, None] < anc[:, :, None])) | (
            (kv[None, None] >= seq_len) & (((kv - seq_len).div(block_size, rounding_mode="floor"))[None, None] == qb[None, :, None]))
        ok = ok & block_keep_mask[:, qb][:, :, None]
        m = torch.zeros(Bq, 1, Q, seq_len + Q)
        return m.masked_fill(~ok[:, None], torch.finfo(torch.float32).min)

    model = dsm.Qwen3DSparkModel.from_pretrained(drafter_dir, dtype=torch.float32)
    model.set_embedding_head_trainable(False)

    # 1) forward only with DeepSpec's flex_attention BlockMask (flex has no CPU backward)
    model.config._attn_implementation = "flex_attention"
    cur["rows"] = list(range(input_ids.shape[0]))
    with torch.no_grad():
        of = model(input_ids=input_ids, target_hidden_states=taps, loss_mask=loss_mask,
                   target_last_hidden_states=last)
    kept = keep[:, :, None, None].expand_as(of.draft_logits)
    res["flex_forward_draft_logits_rel_err_kept_blocks"] = rel_err(
        of.draft_logits[kept], outs["draft_logits"].detach()[kept])
    dsmetrics._metrics.clear()

    # 2) forward + loss + backward + 10 optimizer steps with eager attention and the dense
    #    equivalent of DeepSpec's mask (fully masked dummy rows differ: zero loss weight)
    model.config._attn_implementation = "eager"
    dsm.create_dspark_attention_mask = dense_mask
    model.train()
    opt = BF16Optimizer(model, lr=LR, total_steps=total_steps, warmup_ratio=WARMUP_RATIO,
                        weight_decay=WEIGHT_DECAY)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    ds_losses, ds_lrs, ds_norms, ds_terms = [], [], [], []
    for s in range(steps + 1):
        ds_lrs.append(opt.get_learning_rate())
        step_loss, terms = 0.0, {"ce": 0.0, "l1": 0.0, "confidence": 0.0}
        for rows in groups:
            cur["rows"] = rows
            out = model(input_ids=input_ids[rows], target_hidden_states=taps[rows], loss_mask=loss_mask[rows],
                        target_last_hidden_states=last[rows])
            loss = compute_dspark_loss(outputs=out, loss_decay_gamma=LOSS_DECAY_GAMMA,
                                       ce_loss_alpha=CE_ALPHA, l1_loss_alpha=L1_ALPHA,
                                       confidence_head_alpha=CONF_ALPHA)
            step_loss += loss.item() / len(groups)
            for ours_name, ds_name in (("ce", "ce_loss"), ("l1", "l1_loss"), ("confidence", "confidence_loss")):
                e = dsmetrics._metrics["train/" + ds_name]
                terms[ours_name] += (e["num"][-1] / (e["den"][-1] + 1e-6)).item() / len(groups)
            dsmetrics._metrics.clear()
            if s < steps:
                (loss / len(groups)).backward()  # BaseTrainer.train: run_batch(...) / grad accumulation steps
        ds_losses.append(step_loss)
        ds_terms.append(terms)
        if s == steps:
            break
        if s == 0:
            gd = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
            if ours_first[2] is not None:
                res["step0_loss_rel_err"] = abs(step_loss - ours_first[2].item()) / abs(ours_first[2].item())
            res["step0_grad_rel_err"] = {n: rel_err(ours_first[3][n], gd[n]) for n in names}
            res["step0_grad_rel_err_max"] = max(res["step0_grad_rel_err"].values())
        tn = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], MAX_GRAD_NORM)
        ds_norms.append(tn.item())
        opt.step()
        model.zero_grad(set_to_none=True)
    ours = [r["loss"] for r in ours_recs]
    res["trainable"] = names
    res["losses_deepspec"] = ds_losses
    res["grad_norms_deepspec"] = ds_norms
    res["lrs_deepspec"] = ds_lrs[:steps]
    res["lr_max_abs_diff"] = max(abs(a - r["lr"]) for a, r in zip(ds_lrs[:steps], ours_recs))
    res["loss_max_rel_diff_over_steps"] = max(abs(a - b) / abs(b) for a, b in zip(ds_losses, ours))
    res["terms_deepspec"] = ds_terms
    res["term_max_rel_diff_over_steps"] = {
        k: max(abs(d[k] - r[k]) / abs(r[k]) for d, r in zip(ds_terms, ours_recs)) for k in ("ce", "l1", "confidence")}
    res["grad_norm_max_rel_diff_over_steps"] = max(
        abs(a - r["grad_norm"]) / r["grad_norm"] for a, r in zip(ds_norms, ours_recs))
    res["deepspec_commit"] = "afdfa7c9382a3341a3e6f17756dd816da79f132c (deepseek-ai/DeepSpec main as mirrored)"
    res["how"] = ("DeepSpec's Qwen3DSparkModel.from_pretrained(drafter/) forward, compute_dspark_loss, backward, "
                  "torch clip_grad_norm_ (FSDP's on one rank), BF16Optimizer (fp32) with its scheduler; only "
                  "sample_anchor_positions (-> the golden anchors) and create_dspark_attention_mask (-> the dense "
                  "additive equivalent, eager attention: flex_attention has no CPU backward) replaced; a gloo "
                  "process group of size 1 for dist.get_world_size(). flex_forward_*: the unmodified flex "
                  "BlockMask path, forward only.")
    return res


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", default=os.path.join(REPO, "testdata/fixtures/qwen3-tiny"))
    ap.add_argument("--out", default=os.path.join(REPO, "testdata/fixtures/qwen3-tiny-train"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--total-steps", type=int, default=50)
    ap.add_argument("--check-deepspec", metavar="DIR", default=None)
    ap.add_argument("--compare", metavar="FILE", default=None,
                    help="no training: print per-tensor ||a-b||/||b|| and max |a-b| of FILE's tensors "
                         "(a trainer's dump under the golden's names) against OUT/golden.safetensors")
    args = ap.parse_args()
    if args.compare:
        gold = load_file(os.path.join(args.out, "golden.safetensors"))
        cand = load_file(args.compare)
        worst = 0.0
        for k in sorted(cand):
            if k not in gold:
                print("%-48s not in the golden" % k)
                continue
            a, b = cand[k], gold[k]
            if a.shape != b.shape:
                print("%-48s shape %s != golden %s" % (k, list(a.shape), list(b.shape)))
                worst = float("inf")
                continue
            r = rel_err(a, b)
            worst = max(worst, r) if k.startswith("grad.") else worst
            print("%-48s rel %.3e  max abs %.3e" % (k, r, (a.double() - b.double()).abs().max().item()))
        print("max gradient rel err %.3e" % worst)
        return

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)

    tdir, ddir = os.path.join(args.fixture, "target"), os.path.join(args.fixture, "drafter")
    tcfg = json.load(open(os.path.join(tdir, "config.json")))
    dcfg = json.load(open(os.path.join(ddir, "config.json")))
    T = load_file(os.path.join(tdir, "model.safetensors"))
    D = load_file(os.path.join(ddir, "model.safetensors"))
    assert all(v.dtype == torch.float32 for v in list(T.values()) + list(D.values()))
    assert torch.equal(D["embed_tokens.weight"], T["model.embed_tokens.weight"])
    assert torch.equal(D["lm_head.weight"], T["lm_head.weight"])
    assert dcfg["markov_head_type"] == "vanilla" and dcfg["confidence_head_with_markov"]

    # target forward vs the fixture's own goldens (computed by transformers)
    fg = load_file(os.path.join(args.fixture, "golden.safetensors"))
    lay, fin, lg = target_forward(T, tcfg, fg["prompt_ids"].long())
    target_check = dict(layer_outputs_rel_err=rel_err(lay, fg["target_layer_outputs"]),
                        final_norm_rel_err=rel_err(fin, fg["target_final_norm"]),
                        logits_rel_err=rel_err(lg, fg["target_logits_prompt"]))
    assert max(target_check.values()) < 1e-5, target_check
    print("target forward vs fixture golden:", target_check)

    input_ids, loss_mask, taps, last = build_batch(T, tcfg, dcfg, tcfg["vocab_size"])
    anchors, keep = choose_anchors(loss_mask, dcfg["num_anchors"])
    batch = (input_ids, loss_mask, taps, last, anchors, keep)

    first, recs, final = train(D, dcfg, batch, torch.float32, args.steps, args.total_steps)
    (o, loss, t), grads, gnorm = first[0][0], first[2], first[3]
    first64, recs64, final64 = train(D, dcfg, batch, torch.float64, args.steps, args.total_steps)
    grads64 = first64[2]
    micro = [[b] for b in range(input_ids.shape[0])]
    firstA, recsA, finalA = train(D, dcfg, batch, torch.float32, args.steps, args.total_steps, micro)
    firstA64, recsA64, _ = train(D, dcfg, batch, torch.float64, args.steps, args.total_steps, micro)

    for r in recs:
        print("step %2d lr %.6e loss %.7f ce %.7f l1 %.7f conf %.7f gnorm %s" % (
            r["step"], r["lr"] or 0, r["loss"], r["ce"], r["l1"], r["confidence"], r.get("grad_norm")))

    os.makedirs(args.out, exist_ok=True)
    i64 = lambda x: x.detach().to(torch.int64).contiguous().numpy()
    f32 = lambda x: x.detach().to(torch.float32).contiguous().numpy()
    tensors = {
        "input_ids": i64(input_ids), "loss_mask": i64(loss_mask),
        "target_hidden_states": f32(taps), "target_last_hidden_states": f32(last),
        "anchor_positions": i64(anchors), "block_keep_mask": i64(keep),
        "block_input_ids": i64(o["noise_ids"]), "block_position_ids": i64(o["block_positions"]),
        "context_projected": f32(o["context_projected"]), "block_hidden": f32(o["block_hidden"]),
        "target_ids": i64(o["labels"]), "markov_prev_ids": i64(o["prev"]),
        "eval_mask": i64(o["eval_mask"]), "loss_weights": f32(t["weights"]),
        "draft_logits": f32(o["draft_logits"]), "confidence_logits": f32(o["confidence_logits"]),
        "ce_per_token": f32(t["ce_tok"]), "l1_per_token": f32(t["l1_tok"]),
        "confidence_targets": f32(t["cstar"]), "bce_per_token": f32(t["bce_tok"]),
        "step_losses": np.array([[r["loss"], r["ce"], r["l1"], r["confidence"]] for r in recs], dtype=np.float32),
        "step_lr": np.array([r["lr"] for r in recs[:-1]], dtype=np.float32),
        "step_grad_norm": np.array([r["grad_norm"] for r in recs[:-1]], dtype=np.float32),
    }
    for k, gr in grads.items():
        tensors["grad." + k] = f32(gr)
    tensors["accum_step_losses"] = np.array([[r["loss"], r["ce"], r["l1"], r["confidence"]] for r in recsA],
                                            dtype=np.float32)
    tensors["accum_step_grad_norm"] = np.array([r["grad_norm"] for r in recsA[:-1]], dtype=np.float32)
    save_file(tensors, os.path.join(args.out, "golden.safetensors"))

    grad_fp64_rel = {k: rel_err(grads[k], grads64[k]) for k in grads}
    loss_fp64_rel = [abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(recs, recs64)]
    B, S = input_ids.shape
    meta = {
        "what": "DeepSpec DSpark training goldens on qwen3-tiny (scripts/train_reference.py)",
        "fixture": os.path.relpath(args.fixture, REPO),
        "sha256": {"target/model.safetensors": sha256(os.path.join(tdir, "model.safetensors")),
                   "drafter/model.safetensors": sha256(os.path.join(ddir, "model.safetensors"))},
        "versions": {"torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0]},
        "dtype": "float32, CPU, 1 thread, torch.use_deterministic_algorithms(True)",
        "batch": {"B": B, "S": S, "num_anchors": dcfg["num_anchors"], "block_size": dcfg["block_size"],
                  "prompt_len": [p for p, _ in SEQS], "seq_len": [n for _, n in SEQS],
                  "data_seed": DATA_SEED, "anchor_seed": ANCHOR_SEED,
                  "generation": "prompt ids uniform in [0,V) then target samples at temperature 1 (torch.Generator)",
                  "input_ids": input_ids.tolist(), "loss_mask": loss_mask.tolist(),
                  "anchor_positions": anchors.tolist(), "block_keep_mask": keep.int().tolist(),
                  "supervised_positions": int(o["eval_mask"].sum())},
        "recipe": {"ce_loss_alpha": CE_ALPHA, "l1_loss_alpha": L1_ALPHA, "confidence_head_alpha": CONF_ALPHA,
                   "loss_decay_gamma": LOSS_DECAY_GAMMA, "loss_denominator_eps": 1e-6,
                   "lr": LR, "warmup_ratio": WARMUP_RATIO, "weight_decay": WEIGHT_DECAY,
                   "max_grad_norm": MAX_GRAD_NORM, "clip_eps": 1e-6, "adam_betas": list(ADAM_BETAS),
                   "adam_eps": ADAM_EPS, "total_steps": args.total_steps, "steps_run": args.steps,
                   "warmup_steps": int(WARMUP_RATIO * args.total_steps),
                   "schedule": "lr(s) = LR*(s+1)/W for s < W, else LR*(1+cos(pi*(s-W)/T))/(1+cos(pi/T)), T = total-W; s = 0-based optimizer step (DeepSpec CosineAnnealingWarmupLR as it behaves)",
                   "frozen": list(FROZEN)},
        "step0": {"loss": loss.item(), "ce": t["ce"].item(), "l1": t["l1"].item(),
                  "confidence": t["confidence"].item(), "weight_sum": t["weights"].sum().item(),
                  "grad_norm_before_clip": gnorm,
                  "grad_norm_per_tensor": {k: torch.linalg.vector_norm(g).item() for k, g in grads.items()}},
        "steps": recs,
        "final_param_norm": {k: torch.linalg.vector_norm(v).item() for k, v in final.items()},
        "final_param_sum": {k: v.double().sum().item() for k, v in final.items()},
        "final_minus_init_norm": {k: torch.linalg.vector_norm(v - D[k]).item() for k, v in final.items()},
        "accumulation_mode": {
            "what": ("the same batch as DeepSpec's recipe configs run it (local_batch_size 1, gradient "
                     "accumulation): each sequence (padded row) is its own micro-batch with its own "
                     "weight-sum normalisation; backward of loss_b / B per row; gradients summed; then one "
                     "clip + AdamW step. Logged loss/terms = mean over rows. Only scalars and per-tensor "
                     "gradient norms are stored (size), plus accum_step_losses / accum_step_grad_norm"),
            "step0_rows": [dict(loss=pt[1].item(), ce=pt[2]["ce"].item(), l1=pt[2]["l1"].item(),
                                confidence=pt[2]["confidence"].item(), weight_sum=pt[2]["weights"].sum().item())
                           for pt in firstA[0]],
            "step0_grad_norm_before_clip": firstA[3],
            "step0_grad_norm_per_tensor": {k: torch.linalg.vector_norm(g).item() for k, g in firstA[2].items()},
            "step0_grad_sum_per_tensor": {k: g.double().sum().item() for k, g in firstA[2].items()},
            "steps": recsA,
            "final_param_norm": {k: torch.linalg.vector_norm(v).item() for k, v in finalA.items()},
            "fp32_vs_fp64_step0_grad_rel_err_max": max(rel_err(firstA[2][k], firstA64[2][k]) for k in firstA[2]),
            "fp32_vs_fp64_loss_rel_err_max": max(abs(a["loss"] - b["loss"]) / abs(b["loss"])
                                                 for a, b in zip(recsA, recsA64)),
        },
        "target_forward_check": target_check,
        "fp32_vs_fp64": {"step0_grad_rel_err": grad_fp64_rel,
                         "step0_grad_rel_err_max": max(grad_fp64_rel.values()),
                         "loss_rel_err_per_step": loss_fp64_rel,
                         "loss_rel_err_max": max(loss_fp64_rel),
                         "final_param_rel_err_max": max(rel_err(final[k], final64[k]) for k in final)},
        "tensors": {k: [list(v.shape), str(v.dtype)] for k, v in tensors.items()},
    }
    if args.check_deepspec:
        meta["deepspec_check"] = check_deepspec(args.check_deepspec, ddir, batch, args.total_steps,
                                                args.steps, (o, t, loss, grads), recs, o)
        meta["deepspec_check_accumulation"] = check_deepspec(
            args.check_deepspec, ddir, batch, args.total_steps, args.steps, (None, None, None, firstA[2]),
            recsA, o, micro=micro)
        print("deepspec check:", {k: v for k, v in meta["deepspec_check"].items()
                                  if not isinstance(v, (dict, list))})
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("fp32 vs fp64: grad rel err max %.3e, loss rel err max %.3e" % (
        meta["fp32_vs_fp64"]["step0_grad_rel_err_max"], meta["fp32_vs_fp64"]["loss_rel_err_max"]))


if __name__ == "__main__":
    main()
