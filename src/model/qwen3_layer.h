/* A Qwen3 decoder layer: the target's layers and the DSpark drafter's layers
 * share weights' names and the projection/MLP code here; they differ only in
 * what the queries attend to (model/qwen3.c, draft/dspark.c). */
#ifndef DS_QWEN3_LAYER_H
#define DS_QWEN3_LAYER_H

#include "backend/backend.h"
#include "backend/comm.h"
#include "model/tp_shard.h"
#include "io/checkpoint.h"

typedef struct {
    int vocab, hidden, n_layers, n_heads, n_kv_heads, head_dim, inter, max_pos;
    float eps;
    bool attention_bias, tie_embeddings;
    ds_dtype kv_dtype; /* the K/V caches' (model/kv_cache.h: the model's dtype) */
    float *inv_freq; /* [head_dim/2], malloc'd */
    /* Tensor parallel (issue 43): this rank's share; NULL or a world of 1: the whole model. With a comm,
     * n_heads, n_kv_heads and inter are the rank's (ds_qwen3_config_split), the layers' weights its shards,
     * and o_proj's and down's partial products meet in an all-reduce. */
    ds_comm *comm;
} ds_qwen3_config;

typedef struct {
    ds_tensor in_norm, post_norm, q_norm, k_norm;
    ds_tensor q_proj, k_proj, v_proj, o_proj, q_bias, k_bias, v_bias, o_bias;
    ds_tensor gate, up, down;
} ds_qwen3_layer;

/* A stack of layers with one KV cache per layer ([cache_rows, kv_heads *
 * head_dim], row = position): what the target and the drafter both hold. */
typedef struct {
    int n;
    ds_qwen3_layer *layers;
    ds_tensor *k, *v;
    ds_shard_keep keep; /* host buffers behind column-split shards (tensor parallel) */
} ds_qwen3_stack;

/* Loads layers "<prefix>N." for N < c->n_layers (prefix e.g. "model.layers."). */
ds_error *ds_qwen3_stack_load(ds_backend *be, const ds_checkpoint *ck, const char *prefix, const ds_qwen3_config *c,
                              int cache_rows, ds_qwen3_stack *st);
/* Bytes one cache row (one position) takes in such a stack's K/V caches,
 * every layer together: what a KV pool's budget is divided by (above
 * DS_KV_ROW_BYTES_MAX: that + 1). */
int64_t ds_qwen3_kv_row_bytes(const ds_qwen3_config *c);
void ds_qwen3_stack_release(ds_backend *be, ds_qwen3_stack *st);

/* Per-call scratch for rows rows; k, v: the new K/V rows before they go
 * into the caches (kv_rows rows). */
typedef struct {
    ds_tensor xn, q, attn, tmp, gate, up, k, v;
} ds_qwen3_scratch;

ds_error *ds_qwen3_config_read(const cJSON *cfg, const char *where, ds_qwen3_config *c);
/* This rank's share of c under comm (world > 1): heads, KV heads and the MLP width divided; an error
 * naming the field that does not divide. */
ds_error *ds_qwen3_config_split(ds_qwen3_config *c, ds_comm *comm, const char *where);
static inline int ds_qwen3_world(const ds_qwen3_config *c) { return c->comm ? c->comm->world : 1; }
void ds_qwen3_config_free(ds_qwen3_config *c);
/* RoPE inverse frequencies from rope_theta / rope_parameters (default type). */
ds_error *ds_rope_default_inv_freq(const cJSON *cfg, const char *where, int head_dim, float **out);

/* keep: where column-split shards' host buffers go (tensor parallel; unused with a world of 1). */
ds_error *ds_qwen3_layer_load(ds_backend *be, const ds_checkpoint *ck, const char *prefix, const ds_qwen3_config *c,
                              ds_shard_keep *keep, ds_qwen3_layer *L);
void ds_qwen3_layer_release(ds_backend *be, ds_qwen3_layer *L);
ds_error *ds_qwen3_scratch_alloc(ds_backend *be, const ds_qwen3_config *c, int rows, int kv_rows,
                                 ds_qwen3_scratch *s);
void ds_qwen3_scratch_release(ds_backend *be, ds_qwen3_scratch *s);

/* k = rope(k_norm(k_proj(x))), v = v_proj(x) for the rows of x, written
 * into rows pos[i] of every layer's caches (whole cache tensors: the rows
 * written are the positions, read by the backend, so a recorded step
 * replays at any position). For a DSpark drafter's context, where every
 * layer projects the same fused target features:
 * the layers' K and V projections batched into as few linear_multi calls as
 * DS_LINEAR_MULTI_MAX allows (one launch for 5 layers on the GPU instead of
 * 5, each too small to keep HBM busy), into kv ([>= x.rows, 2 * st->n *
 * kv_dim] scratch), then every layer's k norm + RoPE + store in one call
 * (key_norm_rope_store_layers: one launch on the GPU instead of 5).
 * pages: paged caches (the rows' positions through it), or NULL. */
void ds_qwen3_stack_key_value(ds_backend *be, const ds_qwen3_config *c, const ds_qwen3_stack *st, ds_tensor x,
                              ds_tensor kv, const int32_t *pos, const ds_kv_pages *pages);
/* The attention half up to o_proj: xn = input_layernorm(x) (xn: scratch,
 * unused where the backend fuses the norm), q = rope(q_norm(q_proj(xn))),
 * k and v as ds_qwen3_stack_key_value's into kc / vc at ap->q_pos, then
 * attn = attention(q, kc, vc, ap); the three projections in one pass, and
 * the norms, RoPE, store and attention in one, where the backend fuses
 * them. */
void ds_qwen3_attention(ds_backend *be, const ds_qwen3_config *c, const ds_qwen3_layer *L, ds_tensor x, ds_tensor xn,
                        ds_tensor kc, ds_tensor vc, ds_qwen3_scratch *s, const ds_attn_params *ap, ds_tensor attn);
/* x += o_proj(attn); x += down(silu(gate(n)) * up(n)), n = post_norm(x). */
void ds_qwen3_output_and_mlp(ds_backend *be, const ds_qwen3_config *c, const ds_qwen3_layer *L, ds_tensor x,
                             ds_qwen3_scratch *s, int rows);
/* Loads a weight of the given shape into a backend tensor; an affine-quantized
 * one (io/quant_checkpoint.h) stays quantized (ds_quant, model/quant_weight.c). */
ds_error *ds_load_weight(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                         ds_tensor *out);
/* As ds_load_weight, but a quantized weight is dequantized to fp32 at load
 * (heads whose ops read weights other than through linear / embed: the
 * Markov and confidence heads, which must stay exact on those values). */
ds_error *ds_load_weight_dense(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                               ds_tensor *out);
/* 1-D weight [n] (norms, biases): rows = 1. */
ds_error *ds_load_vector(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t n, ds_tensor *out);

/* q (from ds_checkpoint_quant) through the backend's weight_quant (model/quant_weight.c). */
ds_error *ds_load_quant_weight(ds_backend *be, const ds_checkpoint *ck, const ds_quant_src *q, int64_t rows,
                               int64_t cols, ds_tensor *out);

#endif
