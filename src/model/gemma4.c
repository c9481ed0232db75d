/* Gemma 4 text target (Gemma4ForCausalLM, or the text half of a top-level
 * gemma4 or gemma4_unified checkpoint: gemma4_layout.h): sliding/full
 * attention layers, sandwich norms × layer_scalar, soft-capped tied LM
 * head, and the E-series extras (per-layer inputs, KV sharing, double-wide
 * MLP).
 *
 * Sliding layers keep only a ring of window + max_rows K/V rows: a forward
 * writes at most max_rows new rows, so the oldest key its earliest query
 * still needs (window − 1 back) survives, and after a crop back into the
 * last forward the keys before the crop point are still there.
 *
 * The forward takes every per-step value from t->step (ids, positions, the
 * key count): K/V go to rows pos (mod the ring) through the store op, the
 * attentions find a ring row as position % ring on the backend, so a
 * recorded forward replays at any position (graph_safe). What the host
 * keeps about the ring (which position each row holds, to refuse a rewind
 * past it) and the per-layer input vocabulary check run before the step
 * (gemma4_prepare), never inside it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gemma4.h"
#include "model/gemma4_layer.h"
#include "model/gemma4_layout.h"
#include "model/kv_cache.h"
#include "model/qwen3_layer.h" /* ds_load_weight, ds_load_vector */

typedef struct {
    ds_target base;
    ds_gemma4_config c;
    ds_tensor embed, final_norm, lm_head;
    ds_tensor ple_embed, ple_model_proj, ple_proj_norm; /* per-layer inputs (c.ple_dim > 0) */
    float embed_scale, ple_embed_scale;
    ds_gemma4_stack st;           /* K/V rows: position, or position % ring for sliding layers */
    int *ring;                    /* per layer: ring size (0 = indexed by position) */
    int ring_size;                /* sliding layers' ring (0 = none: the context fits) */
    int32_t *ring_pos;            /* [ring_size]: the position each ring row holds (-1 = none) */
    ds_tensor x;                  /* residual stream [max_rows, hidden] */
    ds_tensor ple;                /* per-layer inputs [max_rows, n_layers*ple_dim] */
    ds_tensor ple_tok;            /* their token-embedding half, same shape */
    ds_gemma4_scratch s;
} gemma4_target;

static void gemma4_destroy(ds_target *t) {
    gemma4_target *g = (gemma4_target *)t;
    ds_backend *be = t->be;
    ds_gemma4_stack_release(be, &g->st);
    free(g->ring);
    free(g->ring_pos);
    ds_tensor *all[] = {&g->embed,          &g->final_norm,    &g->lm_head, &g->ple_embed,
                        &g->ple_model_proj, &g->ple_proj_norm, &g->x,       &g->ple,
                        &g->ple_tok};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->release(be, all[i]);
    ds_gemma4_scratch_release(be, &g->s);
    ds_gemma4_config_free(&g->c);
    free(g);
}

/* Per-layer inputs of every layer at once, [n, n_layers*ple_dim]:
 * (norm(proj(embeds) / sqrt(H)) + ple_embed[ids] * sqrt(P)) / sqrt(2). */
static void per_layer_inputs(gemma4_target *g, const int32_t *ids, ds_tensor x, int n) {
    ds_backend *be = g->base.be;
    const ds_gemma4_config *c = &g->c;
    ds_tensor ple = ds_rows(g->ple, 0, n), tok = ds_rows(g->ple_tok, 0, n);
    be->ops->embed(be, tok, g->ple_embed, ids, g->ple_embed_scale);
    be->ops->linear(be, ple, x, g->ple_model_proj, ds_no_tensor());
    be->ops->scale(be, ple, (float)pow((double)c->hidden, -0.5));
    be->ops->rmsnorm(be, ple, ple, g->ple_proj_norm, c->ple_dim, c->eps);
    be->ops->add(be, ple, ple, tok);
    be->ops->scale(be, ple, 0.70710678118654752f);
}

/* Every sliding-window key the call's first query needs must still be in
 * the ring (it is unless the cache was rewound further than one forward). */
static ds_error *check_ring(const gemma4_target *g, int pos0) {
    int lo = pos0 - g->c.window + 1;
    for (int p = lo > 0 ? lo : 0; p < pos0; p++)
        if (g->ring_pos[p % g->ring_size] != p)
            return ds_errorf("gemma4 sliding-window cache no longer holds position %d (rewound to %d, more than %d "
                             "rows back from the furthest position written)",
                             p, pos0, g->base.max_rows);
    return NULL;
}

/* Before the step (outside any region: host checks and bookkeeping): ids
 * in the per-layer input vocabulary, the ring still holding every key the
 * call's first query needs; then the ring rows the call writes are marked
 * as holding their positions. */
static ds_error *gemma4_prepare(ds_target *t, const int32_t *ids, int n, int pos0) {
    gemma4_target *g = (gemma4_target *)t;
    const ds_gemma4_config *c = &g->c;
    if (c->ple_dim && !ids && c->ple_vocab < t->vocab)
        return ds_errorf("token ids kept on the backend cannot be checked against the per-layer input vocabulary "
                         "(0..%d, smaller than the vocabulary's %d)", c->ple_vocab - 1, t->vocab);
    if (c->ple_dim && ids)
        for (int i = 0; i < n; i++)
            if (ids[i] >= c->ple_vocab)
                return ds_errorf("token id %d is outside the per-layer input vocabulary (0..%d)", ids[i],
                                 c->ple_vocab - 1);
    if (g->ring_size) {
        DS_TRY(check_ring(g, pos0));
        for (int i = 0; i < n; i++) g->ring_pos[(pos0 + i) % g->ring_size] = pos0 + i;
    }
    return NULL;
}

/* The decoder stack over ids[0..n) at positions pos (keys below n_keys;
 * through pages when paged), taps included; leaves the residual in g->x. */
static ds_tensor gemma4_layers(gemma4_target *g, const int32_t *ids, int n, const int32_t *pos, int n_keys,
                               const ds_kv_pages *pages) {
    ds_target *t = &g->base;
    ds_backend *be = t->be;
    const ds_gemma4_config *c = &g->c;
    ds_tensor x = ds_rows(g->x, 0, n);
    be->ops->embed(be, x, g->embed, ids, g->embed_scale);
    ds_target_tap(t, -1, x, n);
    if (c->ple_dim) per_layer_inputs(g, ids, x, n);
    for (int l = 0; l < c->n_layers; l++) {
        const ds_gemma4_layer *L = &g->st.layers[l];
        const int src = c->kv_source[l];
        const int64_t qd = (int64_t)c->n_heads * L->head_dim;
        ds_tensor q = ds_rows(ds_cols(g->s.q, 0, qd), 0, n), attn = ds_rows(ds_cols(g->s.attn, 0, qd), 0, n);
        ds_gemma4_attention_inputs(be, c, L, x, q, L->has_kv, g->st.k[l], g->st.v[l], g->ring[l], &g->s, pos, pages);
        const bool sliding = L->type == DS_G4_SLIDING;
        ds_attn_params ap = {.n_heads = c->n_heads,
                             .n_kv_heads = L->n_kv_heads,
                             .head_dim = L->head_dim,
                             .v_head_dim = L->head_dim,
                             .n_keys = n_keys,
                             .causal = true,
                             .window = sliding ? c->window : 0,
                             .ring_size = g->ring[src],
                             .scale = 1.0f,
                             .q_pos = pos,
                             .pages = pages};
        be->ops->attention(be, attn, q, g->st.k[src], g->st.v[src], &ap);
        ds_tensor ple =
            c->ple_dim ? ds_rows(ds_cols(g->ple, (int64_t)l * c->ple_dim, c->ple_dim), 0, n) : ds_no_tensor();
        ds_gemma4_output_and_mlp(be, c, L, x, &g->s, n, ple);
        ds_target_tap(t, l, x, n);
    }
    return x;
}

/* bf16 checkpoints: the reference's logits and its soft-cap are bf16
 * results (the head has rounded the logits already). */
static void softcap_logits(gemma4_target *g, int n_logits) {
    ds_target *t = &g->base;
    if (n_logits <= 0 || g->c.softcap <= 0) return;
    /* under tensor parallelism the rank's slice, before any gather (an element-wise cap) */
    ds_tensor lg = ds_rows(t->comm ? t->logits_local : t->logits, 0, n_logits);
    t->be->ops->softcap(t->be, lg, g->c.softcap);
    if (t->logits_bf16) t->be->ops->round_bf16(t->be, lg);
}

static ds_error *gemma4_forward(ds_target *t, const int32_t *ids, int n, int pos0, int n_logits) {
    gemma4_target *g = (gemma4_target *)t;
    /* Positions (and the K/V rows written) from the step, as the ids. */
    const ds_tensor x = gemma4_layers(g, ids, n, t->step.pos, pos0 + n, NULL);
    ds_target_head(t, x, g->final_norm, g->c.eps, g->lm_head, n, n_logits);
    softcap_logits(g, n_logits);
    return NULL;
}

/* Every layer reads its keys through the pages (a sliding layer's window
 * as a mask: no ring). */
static ds_error *gemma4_forward_rows(ds_target *t, const ds_target_rows *b, const int32_t *ids) {
    gemma4_target *g = (gemma4_target *)t;
    if (!t->paged_cache) return ds_errorf("gemma4: batched forwards need caches opened as a pool of pages");
    if (g->c.ple_dim)
        for (int i = 0; i < b->n; i++)
            if (ids[i] >= g->c.ple_vocab)
                return ds_errorf("token id %d is outside the per-layer input vocabulary (0..%d)", ids[i],
                                 g->c.ple_vocab - 1);
    int n_keys = 0;
    for (int i = 0; i < b->n; i++)
        if (b->pos[i] + 1 > n_keys) n_keys = b->pos[i] + 1;
    const ds_tensor x = gemma4_layers(g, ids, b->n, b->pos, n_keys, b->pages);
    ds_target_head_rows(t, x, g->final_norm, g->c.eps, g->lm_head, b->n, b->logit_rows, b->n_logits);
    softcap_logits(g, b->n_logits);
    return NULL;
}

static const ds_target_ops gemma4_ops = {.forward = gemma4_forward,
                                         .forward_rows = gemma4_forward_rows,
                                         .destroy = gemma4_destroy,
                                         .prepare = gemma4_prepare};

static ds_error *load_embeddings(gemma4_target *g, ds_checkpoint *ck) {
    ds_backend *be = g->base.be;
    const ds_gemma4_config *c = &g->c;
    const int H = c->hidden;
    DS_TRY(ds_load_weight(be, ck, "embed_tokens.weight", c->vocab, H, &g->embed));
    g->embed_scale = ds_gemma4_embed_scale(g->embed.dtype, H);
    DS_TRY(ds_load_vector(be, ck, "norm.weight", H, &g->final_norm));
    if (c->comm) { /* vocabulary-parallel: this rank's rows of the LM head (of the embeddings when tied) */
        const int64_t rows = c->vocab / c->comm->world, r0 = (int64_t)c->comm->rank * rows;
        const char *prefix = ck->name_prefix;
        if (!c->tie_embeddings) ck->name_prefix = ""; /* lm_head sits outside the text model's prefix */
        ds_error *e = ds_load_weight_rows(be, ck, c->tie_embeddings ? "embed_tokens.weight" : "lm_head.weight",
                                          c->vocab, H, r0, rows, &g->lm_head);
        ck->name_prefix = prefix;
        DS_TRY(e);
    } else if (c->tie_embeddings) {
        g->lm_head = g->embed;
        g->lm_head.owned = false;
    } else {
        /* lm_head sits outside the text model's prefix. */
        const char *prefix = ck->name_prefix;
        ck->name_prefix = "";
        ds_error *e = ds_load_weight(be, ck, "lm_head.weight", c->vocab, H, &g->lm_head);
        ck->name_prefix = prefix;
        DS_TRY(e);
    }
    if (c->ple_dim) {
        const int64_t all = (int64_t)c->n_layers * c->ple_dim;
        DS_TRY(ds_load_weight(be, ck, "embed_tokens_per_layer.weight", c->ple_vocab, all, &g->ple_embed));
        g->ple_embed_scale = ds_gemma4_embed_scale(g->ple_embed.dtype, c->ple_dim);
        DS_TRY(ds_load_weight(be, ck, "per_layer_model_projection.weight", all, H, &g->ple_model_proj));
        DS_TRY(ds_load_vector(be, ck, "per_layer_projection_norm.weight", c->ple_dim, &g->ple_proj_norm));
    }
    return NULL;
}

static ds_error *load_layers(gemma4_target *g, ds_checkpoint *ck) {
    ds_backend *be = g->base.be;
    const ds_gemma4_config *c = &g->c;
    const int max_rows = g->base.max_rows;
    /* A ring only pays off when the context is longer than it. */
    if (c->window + max_rows < g->base.max_ctx && !g->base.paged_cache) g->ring_size = c->window + max_rows;
    char prefix[64];
    for (int l = 0; l < c->n_layers; l++) {
        snprintf(prefix, sizeof prefix, "layers.%d.", l);
        ds_gemma4_layer *L = &g->st.layers[l];
        DS_TRY(ds_gemma4_layer_load(be, ck, prefix, c, l, &g->st.keep, L));
        if (!L->has_kv) continue;
        g->ring[l] = L->type == DS_G4_SLIDING ? g->ring_size : 0;
        DS_TRY(ds_gemma4_stack_cache(be, &g->st, l, g->ring[l] ? g->ring[l] : g->base.cache_rows, c->kv_dtype));
    }
    if (g->ring_size) {
        g->ring_pos = malloc((size_t)g->ring_size * sizeof *g->ring_pos);
        if (!g->ring_pos) return ds_errorf("out of memory");
        for (int i = 0; i < g->ring_size; i++) g->ring_pos[i] = -1;
    }
    return NULL;
}

static ds_error *gemma4_init(gemma4_target *g, ds_checkpoint *ck) {
    ds_target *t = &g->base;
    ds_backend *be = t->be;
    ds_gemma4_layout lay;
    DS_TRY(ds_gemma4_layout_read(ck->config, ck->dir, &lay));
    ds_gemma4_config *c = &g->c;
    DS_TRY(ds_gemma4_config_read_as(lay.text, ck->dir, true, lay.unified, c));
    DS_TRY(ds_kv_dtype_read(ck->config, lay.text, ck->dir, &c->kv_dtype)); /* a wrapper names it at its top */
    DS_TRY(ds_gemma4_config_split(c, t->comm, ck->dir));
    ck->name_prefix = lay.prefix;
    t->ops = &gemma4_ops;
    /* The family a drafter checks: the unified wrapper holds the same text model. */
    t->model_type = "gemma4_text";
    _Static_assert(DS_G4_MAX_PLACEHOLDERS <= DS_MAX_PLACEHOLDERS, "placeholder room");
    t->n_placeholders = lay.n_placeholders;
    memcpy(t->placeholders, lay.placeholder, sizeof lay.placeholder);
    memcpy(t->placeholder_field, lay.placeholder_field, sizeof lay.placeholder_field);
    t->pad_id = lay.pad_id;
    t->vocab = c->vocab;
    t->hidden = c->hidden;
    t->n_layers = c->n_layers;
    ds_target_limit_ctx(t, c->max_pos);
    DS_TRY(ds_gemma4_stack_init(&g->st, c->n_layers));
    g->ring = calloc((size_t)c->n_layers, sizeof *g->ring);
    if (!g->ring) return ds_errorf("out of memory");
    DS_TRY(load_embeddings(g, ck));
    t->logits_bf16 = g->lm_head.dtype == DS_BF16;
    DS_TRY(load_layers(g, ck));
    const int H = c->hidden;
    DS_TRY(be->ops->alloc(be, DS_F32, t->max_rows, H, &g->x));
    if (c->ple_dim) {
        DS_TRY(be->ops->alloc(be, DS_F32, t->max_rows, (int64_t)c->n_layers * c->ple_dim, &g->ple));
        DS_TRY(be->ops->alloc(be, DS_F32, t->max_rows, (int64_t)c->n_layers * c->ple_dim, &g->ple_tok));
    }
    DS_TRY(ds_gemma4_scratch_alloc(be, c, t->max_rows, t->max_rows, &g->s));
    DS_TRY(be->ops->alloc(be, DS_F32, t->max_logit_rows, c->vocab, &t->logits));
    DS_TRY(be->ops->alloc(be, DS_F32, t->max_rows, H, &t->final_hidden));
    DS_TRY(ds_target_tp_alloc(t));
    t->graph_safe = !t->comm; /* a collective waits on the host: no recording */
    return NULL;
}

ds_error *ds_gemma4_open(ds_backend *be, ds_checkpoint *ck, const ds_target_opts *opts, ds_target **out) {
    gemma4_target *g = calloc(1, sizeof *g);
    if (!g) return ds_errorf("out of memory");
    ds_target *t = &g->base;
    ds_target_init_common(t, be, ck, opts);
    const char *prefix = ck->name_prefix;
    ds_error *e = gemma4_init(g, ck);
    if (e) {
        ck->name_prefix = prefix; /* the caller still owns ck */
        be->ops->release(be, &t->logits);
        be->ops->release(be, &t->final_hidden);
        gemma4_destroy(t);
        return e;
    }
    *out = t;
    return NULL;
}

ds_error *ds_gemma4_kv_row_bytes_of(const cJSON *cfg, const char *where, int64_t *out, int *max_ctx) {
    ds_gemma4_layout lay;
    DS_TRY(ds_gemma4_layout_read(cfg, where, &lay));
    ds_gemma4_config c = {0};
    ds_error *e = ds_gemma4_config_read_as(lay.text, where, true, lay.unified, &c); /* as gemma4_init reads it */
    if (!e) e = ds_kv_dtype_read(cfg, lay.text, where, &c.kv_dtype);
    if (!e) *out = ds_gemma4_kv_row_bytes(&c), *max_ctx = c.max_pos;
    ds_gemma4_config_free(&c);
    return e;
}
