/* Gemma4DSparkModel backbone (DeepSpec gemma4/modeling.py): Gemma 4 decoder
 * layers (sandwich norms, × layer_scalar, attention scale 1.0, q/k norms and
 * a scale-free v_norm) whose queries come from the block only and whose
 * keys/values are the cached context rows followed by the block's own rows;
 * attention is not causal and has no window. Every layer has the
 * full-attention geometry: global_head_dim, num_global_key_value_heads with
 * attention_k_eq_v (V = v_norm of the raw k_proj output, never rotated), and
 * the full-attention proportional RoPE. Context rows are projected from
 * ctx = hidden_norm(fc(taps)) without the layer's input_layernorm, block
 * rows from the normed block. Block embeddings are scaled by sqrt(H) rounded
 * to the weight dtype; base logits are soft-capped (drafter.c). */
#include <stdio.h>
#include <stdlib.h>

#include "draft/dspark_gemma4.h"
#include "io/config.h"
#include "model/gemma4_layer.h"
#include "model/qwen3_layer.h" /* ds_load_vector */

typedef struct {
    ds_drafter base;
    ds_gemma4_config c;
    ds_tensor final_norm;
    ds_gemma4_stack st; /* K/V [max_ctx + gamma, kv]: context rows, then the block's */
    ds_tensor x;
    ds_gemma4_scratch s;
    float embed_scale;
} gemma4_drafter;

/* Graph-safe: the K/V rows written are the positions (read by the backend),
 * the ids and positions those of d->step. */
static void gd_context(ds_drafter *d, ds_tensor ctx, const int32_t *pos) {
    gemma4_drafter *g = (gemma4_drafter *)d;
    for (int l = 0; l < g->c.n_layers; l++)
        ds_gemma4_key_value(d->be, &g->c, &g->st.layers[l], ctx, g->st.k[l], g->st.v[l], 0, &g->s, pos,
                            d->pages);
}

static void gd_block(ds_drafter *d, int rows, const int32_t *ids, const int32_t *pos, int n_keys, ds_tensor out) {
    gemma4_drafter *g = (gemma4_drafter *)d;
    ds_backend *be = d->be;
    const ds_gemma4_config *c = &g->c;
    ds_tensor x = ds_rows(g->x, 0, rows);
    be->ops->embed(be, x, d->embed, ids, g->embed_scale);
    for (int l = 0; l < c->n_layers; l++) {
        const ds_gemma4_layer *L = &g->st.layers[l];
        const int64_t qd = (int64_t)c->n_heads * L->head_dim;
        ds_tensor q = ds_rows(ds_cols(g->s.q, 0, qd), 0, rows), attn = ds_rows(ds_cols(g->s.attn, 0, qd), 0, rows);
        ds_attn_params ap = {.n_heads = c->n_heads, .n_kv_heads = L->n_kv_heads, .head_dim = L->head_dim,
                             .v_head_dim = L->head_dim, .n_keys = n_keys, .causal = false,
                             .scale = 1.0f, .q_pos = pos, .pages = d->pages};
        /* The block's K/V go right after the context rows and are overwritten next round. */
        ds_gemma4_attention_inputs(be, c, L, x, q, true, g->st.k[l], g->st.v[l], 0, &g->s, pos, d->pages);
        be->ops->attention(be, attn, q, g->st.k[l], g->st.v[l], &ap);
        ds_gemma4_output_and_mlp(be, c, L, x, &g->s, rows, ds_no_tensor());
    }
    be->ops->rmsnorm(be, out, x, g->final_norm, c->hidden, c->eps);
}

/* Block buffers for block_rows rows (scratch sized for the widest MLP:
 * double_wide doubles it), K/V scratch for a context append of ctx_rows or
 * a block: all allocated before any is given up, so a failure leaves the
 * old ones. */
static ds_error *gd_reserve(ds_drafter *d, int block_rows, int ctx_rows) {
    gemma4_drafter *g = (gemma4_drafter *)d;
    ds_backend *be = d->be;
    ds_tensor x = ds_no_tensor();
    ds_gemma4_scratch s = {0};
    ds_error *e = be->ops->alloc(be, DS_F32, block_rows, g->c.hidden, &x);
    if (!e) e = ds_gemma4_scratch_alloc(be, &g->c, block_rows, ctx_rows > block_rows ? ctx_rows : block_rows, &s);
    if (e) {
        be->ops->release(be, &x);
        ds_gemma4_scratch_release(be, &s);
        return e;
    }
    be->ops->release(be, &g->x);
    ds_gemma4_scratch_release(be, &g->s);
    g->x = x, g->s = s;
    return NULL;
}

static void gd_destroy(ds_drafter *d) {
    gemma4_drafter *g = (gemma4_drafter *)d;
    ds_backend *be = d->be;
    ds_gemma4_stack_release(be, &g->st);
    be->ops->release(be, &g->final_norm);
    be->ops->release(be, &g->x);
    ds_gemma4_scratch_release(be, &g->s);
    ds_gemma4_config_free(&g->c);
    ds_drafter_release_common(d);
    free(g);
}

static const ds_drafter_ops gemma4_drafter_ops = {
    .context = gd_context, .block = gd_block, .reserve = gd_reserve, .destroy = gd_destroy};

/* What DeepSpec's Gemma4 drafter layer cannot be is refused by field name:
 * it asserts away per-layer inputs, and it builds every layer as a full
 * attention layer whatever layer_types says (its config writer lists them all
 * as full_attention), so a sliding entry means a config it did not write. */
static ds_error *check_drafter_config(const ds_gemma4_config *c, const char *dir) {
    if (c->ple_dim)
        return ds_errorf("%s: config field hidden_size_per_layer_input = %d (default 256 when absent): a "
                         "Gemma4DSparkModel drafter has no per-layer inputs (it must be 0)",
                         dir, c->ple_dim);
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_type[l] != DS_G4_FULL)
            return ds_errorf("%s: config field layer_types[%d] is sliding_attention: Gemma4DSparkModel drafter layers "
                             "are all full_attention",
                             dir, l);
    return NULL;
}

/* The reference builds each drafter MLP as the target's would be built at
 * that index: double-wide when use_double_wide_mlp and the index falls in the
 * last num_kv_shared_layers (inherited from the target) of the drafter's own
 * depth, although the drafter never shares K/V. */
static ds_error *load_layers(gemma4_drafter *g) {
    ds_drafter *d = &g->base;
    ds_backend *be = d->be;
    const ds_checkpoint *ck = d->ck;
    const ds_gemma4_config *c = &g->c;
    int64_t shared;
    DS_TRY(ds_cfg_int_or(ck->config, ck->dir, "num_kv_shared_layers", 0, &shared));
    const int64_t first_doubled = c->double_wide && shared > 0 ? c->n_layers - shared : c->n_layers;
    char prefix[64];
    for (int l = 0; l < c->n_layers; l++) {
        ds_gemma4_config lc = *c; /* shallow: only the MLP width differs */
        if (first_doubled > 0 && l >= first_doubled) lc.inter = 2 * c->inter;
        snprintf(prefix, sizeof prefix, "layers.%d.", l);
        DS_TRY(ds_gemma4_layer_load(be, ck, prefix, &lc, l, &g->st.keep, &g->st.layers[l]));
        DS_TRY(ds_gemma4_stack_cache(be, &g->st, l, d->cache_rows, g->c.kv_dtype));
    }
    return NULL;
}

static ds_error *gd_init(gemma4_drafter *g, const ds_target *target) {
    ds_drafter *d = &g->base;
    ds_backend *be = d->be;
    const ds_checkpoint *ck = d->ck;
    /* share_kv = false: the drafter's layers all own their K/V. */
    DS_TRY(ds_gemma4_config_read(ck->config, ck->dir, false, &g->c));
    const ds_gemma4_config *c = &g->c;
    DS_TRY(check_drafter_config(c, ck->dir));
    DS_TRY(ds_drafter_load_common(d, target));
    if (d->cache_rows <= 0) d->cache_rows = d->max_ctx + d->gamma;
    d->logit_softcap = c->softcap;
    g->embed_scale = ds_gemma4_embed_scale(d->embed.dtype, c->hidden);
    DS_TRY(ds_gemma4_stack_init(&g->st, c->n_layers));
    DS_TRY(ds_load_vector(be, ck, "norm.weight", c->hidden, &g->final_norm));
    DS_TRY(gd_reserve(d, d->gamma, d->max_rows));
    DS_TRY(load_layers(g));
    d->graph_safe = true;
    return NULL;
}

ds_error *ds_dspark_gemma4_open(ds_backend *be, ds_checkpoint *ck, const ds_target *target,
                                const ds_drafter_opts *opts, ds_drafter **out) {
    gemma4_drafter *g = calloc(1, sizeof *g);
    if (!g) return ds_errorf("out of memory");
    ds_drafter *d = &g->base;
    d->ops = &gemma4_drafter_ops;
    d->be = be;
    d->ck = ck;
    d->arch = "Gemma4DSparkModel";
    d->max_rows = opts && opts->max_rows > 0 ? opts->max_rows : ds_backend_prefill_rows(be);
    d->cache_rows = opts && opts->cache_rows > 0 ? opts->cache_rows : 0;
    d->paged = true;
    ds_error *e = gd_init(g, target);
    if (e) {
        gd_destroy(d);
        return e;
    }
    *out = d;
    return NULL;
}

ds_error *ds_dspark_gemma4_kv_row_bytes(const cJSON *cfg, const char *where, int64_t *out) {
    ds_gemma4_config c;
    /* share_kv = false, as gd_init reads it: every drafter layer owns its K/V. */
    ds_error *e = ds_gemma4_config_read(cfg, where, false, &c);
    if (!e) *out = ds_gemma4_kv_row_bytes(&c);
    ds_gemma4_config_free(&c);
    return e;
}
