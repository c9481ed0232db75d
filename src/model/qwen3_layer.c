#include "model/qwen3_layer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/config.h"
#include "model/kv_cache.h"

ds_error *ds_rope_default_inv_freq(const cJSON *cfg, const char *where, int head_dim, float **out) {
    double theta;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta")) {
        DS_TRY(ds_cfg_float(rp, where, "rope_theta", &theta));
        const char *type = ds_cfg_str(rp, "rope_type");
        if (type && strcmp(type, "default"))
            return ds_errorf("%s: rope_parameters.rope_type \"%s\" is not supported (default only)", where, type);
    } else {
        DS_TRY(ds_cfg_float_or(cfg, where, "rope_theta", 10000.0, &theta));
    }
    if (!(theta > 0)) return ds_errorf("%s: rope_theta %g is not positive", where, theta);
    float *f = malloc((size_t)(head_dim / 2) * sizeof *f);
    if (!f) return ds_errorf("out of memory");
    /* As transformers: 1 / theta^(arange(0, D, 2) / D), computed in fp32 from int64 steps. */
    for (int i = 0; i < head_dim / 2; i++) f[i] = (float)(1.0 / pow(theta, (double)(2 * i) / head_dim));
    *out = f;
    return NULL;
}

ds_error *ds_qwen3_config_read(const cJSON *cfg, const char *where, ds_qwen3_config *c) {
    int64_t v;
    double d;
    *c = (ds_qwen3_config){0};
    /* Sizes are checked before they narrow to int: 2^32 + 16 is not 16. */
#define IN_RANGE(name, dst)                           \
    if (v <= 0 || v > (1 << 30))                      \
        return ds_errorf("%s: config field %s = %lld is out of range", where, name, (long long)v); \
    dst = (int)v;
#define INT_FIELD(name, dst)                          \
    DS_TRY(ds_cfg_int(cfg, where, name, &v));         \
    IN_RANGE(name, dst)
#define OPT_INT_FIELD(name, def, dst)                 \
    DS_TRY(ds_cfg_int_or(cfg, where, name, def, &v)); \
    IN_RANGE(name, dst)
    INT_FIELD("vocab_size", c->vocab);
    INT_FIELD("hidden_size", c->hidden);
    INT_FIELD("num_hidden_layers", c->n_layers);
    INT_FIELD("num_attention_heads", c->n_heads);
    INT_FIELD("intermediate_size", c->inter);
    OPT_INT_FIELD("num_key_value_heads", c->n_heads, c->n_kv_heads);
    OPT_INT_FIELD("head_dim", c->hidden / c->n_heads, c->head_dim);
    OPT_INT_FIELD("max_position_embeddings", 32768, c->max_pos);
#undef OPT_INT_FIELD
#undef INT_FIELD
#undef IN_RANGE
    DS_TRY(ds_cfg_float_or(cfg, where, "rms_norm_eps", 1e-6, &d));
    c->eps = (float)d;
    DS_TRY(ds_cfg_bool_or(cfg, where, "attention_bias", false, &c->attention_bias));
    DS_TRY(ds_cfg_bool_or(cfg, where, "tie_word_embeddings", false, &c->tie_embeddings));
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return ds_errorf("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", where, c->n_heads,
                         c->n_kv_heads);
    if (c->head_dim <= 0 || c->head_dim % 2) return ds_errorf("%s: head_dim %d must be even", where, c->head_dim);
    if ((int64_t)c->n_heads * c->head_dim > (1 << 30)) /* the projections' widths, as int */
        return ds_errorf("%s: num_attention_heads %d x head_dim %d is out of range", where, c->n_heads, c->head_dim);
    const char *act = ds_cfg_str(cfg, "hidden_act");
    if (act && strcmp(act, "silu")) return ds_errorf("%s: hidden_act \"%s\" is not supported (silu)", where, act);
    DS_TRY(ds_kv_dtype_read(cfg, NULL, where, &c->kv_dtype));
    return ds_rope_default_inv_freq(cfg, where, c->head_dim, &c->inv_freq);
}

ds_error *ds_qwen3_config_split(ds_qwen3_config *c, ds_comm *comm, const char *where) {
    c->comm = comm;
    const int w = ds_qwen3_world(c);
    if (w == 1) return NULL;
    const struct {
        const char *field;
        int *v;
    } f[] = {{"num_attention_heads", &c->n_heads}, {"num_key_value_heads", &c->n_kv_heads},
             {"intermediate_size", &c->inter}, {"vocab_size", &c->vocab}};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (*f[i].v % w)
            return ds_errorf("%s: config field %s = %d does not divide among %d tensor-parallel ranks", where,
                             f[i].field, *f[i].v, w);
    c->n_heads /= w, c->n_kv_heads /= w, c->inter /= w; /* the vocabulary stays whole: the LM head splits it */
    return NULL;
}

void ds_qwen3_config_free(ds_qwen3_config *c) {
    free(c->inv_freq);
    c->inv_freq = NULL;
}

ds_error *ds_load_weight(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                         ds_tensor *out) {
    ds_quant_src q;
    DS_TRY(ds_checkpoint_quant(ck, name, rows, cols, &q));
    if (q.w) return ds_load_quant_weight(be, ck, &q, rows, cols, out);
    const ds_st_tensor *t;
    int64_t shape[2] = {rows, cols};
    DS_TRY(ds_checkpoint_tensor(ck, name, 2, shape, &t));
    return be->ops->weight(be, t, rows, cols, out);
}

ds_error *ds_load_vector(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t n, ds_tensor *out) {
    const ds_st_tensor *t;
    DS_TRY(ds_checkpoint_tensor(ck, name, 1, &n, &t));
    return be->ops->weight(be, t, 1, n, out);
}

ds_error *ds_qwen3_layer_load(ds_backend *be, const ds_checkpoint *ck, const char *prefix, const ds_qwen3_config *c,
                              ds_shard_keep *keep, ds_qwen3_layer *L) {
    char n[256];
    /* Under tensor parallelism c holds this rank's heads and MLP width; the checkpoint's tensors are w
     * times wider along the split dimension. */
    const int w = ds_qwen3_world(c);
    const ds_tp tp = {c->comm ? c->comm->rank : 0, w};
    const int H = c->hidden, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    *L = (ds_qwen3_layer){0};
#define W(field, suffix, r, cols, split)                                                                  \
    snprintf(n, sizeof n, "%s%s", prefix, suffix);                                                     \
    DS_TRY(w == 1 ? ds_load_weight(be, ck, n, r, cols, &L->field)                                      \
                  : ds_load_weight_split(be, ck, n, (split) == DS_SPLIT_ROWS ? (int64_t)(r) * w : (r), \
                                         (split) == DS_SPLIT_COLS ? (int64_t)(cols) * w : (cols), tp, split, keep, &L->field));
#define V(field, suffix, len) \
    snprintf(n, sizeof n, "%s%s", prefix, suffix); \
    DS_TRY(ds_load_vector(be, ck, n, len, &L->field));
#define VS(field, suffix, len) \
    snprintf(n, sizeof n, "%s%s", prefix, suffix); \
    DS_TRY(w == 1 ? ds_load_vector(be, ck, n, len, &L->field) : ds_load_vector_split(be, ck, n, (int64_t)(len) * w, tp, &L->field));
    V(in_norm, "input_layernorm.weight", H);
    V(post_norm, "post_attention_layernorm.weight", H);
    V(q_norm, "self_attn.q_norm.weight", c->head_dim);
    V(k_norm, "self_attn.k_norm.weight", c->head_dim);
    /* column-parallel: whole heads; row-parallel: o_proj and down, their partial sums all-reduced */
    W(q_proj, "self_attn.q_proj.weight", qd, H, DS_SPLIT_ROWS);
    W(k_proj, "self_attn.k_proj.weight", kvd, H, DS_SPLIT_ROWS);
    W(v_proj, "self_attn.v_proj.weight", kvd, H, DS_SPLIT_ROWS);
    W(o_proj, "self_attn.o_proj.weight", H, qd, DS_SPLIT_COLS);
    if (c->attention_bias) {
        VS(q_bias, "self_attn.q_proj.bias", qd);
        VS(k_bias, "self_attn.k_proj.bias", kvd);
        VS(v_bias, "self_attn.v_proj.bias", kvd);
        if (tp.rank == 0) { V(o_bias, "self_attn.o_proj.bias", H); } /* added once, by rank 0 */
    }
    W(gate, "mlp.gate_proj.weight", c->inter, H, DS_SPLIT_ROWS);
    W(up, "mlp.up_proj.weight", c->inter, H, DS_SPLIT_ROWS);
    W(down, "mlp.down_proj.weight", H, c->inter, DS_SPLIT_COLS);
    /* The projections one input meets, as rows of one matrix each: a batch's QKV and gate/up become one GEMM
     * each (weights_join; the products are the same). */
    if (be->ops->weights_join) {
        DS_TRY(be->ops->weights_join(be, 3, (ds_tensor *const[]){&L->q_proj, &L->k_proj, &L->v_proj}));
        DS_TRY(be->ops->weights_join(be, 2, (ds_tensor *const[]){&L->gate, &L->up}));
    }
#undef W
#undef V
#undef VS
    return NULL;
}

void ds_qwen3_layer_release(ds_backend *be, ds_qwen3_layer *L) {
    ds_tensor *all[] = {&L->in_norm, &L->post_norm, &L->q_norm, &L->k_norm, &L->q_proj, &L->k_proj, &L->v_proj,
                        &L->o_proj, &L->q_bias, &L->k_bias, &L->v_bias, &L->o_bias, &L->gate, &L->up, &L->down};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->release(be, all[i]);
}

ds_error *ds_qwen3_stack_load(ds_backend *be, const ds_checkpoint *ck, const char *prefix, const ds_qwen3_config *c,
                              int cache_rows, ds_qwen3_stack *st) {
    char name[128];
    /* A layer count the weights do not have is the config's error, named
     * before arrays of that many layers are allocated (found by
     * fuzz/fuzz_config: 1e9 layers ended in an allocator abort). */
    snprintf(name, sizeof name, "%s%d.input_layernorm.weight", prefix, c->n_layers - 1);
    if (c->n_layers < 1 || !ds_checkpoint_find(ck, name))
        return ds_errorf("%s: config field num_hidden_layers = %d, but the checkpoint has no %s%s", ck->dir,
                         c->n_layers, ck->name_prefix, name);
    st->n = c->n_layers;
    st->layers = calloc((size_t)st->n, sizeof *st->layers);
    st->k = calloc((size_t)st->n, sizeof *st->k);
    st->v = calloc((size_t)st->n, sizeof *st->v);
    if (!st->layers || !st->k || !st->v) return ds_errorf("out of memory");
    const int kvd = c->n_kv_heads * c->head_dim;
    for (int l = 0; l < st->n; l++) {
        snprintf(name, sizeof name, "%s%d.", prefix, l);
        DS_TRY(ds_qwen3_layer_load(be, ck, name, c, &st->keep, &st->layers[l]));
        DS_TRY(be->ops->alloc(be, c->kv_dtype, cache_rows, kvd, &st->k[l]));
        DS_TRY(be->ops->alloc(be, c->kv_dtype, cache_rows, kvd, &st->v[l]));
    }
    return NULL;
}

int64_t ds_qwen3_kv_row_bytes(const ds_qwen3_config *c) {
    /* What ds_qwen3_stack_load allocates a cache row: K and V in every layer
     * (a layer's at most 2^33 bytes: the config reader bounds heads x head_dim). */
    const int64_t layer = 2 * (int64_t)c->n_kv_heads * c->head_dim * (int64_t)ds_dtype_size(c->kv_dtype);
    return c->n_layers > DS_KV_ROW_BYTES_MAX / layer ? DS_KV_ROW_BYTES_MAX + 1 : c->n_layers * layer;
}

void ds_qwen3_stack_release(ds_backend *be, ds_qwen3_stack *st) {
    for (int l = 0; st->layers && l < st->n; l++) {
        ds_qwen3_layer_release(be, &st->layers[l]);
        be->ops->release(be, &st->k[l]);
        be->ops->release(be, &st->v[l]);
    }
    free(st->layers);
    free(st->k);
    free(st->v);
    ds_shard_keep_free(&st->keep); /* after the weights that map them */
    *st = (ds_qwen3_stack){0};
}

ds_error *ds_qwen3_scratch_alloc(ds_backend *be, const ds_qwen3_config *c, int rows, int kv_rows,
                                 ds_qwen3_scratch *s) {
    *s = (ds_qwen3_scratch){0};
    const int kvd = c->n_kv_heads * c->head_dim;
    DS_TRY(be->ops->alloc(be, DS_F32, rows, c->hidden, &s->xn));
    DS_TRY(be->ops->alloc(be, DS_F32, rows, c->n_heads * c->head_dim, &s->q));
    DS_TRY(be->ops->alloc(be, DS_F32, rows, c->n_heads * c->head_dim, &s->attn));
    DS_TRY(be->ops->alloc(be, DS_F32, rows, c->hidden, &s->tmp));
    DS_TRY(be->ops->alloc(be, DS_F32, rows, c->inter, &s->gate));
    DS_TRY(be->ops->alloc(be, DS_F32, rows, c->inter, &s->up));
    DS_TRY(be->ops->alloc(be, DS_F32, kv_rows, kvd, &s->k));
    DS_TRY(be->ops->alloc(be, DS_F32, kv_rows, kvd, &s->v));
    return NULL;
}

void ds_qwen3_scratch_release(ds_backend *be, ds_qwen3_scratch *s) {
    ds_tensor *all[] = {&s->xn, &s->q, &s->attn, &s->tmp, &s->gate, &s->up, &s->k, &s->v};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->release(be, all[i]);
}

void ds_qwen3_stack_key_value(ds_backend *be, const ds_qwen3_config *c, const ds_qwen3_stack *st, ds_tensor x,
                              ds_tensor kv, const int32_t *pos, const ds_kv_pages *pages) {
    const int kvd = c->n_kv_heads * c->head_dim, per_call = DS_LINEAR_MULTI_MAX / 2;
    for (int l0 = 0; l0 < st->n; l0 += per_call) {
        const int nl = st->n - l0 < per_call ? st->n - l0 : per_call;
        ds_tensor outs[DS_LINEAR_MULTI_MAX], ws[DS_LINEAR_MULTI_MAX], bs[DS_LINEAR_MULTI_MAX];
        for (int i = 0; i < nl; i++) {
            const ds_qwen3_layer *L = &st->layers[l0 + i];
            outs[2 * i] = ds_cols(ds_rows(kv, 0, x.rows), (int64_t)(2 * (l0 + i)) * kvd, kvd);
            outs[2 * i + 1] = ds_cols(ds_rows(kv, 0, x.rows), (int64_t)(2 * (l0 + i) + 1) * kvd, kvd);
            ws[2 * i] = L->k_proj, ws[2 * i + 1] = L->v_proj;
            bs[2 * i] = L->k_bias, bs[2 * i + 1] = L->v_bias;
        }
        ds_linear_multi(be, 2 * nl, outs, x, ws, bs);
    }
    /* the keys' norms, RoPE and the K/V stores of every layer: one launch on the GPU */
    enum { PER_CALL = 16 };
    for (int l0 = 0; l0 < st->n; l0 += PER_CALL) {
        const int nl = st->n - l0 < PER_CALL ? st->n - l0 : PER_CALL;
        ds_tensor k[PER_CALL], kw[PER_CALL], v[PER_CALL];
        for (int i = 0; i < nl; i++) {
            k[i] = ds_cols(ds_rows(kv, 0, x.rows), (int64_t)(2 * (l0 + i)) * kvd, kvd);
            v[i] = ds_cols(ds_rows(kv, 0, x.rows), (int64_t)(2 * (l0 + i) + 1) * kvd, kvd);
            kw[i] = st->layers[l0 + i].k_norm;
        }
        ds_key_norm_rope_store_layers(be, nl, k, kw, v, st->k + l0, st->v + l0, c->head_dim, c->eps, pos, c->inv_freq,
                                      pages);
    }
}

void ds_qwen3_attention(ds_backend *be, const ds_qwen3_config *c, const ds_qwen3_layer *L, ds_tensor x, ds_tensor xn,
                        ds_tensor kc, ds_tensor vc, ds_qwen3_scratch *s, const ds_attn_params *ap, ds_tensor attn) {
    ds_tensor q = ds_rows(s->q, 0, x.rows), k = ds_rows(s->k, 0, x.rows), v = ds_rows(s->v, 0, x.rows);
    const ds_tensor outs[3] = {q, k, v}, ws[3] = {L->q_proj, L->k_proj, L->v_proj};
    const ds_tensor bs[3] = {L->q_bias, L->k_bias, L->v_bias};
    ds_rmsnorm_linear_multi(be, 3, outs, x, L->in_norm, c->eps, ws, bs, xn);
    ds_qk_norm_rope_attention(be, attn, q, L->q_norm, k, L->k_norm, v, kc, vc, c->head_dim, c->eps, c->inv_freq, ap);
}

void ds_qwen3_output_and_mlp(ds_backend *be, const ds_qwen3_config *c, const ds_qwen3_layer *L, ds_tensor x,
                             ds_qwen3_scratch *s, int rows) {
    ds_tensor attn = ds_rows(s->attn, 0, rows), tmp = ds_rows(s->tmp, 0, rows), xn = ds_rows(s->xn, 0, rows);
    ds_tensor gate = ds_rows(s->gate, 0, rows), up = ds_rows(s->up, 0, rows);
    if (ds_qwen3_world(c) > 1) {
        /* Row-parallel o_proj and down: each rank's partial product, summed over the ranks, then the residual. */
        be->ops->linear(be, tmp, attn, L->o_proj, L->o_bias);
        c->comm->ops->all_reduce(c->comm, be, tmp);
        be->ops->add(be, x, x, tmp);
        ds_rmsnorm_linear_swiglu(be, gate, x, L->post_norm, c->eps, L->gate, L->up, xn, up);
        be->ops->linear(be, tmp, gate, L->down, ds_no_tensor());
        c->comm->ops->all_reduce(c->comm, be, tmp);
        be->ops->add(be, x, x, tmp);
        return;
    }
    ds_linear_residual(be, x, attn, L->o_proj, L->o_bias, x, tmp);
    ds_rmsnorm_linear_swiglu(be, gate, x, L->post_norm, c->eps, L->gate, L->up, xn, up);
    ds_linear_residual(be, x, gate, L->down, ds_no_tensor(), x, tmp);
}
