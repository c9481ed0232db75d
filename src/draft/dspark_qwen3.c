/* Qwen3DSparkModel backbone (DeepSpec qwen3/modeling.py): Qwen3 decoder
 * layers whose queries come from the block only and whose keys/values are
 * the cached context rows followed by the block's own rows; attention is
 * not causal. Context rows are projected from ctx = hidden_norm(fc(taps))
 * without the layer's input_layernorm, block rows from the normed block. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "draft/dspark_qwen3.h"
#include "model/qwen3_layer.h"

typedef struct {
    ds_drafter base;
    ds_qwen3_config c;
    ds_tensor final_norm;
    ds_qwen3_stack st; /* layers + K/V [max_ctx + gamma, kv]: context rows, then the block's */
    ds_tensor x;
    ds_tensor ctx_kv; /* [max_rows, 2 * layers * kv_dim]: every layer's context K and V before norm + RoPE */
    ds_qwen3_scratch s;
} qwen3_drafter;

static void qd_context(ds_drafter *d, ds_tensor ctx, const int32_t *pos) {
    qwen3_drafter *q = (qwen3_drafter *)d;
    ds_qwen3_stack_key_value(d->be, &q->c, &q->st, ctx, q->ctx_kv, pos, d->pages);
}

static void qd_block(ds_drafter *d, int rows, const int32_t *ids, const int32_t *pos, int n_keys, ds_tensor out) {
    qwen3_drafter *q = (qwen3_drafter *)d;
    ds_backend *be = d->be;
    const ds_qwen3_config *c = &q->c;
    ds_tensor x = ds_rows(q->x, 0, rows), xn = ds_rows(q->s.xn, 0, rows);
    ds_tensor attn = ds_rows(q->s.attn, 0, rows);
    be->ops->embed(be, x, d->embed, ids, 1.0f);
    ds_attn_params ap = {.n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                         .v_head_dim = c->head_dim, .n_keys = n_keys, .causal = false,
                         .scale = 1.0f / sqrtf((float)c->head_dim), .q_pos = pos, .pages = d->pages};
    for (int l = 0; l < c->n_layers; l++) {
        const ds_qwen3_layer *L = &q->st.layers[l];
        /* The block's K/V go right after the context rows and are overwritten next round. */
        ds_qwen3_attention(be, c, L, x, xn, q->st.k[l], q->st.v[l], &q->s, &ap, attn);
        ds_qwen3_output_and_mlp(be, c, L, x, &q->s, rows);
    }
    be->ops->rmsnorm(be, out, x, q->final_norm, c->hidden, c->eps);
}

/* Block buffers for block_rows rows, the context's K/V scratch for
 * ctx_rows: all allocated before any is given up, so a failure leaves the
 * old ones. */
static ds_error *qd_reserve(ds_drafter *d, int block_rows, int ctx_rows) {
    qwen3_drafter *q = (qwen3_drafter *)d;
    ds_backend *be = d->be;
    const ds_qwen3_config *c = &q->c;
    ds_tensor x = ds_no_tensor(), kv = ds_no_tensor();
    ds_qwen3_scratch s = {0};
    /* k / v scratch serve the block's rows; the context's go through ctx_kv. */
    ds_error *e = be->ops->alloc(be, DS_F32, block_rows, c->hidden, &x);
    if (!e) e = ds_qwen3_scratch_alloc(be, c, block_rows, block_rows, &s);
    if (!e) e = be->ops->alloc(be, DS_F32, ctx_rows, 2 * (int64_t)c->n_layers * c->n_kv_heads * c->head_dim, &kv);
    if (e) {
        be->ops->release(be, &x);
        be->ops->release(be, &kv);
        ds_qwen3_scratch_release(be, &s);
        return e;
    }
    be->ops->release(be, &q->x);
    be->ops->release(be, &q->ctx_kv);
    ds_qwen3_scratch_release(be, &q->s);
    q->x = x, q->ctx_kv = kv, q->s = s;
    return NULL;
}

static void qd_destroy(ds_drafter *d) {
    qwen3_drafter *q = (qwen3_drafter *)d;
    ds_backend *be = d->be;
    ds_qwen3_stack_release(be, &q->st);
    be->ops->release(be, &q->final_norm);
    be->ops->release(be, &q->x);
    be->ops->release(be, &q->ctx_kv);
    ds_qwen3_scratch_release(be, &q->s);
    ds_qwen3_config_free(&q->c);
    ds_drafter_release_common(d);
    free(q);
}

static const ds_drafter_ops qwen3_drafter_ops = {
    .context = qd_context, .block = qd_block, .reserve = qd_reserve, .destroy = qd_destroy};

ds_error *ds_dspark_qwen3_open(ds_backend *be, ds_checkpoint *ck, const ds_target *target, const ds_drafter_opts *opts,
                               ds_drafter **out) {
    qwen3_drafter *q = calloc(1, sizeof *q);
    if (!q) return ds_errorf("out of memory");
    ds_drafter *d = &q->base;
    d->ops = &qwen3_drafter_ops;
    d->be = be;
    d->ck = ck;
    d->arch = "Qwen3DSparkModel";
    d->max_rows = opts && opts->max_rows > 0 ? opts->max_rows : ds_backend_prefill_rows(be);
    ds_error *e = ds_qwen3_config_read(ck->config, ck->dir, &q->c);
    if (!e) e = ds_drafter_load_common(d, target);
    const ds_qwen3_config *c = &q->c;
    if (!e) e = ds_load_vector(be, ck, "norm.weight", c->hidden, &q->final_norm);
    d->cache_rows = opts && opts->cache_rows > 0 ? opts->cache_rows : d->max_ctx + d->gamma;
    d->paged = true;
    if (!e) e = ds_qwen3_stack_load(be, ck, "layers.", c, d->cache_rows, &q->st);
    /* Buffers sized by the config come after the weights have confirmed it
     * (a bogus intermediate_size must not allocate gigabytes first). */
    if (!e) e = qd_reserve(d, d->gamma, d->max_rows > d->gamma ? d->max_rows : d->gamma);
    d->graph_safe = !e;
    if (e) {
        qd_destroy(d);
        return e;
    }
    *out = d;
    return NULL;
}

ds_error *ds_dspark_qwen3_kv_row_bytes(const cJSON *cfg, const char *where, int64_t *out) {
    ds_qwen3_config c;
    DS_TRY(ds_qwen3_config_read(cfg, where, &c)); /* as ds_dspark_qwen3_open reads it */
    *out = ds_qwen3_kv_row_bytes(&c);
    ds_qwen3_config_free(&c);
    return NULL;
}
