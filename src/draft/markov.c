/* The sequential half of DSpark: walk the block left to right, add the
 * Markov bias of the previous token to each position's base logits, draw
 * the token, then score every position with the confidence head
 * (DeepSpec markov_head.py and draft_ops.py). In the host walk the
 * r-dimensional head state is tiny and lives on the host, the V x r
 * projections run on the backend; a backend with the walk ops (backend.h
 * markov_greedy, markov_sample and their _latent forms for the gated and RNN
 * heads) runs the whole walk itself. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "draft/drafter.h"
#include "draft/markov_bound.h"
#include "io/checkpoint.h"
#include "io/quant_checkpoint.h"
#include "sample/draw.h"
#include "sample/probs.h"

/* The bias bound (markov_bound.h) from the checkpoint's w2, uploaded once:
 * the device walk skips the rows it says cannot win. */
ds_error *ds_markov_load_bound(ds_drafter *d) {
    const char *name = "markov_head.markov_w2.weight";
    const ds_st_tensor *t = ds_checkpoint_find(d->ck, name);
    if (!t) return ds_errorf("%s: %s is missing", d->ck->dir, name);
    /* A quantized w2 is bounded on its dequantized values (those the walk adds). */
    ds_quant_src q;
    DS_TRY(ds_checkpoint_quant(d->ck, name, d->vocab, d->markov_rank, &q));
    float *dq = NULL;
    if (q.w) DS_TRY(ds_quant_dequantize(&q, d->vocab, d->markov_rank, &dq));
    ds_markov_bound_host h;
    ds_error *e = ds_markov_bound_build(dq ? (const void *)dq : t->data, dq ? DS_F32 : t->dtype, d->vocab,
                                        d->markov_rank, DS_MARKOV_BOUND_K, &h);
    free(dq);
    if (e) return ds_error_wrap(e, "%s: %s", d->ck->dir, name);
    ds_backend *be = d->be;
    ds_markov_bound *b = &d->markov_bound;
    e = be->ops->alloc(be, DS_F32, h.k, h.r, &b->proj);
    if (!e) e = be->ops->alloc(be, DS_F32, h.vocab, h.k, &b->coef);
    if (!e) e = be->ops->alloc(be, DS_F32, 1, h.vocab, &b->radius);
    if (!e) {
        be->ops->upload(be, b->proj, h.proj);
        be->ops->upload(be, b->coef, h.coef);
        be->ops->upload(be, b->radius, h.radius);
    }
    ds_markov_bound_free(&h);
    return e;
}

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* y[w.rows] = w @ x[k] (+ b), on the backend, through the step buffers. */
static void small_linear(ds_drafter *d, ds_tensor w, ds_tensor b, const float *x, int k, float *y) {
    ds_backend *be = d->be;
    ds_tensor in = ds_cols(ds_rows(d->step_in, 0, 1), 0, k);
    ds_tensor out = ds_cols(ds_rows(d->step_out, 0, 1), 0, w.rows);
    be->ops->upload(be, in, x);
    be->ops->linear(be, out, in, w, b);
    be->ops->download(be, out, y);
}

/* e[r] = markov_w1[prev]. */
static void prev_embedding(ds_drafter *d, int32_t prev, float *e) {
    ds_backend *be = d->be;
    ds_tensor row = ds_cols(ds_rows(d->step_in, 0, 1), 0, d->markov_rank);
    be->ops->embed(be, row, d->markov_w1, &prev, 1.0f);
    be->ops->download(be, row, e);
}

/* bias[V] for block position k whose previous token embedding is e. */
static void markov_bias(ds_drafter *d, const float *e, const float *h, float *bias) {
    const int r = d->markov_rank, H = d->hidden;
    float *z = d->host_feat, *proj = d->host_proj, *state = d->host_state;
    switch (d->markov) {
    case DS_MARKOV_VANILLA: /* w2(e) */
        small_linear(d, d->markov_w2, ds_no_tensor(), e, r, bias);
        break;
    case DS_MARKOV_GATED: /* w2(sigmoid(gate_proj([h; e])) * e) */
        memcpy(z, h, (size_t)H * sizeof *z);
        memcpy(z + H, e, (size_t)r * sizeof *z);
        small_linear(d, d->gate_w, d->gate_b, z, H + r, proj);
        for (int i = 0; i < r; i++) proj[i] = sigmoidf(proj[i]) * e[i];
        small_linear(d, d->markov_w2, ds_no_tensor(), proj, r, bias);
        break;
    case DS_MARKOV_RNN: /* [g; c; o] = joint([s; e; h]); s = g*s + (1-g)*tanh(c); w2(tanh(o)) */
        memcpy(z, state, (size_t)r * sizeof *z);
        memcpy(z + r, e, (size_t)r * sizeof *z);
        memcpy(z + 2 * r, h, (size_t)H * sizeof *z);
        small_linear(d, d->joint_w, d->joint_b, z, 2 * r + H, proj);
        for (int i = 0; i < r; i++) {
            float g = sigmoidf(proj[i]);
            state[i] = g * state[i] + (1.0f - g) * tanhf(proj[r + i]);
            proj[2 * r + i] = tanhf(proj[2 * r + i]);
        }
        small_linear(d, d->markov_w2, ds_no_tensor(), proj + 2 * r, r, bias);
        break;
    case DS_MARKOV_NONE: break;
    }
}

/* c_k = proj([h_k ; w1[prev_k]]) + b for every block position, one call,
 * over the features already in the rows of step_in. */
static void score_confidence(ds_drafter *d, ds_proposal *out) {
    ds_backend *be = d->be;
    const int F = d->hidden + (d->confidence_with_markov ? d->markov_rank : 0);
    ds_tensor col = ds_cols(d->step_out, 0, 1);
    be->ops->linear(be, col, ds_cols(d->step_in, 0, F), d->conf_w, d->conf_b);
    be->ops->download(be, col, out->conf_logit);
    if (d->logits_bf16) /* the linear runs in bf16, then is cast to fp32 */
        ds_round_bf16_n(out->conf_logit, (size_t)d->gamma);
}

void ds_markov_confidence_queue(ds_drafter *d) {
    ds_backend *be = d->be;
    const int G = d->gamma, H = d->hidden;
    const int F = H + (d->confidence_with_markov ? d->markov_rank : 0);
    ds_tensor col = ds_rows(ds_cols(d->step_out, 0, 1), 0, G);
    be->ops->copy(be, ds_cols(ds_rows(d->step_in, 0, G), 0, H), d->block_hidden);
    be->ops->linear(be, col, ds_cols(ds_rows(d->step_in, 0, G), 0, F), d->conf_w, d->conf_b);
    if (d->logits_bf16) be->ops->round_bf16(be, col); /* as score_confidence rounds on the host */
}

/* The host walk's features go up row by row. */
static void confidence(ds_drafter *d, ds_proposal *out) {
    ds_backend *be = d->be;
    const int G = d->gamma, H = d->hidden, r = d->markov_rank;
    const int F = H + (d->confidence_with_markov ? r : 0);
    float *feat = d->host_feat;
    for (int k = 0; k < G; k++) {
        memcpy(feat, d->host_hidden + (size_t)k * H, (size_t)H * sizeof *feat);
        if (d->confidence_with_markov) memcpy(feat + H, d->host_prev + (size_t)k * r, (size_t)r * sizeof *feat);
        be->ops->upload(be, ds_cols(ds_rows(d->step_in, k, 1), 0, F), feat);
    }
    score_confidence(d, out);
}

/* A gated or RNN head: its latent's operands for the backend's walks
 * (backend.h ds_markov_latent), which run it on the block's hidden rows. */
static bool latent_head(const ds_drafter *d) { return d->markov == DS_MARKOV_GATED || d->markov == DS_MARKOV_RNN; }
static ds_markov_latent head_latent(const ds_drafter *d) {
    const bool rnn = d->markov == DS_MARKOV_RNN;
    return (ds_markov_latent){rnn ? DS_LATENT_RNN : DS_LATENT_GATED, d->block_hidden, rnn ? d->joint_w : d->gate_w,
                              rnn ? d->joint_b : d->gate_b};
}
/* The bias bound where it was built (drafter.c: for the heads whose walk the backend runs). */
static const ds_markov_bound *walk_bound(const ds_drafter *d) {
    return d->markov_bound.proj.data ? &d->markov_bound : NULL;
}

/* Greedy walks run on the backend when it can (one host round trip per
 * block instead of several per position; gated and RNN heads through
 * markov_greedy_latent); the confidence head then reads its inputs where
 * they already are. Same operations, same results as the host walk below. */
bool ds_markov_device_walk(const ds_drafter *d, const ds_sampling *s) {
    if (!ds_sampling_greedy(s) || !d->mlogits.data) return false;
    return latent_head(d) ? ds_spec(d->be)->markov_greedy_latent != NULL : ds_spec(d->be)->markov_greedy != NULL;
}

void ds_markov_walk_queue(ds_drafter *d, int32_t anchor, int32_t *tokens) {
    ds_backend *be = d->be;
    const int G = d->gamma, H = d->hidden, r = d->markov_rank;
    const bool markov = d->markov != DS_MARKOV_NONE;
    /* step_in rows: [h_k ; w1[prev_k]], the confidence head's features. */
    ds_tensor emb = markov ? ds_cols(ds_rows(d->step_in, 0, G), H, r) : ds_no_tensor();
    if (latent_head(d)) {
        const ds_markov_latent lat = head_latent(d);
        ds_spec(be)->markov_greedy_latent(be, &lat, d->logits, d->keep_logits ? d->mlogits : ds_no_tensor(),
                                      d->markov_w1, d->markov_w2, walk_bound(d), d->logits_bf16, anchor, emb, tokens);
        return;
    }
    /* The corrected logits stay unwritten unless wanted: the walk may then skip rows. */
    ds_spec(be)->markov_greedy(be, d->logits, d->keep_logits ? d->mlogits : ds_no_tensor(),
                           markov ? d->markov_w1 : ds_no_tensor(), markov ? d->markov_w2 : ds_no_tensor(),
                           markov ? walk_bound(d) : NULL, d->logits_bf16, anchor, emb, tokens);
}

bool ds_markov_head_walk(const ds_drafter *d) {
    return ds_spec(d->be)->markov_greedy_head && d->markov == DS_MARKOV_VANILLA && !d->keep_logits &&
           !(d->logit_softcap > 0);
}

void ds_markov_walk_head_queue(ds_drafter *d, int32_t anchor, int32_t *tokens) {
    ds_backend *be = d->be;
    const int G = d->gamma, H = d->hidden, r = d->markov_rank;
    ds_tensor emb = ds_cols(ds_rows(d->step_in, 0, G), H, r);
    ds_spec(be)->markov_greedy_head(be, d->block_hidden, d->lm_head, d->logits, d->logits_bf16, d->markov_w1,
                                d->markov_w2, &d->markov_bound, anchor, emb, tokens);
}

void ds_markov_walk_finish(ds_drafter *d, ds_proposal *out) {
    ds_backend *be = d->be;
    const int G = d->gamma, H = d->hidden;
    out->logits = NULL;
    if (d->keep_logits) {
        be->ops->download(be, d->mlogits, d->host_logits);
        out->logits = d->host_logits;
    }
    out->probs = NULL;
    out->probs_dev = ds_no_tensor();
    if (!d->confidence) return;
    be->ops->copy(be, ds_cols(ds_rows(d->step_in, 0, G), 0, H), d->block_hidden);
    score_confidence(d, out);
}

/* Sampled walks run on the backend when it can (gated and RNN heads
 * through markov_sample_latent): the G uniforms the host walk would draw one per position are drawn
 * first, in the same order, and the drawn tokens come back once. The
 * processed distributions stay on the backend (out->probs_dev) for
 * verify_sample. */
static void device_sample_chain(ds_drafter *d, int32_t anchor, const ds_sampling *s, ds_rng *rng, ds_proposal *out) {
    ds_backend *be = d->be;
    const int G = d->gamma, H = d->hidden, r = d->markov_rank;
    const bool markov = d->markov != DS_MARKOV_NONE;
    double u[DS_MAX_GAMMA];
    for (int k = 0; k < G; k++) u[k] = ds_rng_uniform(rng);
    ds_tensor emb = markov ? ds_cols(ds_rows(d->step_in, 0, G), H, r) : ds_no_tensor();
    const ds_tensor keep = d->keep_logits ? d->mlogits : ds_no_tensor();
    if (latent_head(d)) {
        const ds_markov_latent lat = head_latent(d);
        ds_spec(be)->markov_sample_latent(be, &lat, d->logits, keep, d->probs, d->markov_w1, d->markov_w2, d->logits_bf16,
                                      anchor, s, u, emb, out->tokens);
    } else {
        ds_spec(be)->markov_sample(be, d->logits, keep, d->probs, markov ? d->markov_w1 : ds_no_tensor(),
                               markov ? d->markov_w2 : ds_no_tensor(), d->logits_bf16, anchor, s, u, emb, out->tokens);
    }
    out->logits = NULL;
    if (d->keep_logits) {
        be->ops->download(be, d->mlogits, d->host_logits);
        out->logits = d->host_logits;
    }
    out->probs = NULL;
    out->probs_dev = d->probs;
    if (!d->confidence) return;
    be->ops->copy(be, ds_cols(ds_rows(d->step_in, 0, G), 0, H), d->block_hidden);
    score_confidence(d, out);
}

void ds_markov_chain(ds_drafter *d, int32_t anchor, const ds_sampling *s, ds_rng *rng, ds_proposal *out) {
    ds_backend *be = d->be;
    out->probs_dev = ds_no_tensor();
    const bool walk_op = latent_head(d) ? ds_spec(be)->markov_sample_latent != NULL : ds_spec(be)->markov_sample != NULL;
    if (ds_markov_device_walk(d, s)) {
        ds_markov_walk_queue(d, anchor, out->tokens);
        ds_markov_walk_finish(d, out);
        return;
    }
    if (!ds_sampling_greedy(s) && walk_op && d->probs.data && d->mlogits.data) {
        device_sample_chain(d, anchor, s, rng, out);
        return;
    }
    const int G = d->gamma, V = d->vocab, H = d->hidden, r = d->markov_rank;
    be->ops->download(be, d->logits, d->host_logits);
    be->ops->download(be, d->block_hidden, d->host_hidden);
    if (r > 0) memset(d->host_state, 0, (size_t)r * sizeof(float));
    int32_t prev = anchor;
    for (int k = 0; k < G; k++) {
        float *logits = d->host_logits + (size_t)k * V;
        if (d->markov != DS_MARKOV_NONE) {
            float *e = d->host_prev + (size_t)k * r;
            prev_embedding(d, prev, e);
            markov_bias(d, e, d->host_hidden + (size_t)k * H, d->host_bias);
            if (d->logits_bf16) { /* bias and sum in bf16, as the reference */
                ds_round_bf16_n(d->host_bias, (size_t)V);
                for (int i = 0; i < V; i++) logits[i] += d->host_bias[i];
                ds_round_bf16_n(logits, (size_t)V);
            } else
                for (int i = 0; i < V; i++) logits[i] += d->host_bias[i];
        }
        if (ds_sampling_greedy(s)) {
            prev = ds_argmax(logits, V);
        } else {
            float *probs = d->host_probs + (size_t)k * V;
            ds_probs_from_logits(logits, V, s, probs);
            prev = ds_sample_probs(probs, V, rng);
        }
        out->tokens[k] = prev;
    }
    out->logits = d->host_logits;
    out->probs = ds_sampling_greedy(s) ? NULL : d->host_probs;
    if (d->confidence) confidence(d, out);
}

/* score_confidence for n sequences' blocks at once: hidden rows j*G.. and
 * the Markov inputs (already in d->seqs_feat's last columns) through the
 * head's linear at most 32 rows a call (the narrow kernels, row invariant
 * as a sequence's G-row call alone), one download. */
static void confidence_seqs(ds_drafter *d, ds_tensor hidden, int n, ds_proposal *out) {
    ds_backend *be = d->be;
    const int G = d->gamma, H = d->hidden, rows = n * G;
    const int F = H + (d->confidence_with_markov ? d->markov_rank : 0);
    const ds_tensor feat = ds_rows(d->seqs_feat, 0, rows);
    be->ops->copy(be, ds_cols(feat, 0, H), ds_rows(hidden, 0, rows));
    const int per = 32 / G > 0 ? 32 / G * G : G;
    for (int i = 0; i < rows; i += per) {
        const int m = rows - i < per ? rows - i : per;
        be->ops->linear(be, ds_rows(d->seqs_conf, i, m), ds_rows(ds_cols(feat, 0, F), i, m), d->conf_w, d->conf_b);
    }
    float conf[DS_MARKOV_SEQS_MAX * DS_MAX_GAMMA];
    be->ops->download(be, ds_rows(d->seqs_conf, 0, rows), conf);
    if (d->logits_bf16) ds_round_bf16_n(conf, (size_t)rows); /* the linear runs in bf16, then is cast to fp32 */
    for (int j = 0; j < n; j++) memcpy(out[j].conf_logit, conf + j * G, (size_t)G * sizeof *conf);
}

bool ds_markov_chain_seqs(ds_drafter *d, ds_tensor hidden, ds_tensor logits, int n, const int32_t *anchors,
                          const ds_sampling *const *s, ds_rng *const *rng, ds_proposal *out) {
    ds_backend *be = d->be;
    const int G = d->gamma, H = d->hidden, r = d->markov_rank;
    if (n < 1 || n > DS_MARKOV_SEQS_MAX || d->markov != DS_MARKOV_VANILLA || d->keep_logits || !d->seqs_feat.data ||
        !d->mlogits.data)
        return false;
    const bool greedy = ds_sampling_greedy(s[0]);
    for (int j = 1; j < n; j++)
        if (ds_sampling_greedy(s[j]) != greedy) return false;
    const int rows = n * G;
    const ds_tensor emb = ds_cols(ds_rows(d->seqs_feat, 0, rows), H, r);
    int32_t tokens[DS_MARKOV_SEQS_MAX * DS_MAX_GAMMA];
    if (greedy) { /* ds_markov_walk_queue's walk, each sequence's queued after the last, one wait */
        if (!ds_spec(be)->markov_greedy_seqs ||
            !ds_spec(be)->markov_greedy_seqs(be, n, ds_rows(logits, 0, rows), d->markov_w1, d->markov_w2,
                                             walk_bound(d), d->logits_bf16, anchors, emb, tokens))
            return false;
    } else {
        if (!ds_spec(be)->markov_sample_seqs || !d->probs.data) return false;
        /* Each sequence's G uniforms, drawn as device_sample_chain draws them, from copies of the streams until
         * the backend takes the walk. */
        double u[DS_MARKOV_SEQS_MAX * DS_MAX_GAMMA];
        ds_rng moved[DS_MARKOV_SEQS_MAX];
        for (int j = 0; j < n; j++) {
            moved[j] = *rng[j];
            for (int k = 0; k < G; k++) u[j * G + k] = ds_rng_uniform(&moved[j]);
        }
        if (!ds_spec(be)->markov_sample_seqs(be, n, ds_rows(logits, 0, rows), d->markov_w1, d->markov_w2,
                                             d->logits_bf16, anchors, s, u, emb, tokens))
            return false;
        for (int j = 0; j < n; j++) *rng[j] = moved[j];
    }
    for (int j = 0; j < n; j++) {
        memcpy(out[j].tokens, tokens + j * G, (size_t)G * sizeof *tokens);
        out[j].logits = NULL;
        out[j].probs = NULL;
        out[j].probs_dev = greedy ? ds_no_tensor() : ds_rows(logits, (int64_t)j * G, G);
    }
    if (d->confidence) confidence_seqs(d, hidden, n, out);
    return true;
}
