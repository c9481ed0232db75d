/* A Gemma 4 (text) decoder layer: config, weights, and the projection /
 * sandwich-norm code shared by the target (model/gemma4.c) and the Gemma4
 * DSpark drafter. They differ only in what the queries attend to.
 *
 * Layers come in two attention types with their own geometry: sliding
 * (head_dim, num_key_value_heads, default RoPE, windowed) and full
 * (global_head_dim, proportional RoPE, optionally K = V). */
#ifndef DS_GEMMA4_LAYER_H
#define DS_GEMMA4_LAYER_H

#include "backend/backend.h"
#include "backend/comm.h"
#include "io/checkpoint.h"
#include "model/tp_shard.h"

typedef enum { DS_G4_SLIDING = 0, DS_G4_FULL = 1, DS_G4_N_TYPES } ds_gemma4_type;

/* Geometry every layer of one attention type shares. */
typedef struct {
    bool used; /* some layer has this type */
    int head_dim, n_kv_heads;
    float *inv_freq; /* [head_dim/2], malloc'd when used */
} ds_gemma4_attn_geom;

typedef struct {
    int vocab, hidden, n_layers, n_heads, inter, max_pos;
    int window; /* sliding_window */
    float eps;
    float softcap; /* final_logit_softcapping; 0 = none */
    bool k_eq_v;   /* attention_k_eq_v: full layers have V = v_norm(k_proj(x)) */
    bool attention_bias, tie_embeddings, double_wide;
    int ple_dim, ple_vocab; /* per-layer inputs: hidden_size_per_layer_input (0 = none), its vocabulary */
    int n_kv_shared;        /* num_kv_shared_layers */
    ds_gemma4_attn_geom geom[DS_G4_N_TYPES];
    ds_gemma4_type *layer_type; /* [n_layers] */
    int *kv_source;             /* [n_layers]: the layer whose K/V layer l attends to (l unless KV-shared) */
    ds_dtype kv_dtype;          /* the K/V caches' (model/kv_cache.h); a wrapper's reader sets it from the top level */
    /* Tensor parallel (issue 43; NULL: the whole model): n_heads, inter and each geometry's n_kv_heads are this
     * rank's (ds_gemma4_config_split); kv_first[type] is the first KV head it holds (with fewer KV heads than
     * ranks, each rank holds the one KV head its query heads read: replicated); n_heads_all, inter_all,
     * kv_all[type] are the checkpoint's. */
    ds_comm *comm;
    int n_heads_all, inter_all, kv_first[DS_G4_N_TYPES], kv_all[DS_G4_N_TYPES];
} ds_gemma4_config;

typedef struct {
    ds_gemma4_type type;
    int head_dim, n_kv_heads, inter;
    const float *inv_freq; /* the config's table for this type */
    bool has_kv;           /* false for KV-shared layers: no k/v projections */
    bool has_v_proj;       /* false when V comes from k_proj (k_eq_v full layers) */
    float layer_scalar;
    ds_tensor in_norm, post_attn_norm, pre_ff_norm, post_ff_norm, q_norm, k_norm;
    ds_tensor q_proj, k_proj, v_proj, o_proj, q_bias, k_bias, v_bias, o_bias;
    ds_tensor gate, up, down;
    ds_tensor ple_gate, ple_proj, ple_post_norm; /* per-layer input block (ple_dim > 0) */
} ds_gemma4_layer;

/* The layers and their K/V caches, as the target and the drafter hold
 * them (a KV-shared layer has no cache of its own; a sliding layer's cache
 * may be a ring, so the rows are the holder's choice). */
typedef struct {
    int n;
    ds_gemma4_layer *layers;
    ds_tensor *k, *v;
    ds_shard_keep keep; /* host buffers behind column-split shards (tensor parallel) */
} ds_gemma4_stack;

/* Room for n layers (nothing loaded yet). */
ds_error *ds_gemma4_stack_init(ds_gemma4_stack *st, int n);
/* Allocates layer l's K and V caches: rows x its n_kv_heads * head_dim, in
 * dtype (the config's kv_dtype, model/kv_cache.h). */
ds_error *ds_gemma4_stack_cache(ds_backend *be, ds_gemma4_stack *st, int l, int64_t rows, ds_dtype dtype);
/* Bytes one position takes in the caches of every layer that has its own
 * K/V, each at full rows: a pool of pages (a single sequence's sliding
 * layers may keep a smaller ring instead). What a KV pool's budget is
 * divided by (above DS_KV_ROW_BYTES_MAX: that + 1). */
int64_t ds_gemma4_kv_row_bytes(const ds_gemma4_config *c);
void ds_gemma4_stack_release(ds_backend *be, ds_gemma4_stack *st);

/* Per-call scratch for up to `rows` rows, sized for the widest layer; k, v:
 * a call's new K/V rows before they go into the caches (kv_rows rows). */
typedef struct {
    ds_tensor xn, q, attn, tmp, gate, up, ple, k, v;
} ds_gemma4_scratch;

/* share_kv: honour num_kv_shared_layers (the target). A DSpark drafter
 * config inherits the target's value but its layers all own their K/V. */
ds_error *ds_gemma4_config_read(const cJSON *cfg, const char *where, bool share_kv, ds_gemma4_config *c);
/* As ds_gemma4_config_read, with the defaults of Gemma4UnifiedTextConfig when
 * unified (ds_gemma4_config_read takes that from cfg's own model_type, which
 * a text_config nested in a gemma4_unified config need not write). */
ds_error *ds_gemma4_config_read_as(const cJSON *cfg, const char *where, bool share_kv, bool unified,
                                   ds_gemma4_config *c);
void ds_gemma4_config_free(ds_gemma4_config *c);
/* This rank's share of c under comm (world > 1); errors name the field that does not divide. Per-layer
 * inputs (the E-series) are not split (an error). */
ds_error *ds_gemma4_config_split(ds_gemma4_config *c, ds_comm *comm, const char *where);
/* RoPE inverse frequencies of one layer type (rope_parameters.<type>, with
 * rope_type default or proportional) for a head of dimension head_dim. */
ds_error *ds_gemma4_inv_freq(const cJSON *cfg, const char *where, ds_gemma4_type type, int head_dim, float **out);
/* sqrt(n) rounded to the embedding weight's dtype, as the reference scales
 * embeddings (62.0 for n = 3840 in bf16). */
float ds_gemma4_embed_scale(ds_dtype weight_dtype, int n);

/* Loads layer `index` (prefix e.g. "layers.3.", relative to ck's name prefix). */
ds_error *ds_gemma4_layer_load(ds_backend *be, const ds_checkpoint *ck, const char *prefix, const ds_gemma4_config *c,
                               int index, ds_shard_keep *keep, ds_gemma4_layer *L);
void ds_gemma4_layer_release(ds_backend *be, ds_gemma4_layer *L);
ds_error *ds_gemma4_scratch_alloc(ds_backend *be, const ds_gemma4_config *c, int rows, int kv_rows,
                                  ds_gemma4_scratch *s);
void ds_gemma4_scratch_release(ds_backend *be, ds_gemma4_scratch *s);

/* k = rope(k_norm(k_proj(x))); v = v_norm(v_proj(x)), or v_norm(k_proj(x))
 * before k_norm when the layer has no v_proj, for the rows of x (through
 * s->k, s->v), written into rows pos[i] (pos[i] % ring when ring > 0) of
 * the caches kc, vc: whole cache tensors, the rows written are the
 * positions, read by the backend (qk_norm_rope_store), so a recorded step
 * replays at any position. Only for layers with has_kv. pages: paged
 * caches (rows through the pages, no ring), or NULL. */
void ds_gemma4_key_value(ds_backend *be, const ds_gemma4_config *c, const ds_gemma4_layer *L, ds_tensor x,
                         ds_tensor kc, ds_tensor vc, int ring, ds_gemma4_scratch *s, const int32_t *pos,
                         const ds_kv_pages *pages);
/* The attention's inputs from the layer's input x: xn = in_norm(x) (in
 * s->xn where the backend does not fuse it), q[M, heads*hd] =
 * rope(q_norm(q_proj(xn))) at pos and, with kv (the layer has its own K/V),
 * k and v of xn as ds_gemma4_key_value. Where the backend fuses them: the
 * norm and the q/k/v projections in one launch, q's and k's norms, RoPE and
 * the K/V store in another (each was its own launch: ~20 a layer). */
void ds_gemma4_attention_inputs(ds_backend *be, const ds_gemma4_config *c, const ds_gemma4_layer *L, ds_tensor x,
                                ds_tensor q, bool kv, ds_tensor kc, ds_tensor vc, int ring, ds_gemma4_scratch *s,
                                const int32_t *pos, const ds_kv_pages *pages);
/* The rest of the layer, given attn = attention output (rows of s->attn):
 * x += post_attn_norm(o_proj(attn)); x += post_ff_norm(mlp(pre_ff_norm(x)));
 * with per-layer inputs (ple: [rows, ple_dim] view, or no tensor)
 * x += post_ple_norm(ple_proj(gelu(ple_gate(x)) * ple)); then x *= layer_scalar. */
void ds_gemma4_output_and_mlp(ds_backend *be, const ds_gemma4_config *c, const ds_gemma4_layer *L, ds_tensor x,
                              ds_gemma4_scratch *s, int rows, ds_tensor ple);

#endif
