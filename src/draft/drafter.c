/* What every DeepSpec drafter shares: the config fields DeepSpec adds, the
 * compatibility check against the target, the context projection
 * hidden_norm(fc(taps)), the LM head and the proposal (Markov chain,
 * confidence, static truncation). */
#include "draft/drafter.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"
#include "model/qwen3_layer.h"

static ds_error *check_against_target(ds_drafter *d, const ds_target *t) {
    const char *dir = d->ck->dir;
    if (d->vocab != t->vocab)
        return ds_errorf("%s: drafter vocab_size %d does not match the target's %d (a drafter for another target?)",
                         dir, d->vocab, t->vocab);
    if (d->hidden != t->hidden)
        return ds_errorf("%s: drafter hidden_size %d does not match the target's %d (a drafter for another target?)",
                         dir, d->hidden, t->hidden);
    if (d->num_target_layers > 0 && d->num_target_layers != t->n_layers)
        return ds_errorf("%s: drafter num_target_layers %d does not match the target's %d layers", dir,
                         d->num_target_layers, t->n_layers);
    for (int i = 0; i < d->n_taps; i++)
        if (d->tap_layers[i] < -1 || d->tap_layers[i] >= t->n_layers - 1)
            return ds_errorf("%s: target_layer_ids[%d] = %d is out of range: taps must be -1..%d (the target has %d "
                             "layers and its last layer cannot be tapped)",
                             dir, i, d->tap_layers[i], t->n_layers - 2, t->n_layers);
    if (d->mask_id < 0 || d->mask_id >= d->vocab)
        return ds_errorf("%s: mask_token_id %d is outside the vocabulary (0..%d)", dir, d->mask_id, d->vocab - 1);
    return NULL;
}

/* A config integer narrows to int only when it fits: 2^32 + 5 must not pass as 5. */
static ds_error *narrow(const char *dir, const char *field, int64_t v, int *out) {
    if (v < -(1 << 30) || v > (1 << 30))
        return ds_errorf("%s: config field %s = %lld is out of range", dir, field, (long long)v);
    *out = (int)v;
    return NULL;
}

static ds_error *read_config(ds_drafter *d) {
    const cJSON *cfg = d->ck->config;
    const char *dir = d->ck->dir;
    int64_t v, *taps;
    double eps;
    DS_TRY(ds_cfg_int(cfg, dir, "vocab_size", &v));
    DS_TRY(narrow(dir, "vocab_size", v, &d->vocab));
    DS_TRY(ds_cfg_int(cfg, dir, "hidden_size", &v));
    DS_TRY(narrow(dir, "hidden_size", v, &d->hidden));
    DS_TRY(ds_cfg_int(cfg, dir, "block_size", &v));
    if (v < 1 || v > DS_MAX_GAMMA) return ds_errorf("%s: block_size %lld is outside 1..%d", dir, (long long)v, DS_MAX_GAMMA);
    d->gamma = (int)v;
    DS_TRY(ds_cfg_int(cfg, dir, "mask_token_id", &v));
    DS_TRY(narrow(dir, "mask_token_id", v, &d->mask_id));
    DS_TRY(ds_cfg_int_or(cfg, dir, "num_target_layers", 0, &v));
    DS_TRY(narrow(dir, "num_target_layers", v, &d->num_target_layers));
    int n;
    DS_TRY(ds_cfg_int_list(cfg, dir, "target_layer_ids", &taps, &n));
    if (n < 1 || n > DS_MAX_TAPS) {
        free(taps);
        return ds_errorf("%s: target_layer_ids must list 1..%d layers", dir, DS_MAX_TAPS);
    }
    d->n_taps = n;
    ds_error *e = NULL;
    for (int i = 0; i < n && !e; i++) e = narrow(dir, "target_layer_ids", taps[i], &d->tap_layers[i]);
    free(taps);
    if (e) return e;
    DS_TRY(ds_cfg_float_or(cfg, dir, "rms_norm_eps", 1e-6, &eps));
    d->eps = (float)eps;
    DS_TRY(ds_cfg_int_or(cfg, dir, "markov_rank", 0, &v));
    if (v < 0) return ds_errorf("%s: markov_rank %lld is negative", dir, (long long)v);
    DS_TRY(narrow(dir, "markov_rank", v, &d->markov_rank));
    if (d->markov_rank > 0) {
        const char *type = ds_cfg_str(cfg, "markov_head_type");
        if (!type) return ds_errorf("%s: markov_rank %d but no markov_head_type", dir, d->markov_rank);
        if (!strcmp(type, "vanilla")) d->markov = DS_MARKOV_VANILLA;
        else if (!strcmp(type, "gated")) d->markov = DS_MARKOV_GATED;
        else if (!strcmp(type, "rnn")) d->markov = DS_MARKOV_RNN;
        else return ds_errorf("%s: markov_head_type \"%s\" is not one of vanilla, gated, rnn", dir, type);
    }
    DS_TRY(ds_cfg_bool_or(cfg, dir, "enable_confidence_head", false, &d->confidence));
    DS_TRY(ds_cfg_bool_or(cfg, dir, "confidence_head_with_markov", false, &d->confidence_with_markov));
    if (!d->confidence) d->confidence_with_markov = false;
    if (d->confidence_with_markov && !d->markov_rank)
        return ds_errorf("%s: confidence_head_with_markov needs a Markov head (markov_rank > 0)", dir);
    return NULL;
}

ds_error *ds_drafter_load_common(ds_drafter *d, const ds_target *t) {
    ds_backend *be = d->be;
    const ds_checkpoint *ck = d->ck;
    DS_TRY(read_config(d));
    DS_TRY(check_against_target(d, t));
    const int H = d->hidden, V = d->vocab, r = d->markov_rank;
    d->max_ctx = t->max_ctx;
    DS_TRY(ds_load_weight(be, ck, "embed_tokens.weight", V, H, &d->embed));
    DS_TRY(ds_load_weight(be, ck, "fc.weight", H, (int64_t)d->n_taps * H, &d->fc));
    DS_TRY(ds_load_vector(be, ck, "hidden_norm.weight", H, &d->hidden_norm));
    DS_TRY(ds_load_weight(be, ck, "lm_head.weight", V, H, &d->lm_head));
    /* The heads read their weights other than through linear (rows of w1, the walks' bias, the bound): a quantized
     * checkpoint's come dequantized, so they are exact on those values. */
    if (r > 0) {
        DS_TRY(ds_load_weight_dense(be, ck, "markov_head.markov_w1.weight", V, r, &d->markov_w1));
        DS_TRY(ds_load_weight_dense(be, ck, "markov_head.markov_w2.weight", V, r, &d->markov_w2));
        /* The bound holds for any vector: the gated / RNN walks prune by it too. */
        if (d->markov == DS_MARKOV_VANILLA ? ds_spec(be)->markov_greedy != NULL : ds_spec(be)->markov_greedy_latent != NULL)
            DS_TRY(ds_markov_load_bound(d));
    }
    if (d->markov == DS_MARKOV_GATED) {
        DS_TRY(ds_load_weight_dense(be, ck, "markov_head.gate_proj.weight", r, H + r, &d->gate_w));
        DS_TRY(ds_load_vector(be, ck, "markov_head.gate_proj.bias", r, &d->gate_b));
    }
    if (d->markov == DS_MARKOV_RNN) {
        DS_TRY(ds_load_weight_dense(be, ck, "markov_head.joint_proj.weight", 3 * r, 2 * r + H, &d->joint_w));
        DS_TRY(ds_load_vector(be, ck, "markov_head.joint_proj.bias", 3 * r, &d->joint_b));
    }
    if (d->confidence) {
        DS_TRY(ds_load_weight_dense(be, ck, "confidence_head.proj.weight", 1, H + (d->confidence_with_markov ? r : 0),
                              &d->conf_w));
        DS_TRY(ds_load_vector(be, ck, "confidence_head.proj.bias", 1, &d->conf_b));
    }
    if (d->confidence) DS_TRY(be->ops->alloc(be, DS_F32, d->gamma, 1, &d->conf_cut));
    for (int k = 0; k < DS_MAX_GAMMA; k++) d->conf_temp[k] = 1.0f;
    d->logits_bf16 = d->lm_head.dtype == DS_BF16;
    const int G = d->gamma, wide = 3 * r + H > V ? 3 * r + H : V;
    DS_TRY(be->ops->alloc(be, DS_F32, d->max_rows, H, &d->ctx));
    DS_TRY(be->ops->alloc(be, DS_F32, G, H, &d->block_hidden));
    DS_TRY(be->ops->alloc(be, DS_F32, G, V, &d->logits));
    if (ds_spec(be)->markov_greedy || ds_spec(be)->markov_sample) DS_TRY(be->ops->alloc(be, DS_F32, G, V, &d->mlogits));
    if (ds_spec(be)->markov_sample) DS_TRY(be->ops->alloc(be, DS_F32, G, V, &d->probs));
    DS_TRY(be->ops->alloc(be, DS_F32, G, 2 * r + H + 1, &d->step_in));
    DS_TRY(be->ops->alloc(be, DS_F32, G, wide, &d->step_out));
    d->host_logits = malloc((size_t)G * V * sizeof(float));
    d->host_probs = malloc((size_t)G * V * sizeof(float));
    d->host_hidden = malloc((size_t)G * H * sizeof(float));
    d->host_bias = malloc((size_t)V * sizeof(float));
    d->host_prev = malloc((size_t)(G * r + 1) * sizeof(float));
    d->host_feat = malloc((size_t)(2 * r + H + 1) * sizeof(float));
    d->host_proj = malloc((size_t)(3 * r + 1) * sizeof(float));
    d->host_state = malloc((size_t)(r + 1) * sizeof(float));
    d->step.cap = d->max_rows + G;
    d->step.ids = calloc((size_t)d->step.cap, sizeof *d->step.ids);
    d->step.pos = calloc((size_t)d->step.cap, sizeof *d->step.pos);
    d->step.out = calloc((size_t)d->step.cap, sizeof *d->step.out);
    if (!d->step.ids || !d->step.pos || !d->step.out) return ds_errorf("out of memory");
    if (!d->host_state || !d->host_logits || !d->host_probs || !d->host_hidden || !d->host_bias || !d->host_prev || !d->host_feat ||
        !d->host_proj)
        return ds_errorf("out of memory");
    return NULL;
}

void ds_drafter_release_common(ds_drafter *d) {
    ds_backend *be = d->be;
    ds_tensor *all[] = {&d->embed, &d->fc, &d->hidden_norm, &d->lm_head, &d->markov_w1, &d->markov_w2,
                        &d->markov_bound.proj, &d->markov_bound.coef, &d->markov_bound.radius, &d->gate_w,
                        &d->gate_b, &d->joint_w, &d->joint_b, &d->conf_w, &d->conf_b, &d->conf_cut,
                        &d->ctx, &d->block_hidden, &d->logits, &d->mlogits, &d->probs, &d->step_in, &d->step_out,
                        &d->batch_hidden, &d->batch_logits, &d->batch_taps, &d->seqs_feat, &d->seqs_conf};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->release(be, all[i]);
    free(d->host_logits);
    free(d->host_probs);
    free(d->host_hidden);
    free(d->host_bias);
    free(d->host_prev);
    free(d->host_feat);
    free(d->host_proj);
    free(d->host_state);
    free(d->step.ids);
    free(d->step.pos);
    free(d->step.out);
}

void ds_drafter_free(ds_drafter *d) {
    if (!d) return;
    ds_checkpoint *ck = d->ck;
    d->ops->destroy(d);
    ds_checkpoint_close(ck);
}

static ds_error *check_append(const ds_drafter *d, int pos0, int n) {
    if (n > d->max_rows) return ds_errorf("drafter context append of %d rows (at most %d)", n, d->max_rows);
    if (pos0 < 0 || pos0 > d->n_ctx)
        return ds_errorf("drafter context append at position %d but it holds %d rows", pos0, d->n_ctx);
    if (pos0 + n > d->max_ctx) return ds_errorf("drafter context of %d rows exceeds %d", pos0 + n, d->max_ctx);
    return NULL;
}

void ds_drafter_context(ds_drafter *d, ds_tensor taps, int n, const int32_t *pos) {
    ds_backend *be = d->be;
    ds_tensor ctx = ds_rows(d->ctx, 0, n);
    be->ops->linear(be, ctx, ds_rows(taps, 0, n), d->fc, ds_no_tensor());
    be->ops->rmsnorm(be, ctx, ctx, d->hidden_norm, d->hidden, d->eps);
    d->ops->context(d, ctx, pos);
}

ds_error *ds_drafter_append(ds_drafter *d, ds_tensor taps, int pos0, int n) {
    if (n <= 0) return NULL;
    DS_TRY(check_append(d, pos0, n));
    for (int i = 0; i < n; i++) d->step.pos[i] = pos0 + i;
    ds_drafter_context(d, taps, n, d->step.pos);
    d->n_ctx = pos0 + n;
    return NULL;
}

/* bf16 checkpoints: the reference's lm_head output and its soft-cap are
 * both bf16 results (as the target's logits). */
void ds_drafter_lm_head(ds_drafter *d, ds_tensor logits, ds_tensor hidden) {
    ds_backend *be = d->be;
    be->ops->linear(be, logits, hidden, d->lm_head, ds_no_tensor());
    if (d->logits_bf16) be->ops->round_bf16(be, logits);
    if (d->logit_softcap > 0) {
        be->ops->softcap(be, logits, d->logit_softcap);
        if (d->logits_bf16) be->ops->round_bf16(be, logits);
    }
}

ds_error *ds_drafter_propose(ds_drafter *d, int32_t anchor, int start, const ds_sampling *s, float threshold,
                             ds_rng *rng, ds_proposal *out) {
    return ds_drafter_round(d, ds_no_tensor(), start, 0, anchor, start, s, threshold, false, rng, out);
}

ds_error *ds_drafter_round(ds_drafter *d, ds_tensor taps, int pos0, int n, int32_t anchor, int start,
                           const ds_sampling *s, float threshold, bool keep_on_backend, ds_rng *rng,
                           ds_proposal *out) {
    if (n < 0) n = 0;
    if (n > 0) DS_TRY(check_append(d, pos0, n));
    const int have = n > 0 ? pos0 + n : d->n_ctx;
    if (start != have)
        return ds_errorf("drafting at position %d but the drafter context holds %d rows", start, have);
    ds_backend *be = d->be;
    const int G = d->gamma;
    /* The step: context positions pos0.., then the block's start..; the
     * block's ids [anchor, mask, ...]; the walked tokens come back in out. */
    ds_step *st = &d->step;
    for (int i = 0; i < n; i++) st->pos[i] = pos0 + i;
    for (int k = 0; k < G; k++) st->pos[n + k] = start + k;
    st->ids[0] = anchor;
    for (int k = 1; k < G; k++) st->ids[k] = d->mask_id;
    st->n_keys = start + G;
    const bool walk = ds_markov_device_walk(d, s);
    /* A chained round (keep_on_backend): the walked tokens stay on the
     * backend for the verify, and with a threshold the confidence head and
     * the cut run there too (conf_cut against fp32 cutoffs, one a position,
     * that decide exactly as the host's ds_conf_below_at): out = [tokens, n]. */
    const bool cut = d->confidence && threshold > 0;
    /* Paged caches (the batched engine) take host page tables: no step region. */
    const bool regions = d->graph_safe && !d->pages;
    const bool chain = walk && keep_on_backend && !d->keep_logits && regions && (!cut || threshold <= 1.0f);
    if (chain && cut && d->conf_cut_t != threshold) {
        float c[DS_MAX_GAMMA];
        for (int k = 0; k < G; k++) c[k] = ds_conf_cutoff_at(threshold, d->conf_temp[k]); /* STS: per position */
        be->ops->upload(be, d->conf_cut, c);
        d->conf_cut_t = threshold;
    }
    st->n_ids = G;
    st->n_pos = n + G;
    st->n_out = walk ? G + (chain && cut) : 0;
    st->keep_out = chain;
    st->out_kept = false;
    st->ids_prev_at = st->n_ids_prev = 0;
    ds_region_key key = {DS_REGION_DRAFT, n > G ? n : G,
                         n | (walk ? 1 << 16 : 0) | (d->keep_logits ? 1 << 17 : 0) | (chain ? 1 << 18 : 0) |
                             (chain && cut ? 1 << 19 : 0),
                         d};
    if (!regions || ds_region_begin(be, &key, st)) {
        if (n > 0) ds_drafter_context(d, taps, n, st->pos);
        d->ops->block(d, G, st->ids, st->pos + n, st->n_keys, d->block_hidden);
        if (walk && ds_markov_head_walk(d)) {
            ds_markov_walk_head_queue(d, anchor, st->out); /* the LM head and the walk at once */
        } else {
            ds_drafter_lm_head(d, d->logits, d->block_hidden);
            if (walk) ds_markov_walk_queue(d, anchor, st->out);
        }
        if (chain && cut) {
            ds_markov_confidence_queue(d);
            ds_conf_cut(be, ds_rows(ds_cols(d->step_out, 0, 1), 0, G), d->conf_cut, st->out + G);
        }
    }
    if (regions) ds_region_end(be);
    st->keep_out = false;
    if (n > 0) d->n_ctx = pos0 + n;
    out->n_kept = 0;
    if (chain) {
        out->logits = NULL;
        out->probs = NULL;
        out->probs_dev = ds_no_tensor();
        if (st->out_kept) { /* on the backend until the verify takes them */
            out->n_kept = G + cut;
            memset(out->tokens, 0, (size_t)G * sizeof *out->tokens);
            out->n = cut ? 0 : G;
        } else { /* the region ran op by op: on the host */
            memcpy(out->tokens, st->out, (size_t)G * sizeof *out->tokens);
            out->n = cut ? st->out[G] : G;
        }
        /* No check while kept: waiting here would cost what keeping saves
         * (a failure surfaces at the verify's end). */
        return st->out_kept ? NULL : ds_backend_check(be);
    }
    if (walk) {
        memcpy(out->tokens, st->out, (size_t)G * sizeof *out->tokens);
        ds_markov_walk_finish(d, out);
    } else {
        ds_markov_chain(d, anchor, s, rng, out);
    }
    out->n = d->confidence ? ds_conf_keep(out->conf_logit, d->conf_temp, d->gamma, threshold) : d->gamma;
    return NULL;
}

ds_error *ds_drafter_set_temperatures(ds_drafter *d, const float *temp, int n) {
    if (temp && n != d->gamma)
        return ds_errorf("%d STS temperatures for a drafter whose block_size is %d", n, d->gamma);
    for (int k = 0; k < d->gamma; k++)
        if (temp && !(temp[k] > 0 && isfinite(temp[k])))
            return ds_errorf("STS temperature %d is %g, not a finite number > 0", k, temp[k]);
    for (int k = 0; k < d->gamma; k++) d->conf_temp[k] = temp ? temp[k] : 1.0f;
    d->conf_cut_t = 0; /* the backend's cutoffs are stale */
    return NULL;
}

ds_error *ds_drafter_host_probs(ds_drafter *d, ds_proposal *out) {
    if (out->probs || !out->probs_dev.data) return NULL;
    d->be->ops->download(d->be, out->probs_dev, d->host_probs);
    out->probs = d->host_probs;
    return ds_backend_check(d->be);
}
