/* Qwen3ForCausalLM: pre-norm decoder, q/k RMSNorm per head before RoPE,
 * GQA, SwiGLU MLP, tied or untied LM head. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/qwen3.h"
#include "model/qwen3_layer.h"

typedef struct {
    ds_target base;
    ds_qwen3_config c;
    ds_tensor embed, final_norm, lm_head;
    ds_qwen3_stack st; /* layers + KV caches [cache_rows, kv_heads*head_dim] */
    ds_tensor x;                  /* residual stream [max_rows, hidden] */
    ds_qwen3_scratch s;
} qwen3_target;

static void qwen3_destroy(ds_target *t) {
    qwen3_target *q = (qwen3_target *)t;
    ds_backend *be = t->be;
    ds_qwen3_stack_release(be, &q->st);
    be->ops->release(be, &q->embed);
    be->ops->release(be, &q->final_norm);
    be->ops->release(be, &q->lm_head);
    be->ops->release(be, &q->x);
    ds_qwen3_scratch_release(be, &q->s);
    ds_qwen3_config_free(&q->c);
    free(q);
}

/* The decoder stack over rows ids[0..n) at positions pos (keys below
 * n_keys; through pages when paged), taps included; leaves the residual in
 * q->x rows 0..n-1. */
static ds_tensor qwen3_layers(qwen3_target *q, const int32_t *ids, int n, const int32_t *pos, int n_keys,
                              const ds_kv_pages *pages) {
    ds_target *t = &q->base;
    ds_backend *be = t->be;
    const ds_qwen3_config *c = &q->c;
    ds_tensor x = ds_rows(q->x, 0, n), xn = ds_rows(q->s.xn, 0, n);
    be->ops->embed(be, x, q->embed, ids, 1.0f);
    ds_target_tap(t, -1, x, n);
    ds_attn_params ap = {.n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                         .v_head_dim = c->head_dim, .n_keys = n_keys, .causal = true,
                         .scale = 1.0f / sqrtf((float)c->head_dim), .q_pos = pos, .pages = pages};
    for (int l = 0; l < c->n_layers; l++) {
        const ds_qwen3_layer *L = &q->st.layers[l];
        ds_qwen3_attention(be, c, L, x, xn, q->st.k[l], q->st.v[l], &q->s, &ap, ds_rows(q->s.attn, 0, n));
        ds_qwen3_output_and_mlp(be, c, L, x, &q->s, n);
        ds_target_tap(t, l, x, n);
    }
    return x;
}

static ds_error *qwen3_forward(ds_target *t, const int32_t *ids, int n, int pos0, int n_logits) {
    qwen3_target *q = (qwen3_target *)t;
    /* Positions (and the K/V rows written) from the step, as the ids: a
     * recording of this forward replays at any pos0. */
    const ds_tensor x = qwen3_layers(q, ids, n, t->step.pos, pos0 + n, NULL);
    ds_target_head(t, x, q->final_norm, q->c.eps, q->lm_head, n, n_logits);
    return NULL;
}

static ds_error *qwen3_forward_rows(ds_target *t, const ds_target_rows *b, const int32_t *ids) {
    qwen3_target *q = (qwen3_target *)t;
    int n_keys = 0;
    for (int i = 0; i < b->n; i++)
        if (b->pos[i] + 1 > n_keys) n_keys = b->pos[i] + 1;
    const ds_tensor x = qwen3_layers(q, ids, b->n, b->pos, n_keys, b->pages);
    ds_target_head_rows(t, x, q->final_norm, q->c.eps, q->lm_head, b->n, b->logit_rows, b->n_logits);
    return NULL;
}

static const ds_target_ops qwen3_ops = {.forward = qwen3_forward, .forward_rows = qwen3_forward_rows,
                                        .destroy = qwen3_destroy};

ds_error *ds_qwen3_open(ds_backend *be, ds_checkpoint *ck, const ds_target_opts *opts, ds_target **out) {
    qwen3_target *q = calloc(1, sizeof *q);
    if (!q) return ds_errorf("out of memory");
    ds_target *t = &q->base;
    ds_target_init_common(t, be, ck, opts);
    ds_qwen3_config *c = &q->c;
    ds_error *e = ds_qwen3_config_read(ck->config, ck->dir, c);
    if (!e) e = ds_qwen3_config_split(c, t->comm, ck->dir);
    if (!e) {
        t->ops = &qwen3_ops;
        t->model_type = "qwen3";
        t->vocab = c->vocab;
        t->hidden = c->hidden;
        t->n_layers = c->n_layers;
        ds_target_limit_ctx(t, c->max_pos);
        t->graph_safe = !t->comm; /* a collective waits on the host: no recording */
    }
    const int H = c->hidden;
    if (!e) e = ds_load_weight(be, ck, "model.embed_tokens.weight", c->vocab, H, &q->embed);
    if (!e) e = ds_load_vector(be, ck, "model.norm.weight", H, &q->final_norm);
    if (!e && t->comm) { /* vocabulary-parallel: this rank's rows of the LM head (of the embeddings when tied) */
        const ds_tp tp = {t->comm->rank, t->comm->world};
        e = ds_load_weight_split(be, ck, c->tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", c->vocab,
                                 H, tp, DS_SPLIT_ROWS, &q->st.keep, &q->lm_head);
    } else if (!e) {
        if (c->tie_embeddings) {
            q->lm_head = q->embed;
            q->lm_head.owned = false;
        } else {
            e = ds_load_weight(be, ck, "lm_head.weight", c->vocab, H, &q->lm_head);
        }
    }
    if (!e) e = ds_qwen3_stack_load(be, ck, "model.layers.", c, t->cache_rows, &q->st);
    t->logits_bf16 = !e && q->lm_head.dtype == DS_BF16;
    if (!e) e = be->ops->alloc(be, DS_F32, t->max_rows, H, &q->x);
    if (!e) e = ds_qwen3_scratch_alloc(be, c, t->max_rows, t->max_rows, &q->s);
    if (!e) e = be->ops->alloc(be, DS_F32, t->max_logit_rows, c->vocab, &t->logits);
    if (!e) e = be->ops->alloc(be, DS_F32, t->max_rows, H, &t->final_hidden);
    if (!e) e = ds_target_tp_alloc(t);
    if (e) {
        be->ops->release(be, &t->logits);
        be->ops->release(be, &t->final_hidden);
        qwen3_destroy(t);
        return e;
    }
    *out = t;
    return NULL;
}

ds_error *ds_qwen3_kv_row_bytes_of(const cJSON *cfg, const char *where, int64_t *out, int *max_ctx) {
    ds_qwen3_config c;
    DS_TRY(ds_qwen3_config_read(cfg, where, &c));
    *out = ds_qwen3_kv_row_bytes(&c);
    *max_ctx = c.max_pos;
    ds_qwen3_config_free(&c);
    return NULL;
}
