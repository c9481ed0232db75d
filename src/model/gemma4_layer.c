/* Gemma 4 decoder layer weights and compute (see gemma4_layer.h). */
#include "model/gemma4_layer.h"

#include <stdlib.h>

#include <stdio.h>

#include "model/kv_cache.h"
#include "model/qwen3_layer.h" /* ds_load_weight, ds_load_vector */

/* layer_scalar is a [1] buffer; the reference starts it at 1 when a
 * checkpoint lacks it. Read once on the host: it is a constant, not data
 * the backend computes with. */
static ds_error *read_layer_scalar(const ds_checkpoint *ck, const char *prefix, float *out) {
    char n[256];
    snprintf(n, sizeof n, "%slayer_scalar", prefix);
    *out = 1.0f;
    if (!ds_checkpoint_find(ck, n)) return NULL;
    const ds_st_tensor *t;
    int64_t one = 1;
    DS_TRY(ds_checkpoint_tensor(ck, n, 1, &one, &t));
    ds_to_f32(t->dtype, t->data, out, 1);
    return NULL;
}

ds_error *ds_gemma4_layer_load(ds_backend *be, const ds_checkpoint *ck, const char *prefix, const ds_gemma4_config *c,
                               int index, ds_shard_keep *keep, ds_gemma4_layer *L) {
    char n[256];
    *L = (ds_gemma4_layer){0};
    L->type = c->layer_type[index];
    const ds_gemma4_attn_geom *g = &c->geom[L->type];
    L->head_dim = g->head_dim;
    L->n_kv_heads = g->n_kv_heads;
    L->inv_freq = g->inv_freq;
    L->has_kv = c->kv_source[index] == index;
    L->has_v_proj = !(c->k_eq_v && L->type == DS_G4_FULL);
    /* The reference doubles the MLP only on KV-shared layers. */
    L->inter = c->inter * (c->double_wide && !L->has_kv ? 2 : 1);
    const int H = c->hidden, qd = c->n_heads * L->head_dim, kvd = L->n_kv_heads * L->head_dim;
    /* Tensor parallel: c holds this rank's heads, KV heads (from kv_first) and MLP width; the checkpoint's
     * tensors are the whole model's. */
    const int rank = c->comm ? c->comm->rank : 0, world = c->comm ? c->comm->world : 1;
    const int64_t q0 = (int64_t)rank * qd, kv0 = (int64_t)c->kv_first[L->type] * L->head_dim;
    const int64_t qd_all = (int64_t)c->n_heads_all * L->head_dim, kvd_all = (int64_t)c->kv_all[L->type] * L->head_dim;
    const int64_t inter_all = (int64_t)L->inter * world, i0 = (int64_t)rank * L->inter;
#define NAME(suffix) snprintf(n, sizeof n, "%s%s", prefix, suffix)
/* rows [first, first + r) of a [all, cols] weight (all == r: the whole) */
#define WR(field, suffix, r, cols, first, all)                                                                         \
    do {                                                                                                               \
        NAME(suffix);                                                                                                  \
        DS_TRY(!c->comm ? ds_load_weight(be, ck, n, r, cols, &L->field)                                               \
                        : ds_load_weight_rows(be, ck, n, all, cols, first, r, &L->field));                             \
    } while (0)
/* the rank's column slice of a row-parallel [rows, cols * world] weight */
#define WC(field, suffix, rows, cols)                                                                                  \
    do {                                                                                                               \
        NAME(suffix);                                                                                                  \
        DS_TRY(!c->comm ? ds_load_weight(be, ck, n, rows, cols, &L->field)                                            \
                        : ds_load_weight_split(be, ck, n, rows, (int64_t)(cols) * world,                               \
                                               (ds_tp){rank, world}, DS_SPLIT_COLS, keep, &L->field));               \
    } while (0)
#define W(field, suffix, r, cols) WR(field, suffix, r, cols, 0, r)
#define V(field, suffix, len)                                                                                          \
    do {                                                                                                               \
        NAME(suffix);                                                                                                  \
        DS_TRY(ds_load_vector(be, ck, n, len, &L->field));                                                             \
    } while (0)
#define VR(field, suffix, len, first, all)                                                                             \
    do {                                                                                                               \
        NAME(suffix);                                                                                                  \
        DS_TRY(!c->comm ? ds_load_vector(be, ck, n, len, &L->field)                                                   \
                        : ds_load_vector_range(be, ck, n, all, first, len, &L->field));                               \
    } while (0)
    V(in_norm, "input_layernorm.weight", H);
    V(post_attn_norm, "post_attention_layernorm.weight", H);
    V(pre_ff_norm, "pre_feedforward_layernorm.weight", H);
    V(post_ff_norm, "post_feedforward_layernorm.weight", H);
    V(q_norm, "self_attn.q_norm.weight", L->head_dim);
    WR(q_proj, "self_attn.q_proj.weight", qd, H, q0, qd_all);
    WC(o_proj, "self_attn.o_proj.weight", H, qd);
    if (c->attention_bias) {
        VR(q_bias, "self_attn.q_proj.bias", qd, q0, qd_all);
        if (rank == 0) V(o_bias, "self_attn.o_proj.bias", H); /* added once, by rank 0 */
    }
    if (L->has_kv) {
        V(k_norm, "self_attn.k_norm.weight", L->head_dim);
        WR(k_proj, "self_attn.k_proj.weight", kvd, H, kv0, kvd_all);
        if (c->attention_bias) VR(k_bias, "self_attn.k_proj.bias", kvd, kv0, kvd_all);
        if (L->has_v_proj) {
            WR(v_proj, "self_attn.v_proj.weight", kvd, H, kv0, kvd_all);
            if (c->attention_bias) VR(v_bias, "self_attn.v_proj.bias", kvd, kv0, kvd_all);
        }
    }
    WR(gate, "mlp.gate_proj.weight", L->inter, H, i0, inter_all);
    WR(up, "mlp.up_proj.weight", L->inter, H, i0, inter_all);
    WC(down, "mlp.down_proj.weight", H, L->inter);
    /* The projections one input meets, as rows of one matrix each (weights_join: a batch's QKV and gate/up one
     * GEMM each; the products are the same). */
    if (be->ops->weights_join) {
        if (L->has_kv)
            DS_TRY(be->ops->weights_join(be, L->has_v_proj ? 3 : 2,
                                         (ds_tensor *const[]){&L->q_proj, &L->k_proj, &L->v_proj}));
        DS_TRY(be->ops->weights_join(be, 2, (ds_tensor *const[]){&L->gate, &L->up}));
    }
    if (c->ple_dim) {
        W(ple_gate, "per_layer_input_gate.weight", c->ple_dim, H);
        W(ple_proj, "per_layer_projection.weight", H, c->ple_dim);
        V(ple_post_norm, "post_per_layer_input_norm.weight", H);
    }
#undef NAME
#undef WR
#undef WC
#undef VR
#undef W
#undef V
    return read_layer_scalar(ck, prefix, &L->layer_scalar);
}

void ds_gemma4_layer_release(ds_backend *be, ds_gemma4_layer *L) {
    ds_tensor *all[] = {&L->in_norm, &L->post_attn_norm, &L->pre_ff_norm, &L->post_ff_norm, &L->q_norm,
                        &L->k_norm,  &L->q_proj,         &L->k_proj,      &L->v_proj,       &L->o_proj,
                        &L->q_bias,  &L->k_bias,         &L->v_bias,      &L->o_bias,       &L->gate,
                        &L->up,      &L->down,           &L->ple_gate,    &L->ple_proj,     &L->ple_post_norm};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->release(be, all[i]);
}

ds_error *ds_gemma4_stack_init(ds_gemma4_stack *st, int n) {
    *st = (ds_gemma4_stack){.n = n};
    st->layers = calloc((size_t)n, sizeof *st->layers);
    st->k = calloc((size_t)n, sizeof *st->k);
    st->v = calloc((size_t)n, sizeof *st->v);
    if (!st->layers || !st->k || !st->v) return ds_errorf("out of memory");
    return NULL;
}

ds_error *ds_gemma4_stack_cache(ds_backend *be, ds_gemma4_stack *st, int l, int64_t rows, ds_dtype dtype) {
    const int64_t kvd = (int64_t)st->layers[l].n_kv_heads * st->layers[l].head_dim;
    DS_TRY(be->ops->alloc(be, dtype, rows, kvd, &st->k[l]));
    return be->ops->alloc(be, dtype, rows, kvd, &st->v[l]);
}

int64_t ds_gemma4_kv_row_bytes(const ds_gemma4_config *c) {
    /* The layers with K/V of their own (kv_source: KV-shared layers read an
     * earlier layer's), each at its type's geometry, K and V. */
    int64_t bytes = 0;
    for (int l = 0; l < c->n_layers && bytes <= DS_KV_ROW_BYTES_MAX; l++) {
        if (c->kv_source[l] != l) continue;
        const ds_gemma4_attn_geom *g = &c->geom[c->layer_type[l]];
        bytes += 2 * (int64_t)g->n_kv_heads * g->head_dim * (int64_t)ds_dtype_size(c->kv_dtype);
    }
    return bytes > DS_KV_ROW_BYTES_MAX ? DS_KV_ROW_BYTES_MAX + 1 : bytes;
}

void ds_gemma4_stack_release(ds_backend *be, ds_gemma4_stack *st) {
    for (int l = 0; st->layers && st->k && st->v && l < st->n; l++) {
        ds_gemma4_layer_release(be, &st->layers[l]);
        be->ops->release(be, &st->k[l]);
        be->ops->release(be, &st->v[l]);
    }
    free(st->layers);
    free(st->k);
    free(st->v);
    ds_shard_keep_free(&st->keep); /* after the weights that map them */
    *st = (ds_gemma4_stack){0};
}

ds_error *ds_gemma4_scratch_alloc(ds_backend *be, const ds_gemma4_config *c, int rows, int kv_rows,
                                  ds_gemma4_scratch *s) {
    *s = (ds_gemma4_scratch){0};
    int hd = 0;
    int64_t kvd = 0;
    for (int t = 0; t < DS_G4_N_TYPES; t++) {
        const ds_gemma4_attn_geom *g = &c->geom[t];
        if (g->used && g->head_dim > hd) hd = g->head_dim;
        if (g->used && (int64_t)g->n_kv_heads * g->head_dim > kvd) kvd = (int64_t)g->n_kv_heads * g->head_dim;
    }
    const int inter = c->inter * (c->double_wide ? 2 : 1);
    DS_TRY(be->ops->alloc(be, DS_F32, rows, c->hidden, &s->xn));
    DS_TRY(be->ops->alloc(be, DS_F32, rows, (int64_t)c->n_heads * hd, &s->q));
    DS_TRY(be->ops->alloc(be, DS_F32, rows, (int64_t)c->n_heads * hd, &s->attn));
    DS_TRY(be->ops->alloc(be, DS_F32, rows, c->hidden, &s->tmp));
    DS_TRY(be->ops->alloc(be, DS_F32, rows, inter, &s->gate));
    DS_TRY(be->ops->alloc(be, DS_F32, rows, inter, &s->up));
    if (c->ple_dim) DS_TRY(be->ops->alloc(be, DS_F32, rows, c->ple_dim, &s->ple));
    DS_TRY(be->ops->alloc(be, DS_F32, kv_rows, kvd, &s->k));
    DS_TRY(be->ops->alloc(be, DS_F32, kv_rows, kvd, &s->v));
    return NULL;
}

void ds_gemma4_scratch_release(ds_backend *be, ds_gemma4_scratch *s) {
    ds_tensor *all[] = {&s->xn, &s->q, &s->attn, &s->tmp, &s->gate, &s->up, &s->ple, &s->k, &s->v};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->release(be, all[i]);
}

void ds_gemma4_key_value(ds_backend *be, const ds_gemma4_config *c, const ds_gemma4_layer *L, ds_tensor x,
                         ds_tensor kc, ds_tensor vc, int ring, ds_gemma4_scratch *s, const int32_t *pos,
                         const ds_kv_pages *pages) {
    const int64_t kvd = (int64_t)L->n_kv_heads * L->head_dim;
    ds_tensor k = ds_rows(ds_cols(s->k, 0, kvd), 0, x.rows), v = ds_rows(ds_cols(s->v, 0, kvd), 0, x.rows);
    be->ops->linear(be, k, x, L->k_proj, L->k_bias);
    /* V is normalized without a scale and never rotated; with K = V it is
     * taken from the raw projection before k_norm touches it. */
    if (L->has_v_proj) be->ops->linear(be, v, x, L->v_proj, L->v_bias);
    be->ops->rmsnorm(be, v, L->has_v_proj ? v : k, ds_no_tensor(), L->head_dim, c->eps);
    /* k_norm then RoPE, and the K and V rows into their cache rows (one pass
     * where the backend fuses them; the CPU runs rmsnorm, rope, row copies). */
    ds_qk_norm_rope_store(be, ds_rows(k, 0, 0), ds_no_tensor(), k, L->k_norm, v, kc, vc, ring, L->head_dim, c->eps,
                          pos, L->inv_freq, pages);
}

void ds_gemma4_attention_inputs(ds_backend *be, const ds_gemma4_config *c, const ds_gemma4_layer *L, ds_tensor x,
                                ds_tensor q, bool kv, ds_tensor kc, ds_tensor vc, int ring, ds_gemma4_scratch *s,
                                const int32_t *pos, const ds_kv_pages *pages) {
    const int64_t kvd = (int64_t)L->n_kv_heads * L->head_dim;
    const ds_tensor xn = ds_rows(s->xn, 0, x.rows);
    if (!kv) { /* K/V shared from an earlier layer: q alone */
        ds_rmsnorm_linear_multi(be, 1, &q, x, L->in_norm, c->eps, &L->q_proj, &L->q_bias, xn);
        ds_rmsnorm_rope(be, q, L->q_norm, L->head_dim, c->eps, pos, L->inv_freq);
        return;
    }
    const ds_tensor k = ds_rows(ds_cols(s->k, 0, kvd), 0, x.rows), v = ds_rows(ds_cols(s->v, 0, kvd), 0, x.rows);
    const ds_tensor outs[3] = {q, k, v}, ws[3] = {L->q_proj, L->k_proj, L->v_proj};
    const ds_tensor bs[3] = {L->q_bias, L->k_bias, L->v_bias};
    ds_rmsnorm_linear_multi(be, L->has_v_proj ? 3 : 2, outs, x, L->in_norm, c->eps, ws, bs, xn);
    /* v_norm from the raw projection (k's before k_norm without a v_proj), as ds_gemma4_key_value */
    be->ops->rmsnorm(be, v, L->has_v_proj ? v : k, ds_no_tensor(), L->head_dim, c->eps);
    ds_qk_norm_rope_store(be, q, L->q_norm, k, L->k_norm, v, kc, vc, ring, L->head_dim, c->eps, pos, L->inv_freq,
                          pages);
}

void ds_gemma4_output_and_mlp(ds_backend *be, const ds_gemma4_config *c, const ds_gemma4_layer *L, ds_tensor x,
                              ds_gemma4_scratch *s, int rows, ds_tensor ple) {
    const int64_t qd = (int64_t)c->n_heads * L->head_dim;
    ds_tensor attn = ds_rows(ds_cols(s->attn, 0, qd), 0, rows), tmp = ds_rows(s->tmp, 0, rows);
    ds_tensor xn = ds_rows(s->xn, 0, rows);
    ds_tensor gate = ds_rows(ds_cols(s->gate, 0, L->inter), 0, rows),
              up = ds_rows(ds_cols(s->up, 0, L->inter), 0, rows);
    const bool with_ple = ple.data && L->ple_gate.data;
    be->ops->linear(be, tmp, attn, L->o_proj, L->o_bias);
    if (c->comm) c->comm->ops->all_reduce(c->comm, be, tmp); /* row-parallel: the ranks' partial sums */
    ds_rmsnorm_add(be, x, x, tmp, L->post_attn_norm, c->eps, 1.0f);
    /* pre_ff_norm, gate, up and GeGLU in one launch where the backend fuses them */
    ds_rmsnorm_linear_geglu(be, gate, x, L->pre_ff_norm, c->eps, L->gate, L->up, xn, up);
    be->ops->linear(be, tmp, gate, L->down, ds_no_tensor());
    if (c->comm) c->comm->ops->all_reduce(c->comm, be, tmp);
    /* the layer scalar with the last residual add (the same rounding as a separate scale) */
    ds_rmsnorm_add(be, x, x, tmp, L->post_ff_norm, c->eps, with_ple ? 1.0f : L->layer_scalar);
    if (with_ple) {
        ds_tensor t = ds_rows(s->ple, 0, rows);
        be->ops->linear(be, t, x, L->ple_gate, ds_no_tensor());
        be->ops->geglu_tanh(be, t, t, ple);
        be->ops->linear(be, tmp, t, L->ple_proj, ds_no_tensor());
        ds_rmsnorm_add(be, x, x, tmp, L->ple_post_norm, c->eps, L->layer_scalar);
    }
}
