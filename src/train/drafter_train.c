/* The DSpark training step (drafter_train.h). The forward keeps what the
 * backward needs (every layer's inputs, normed activations, 1/rms values,
 * attention outputs and log-sum-exps); the backward walks it in reverse.
 * Logits exist a chunk of rows at a time (the vocabulary is wide), and the
 * loss op turns each chunk into its own gradient in place. */
#include "train/drafter_train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/config.h"
#include "model/qwen3_layer.h"

const ds_train_loss_recipe ds_train_loss_deepspec = {0.1f, 0.9f, 1.0f, 4.0f};
const ds_adamw ds_adamw_deepspec = {0.9f, 0.999f, 1e-8f, 0.0f};

/* Per layer, the trainable tensors in checkpoint order (drafter names after "layers.N."). */
enum { L_IN, L_Q, L_K, L_V, L_O, L_QN, L_KN, L_POST, L_GATE, L_UP, L_DOWN, L_COUNT };
static const char *const layer_names[L_COUNT] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
/* The tensors before and after the layers. */
enum { G_FC, G_HNORM, G_NORM, G_W1, G_W2, G_CW, G_CB, G_COUNT };
static const char *const global_names[G_COUNT] = {
    "fc.weight", "hidden_norm.weight", "norm.weight", "markov_head.markov_w1.weight",
    "markov_head.markov_w2.weight", "confidence_head.proj.weight", "confidence_head.proj.bias"};

typedef struct {
    char name[64];
    int ndim;
    int64_t shape[2], n, off; /* elements, offset into the flat arrays */
} tensor_slot;

struct ds_drafter_train {
    ds_train_dev *dev;
    const ds_train_ops *o;
    ds_drafter_train_shape sh;
    int n_tensors;
    tensor_slot *slots;
    int64_t n_params;
    float *P, *G, *M, *V; /* device: weights, gradients, AdamW moments (flat, slot order) */
    float *embed, *lm_head; /* device, frozen */
    float *inv_freq;        /* device [head_dim/2] */
    int64_t steps;
    cJSON *config; /* the drafter's config.json, written with every checkpoint */
    /* The step's workspace (device), grown to the largest batch seen. */
    void *ws;
    size_t ws_bytes;
};

/* Slot index of layer l's tensor k, or of global tensor g. Checkpoint order: fc, hidden_norm, layers,
 * norm, Markov, confidence. */
static int slot_layer(int l, int k) { return 2 + l * L_COUNT + k; }
static int slot_global(const ds_drafter_train *t, int g) {
    return g < G_NORM ? g : 2 + t->sh.n_layers * L_COUNT + (g - G_NORM);
}
static float *W(const ds_drafter_train *t, float *base, int slot) { return base + t->slots[slot].off; }

const ds_drafter_train_shape *ds_drafter_train_shape_of(const ds_drafter_train *t) { return &t->sh; }
int ds_drafter_train_n_tensors(const ds_drafter_train *t) { return t->n_tensors; }
const char *ds_drafter_train_tensor_name(const ds_drafter_train *t, int i) { return t->slots[i].name; }
int64_t ds_drafter_train_tensor_shape(const ds_drafter_train *t, int i, int *ndim, int64_t shape[2]) {
    *ndim = t->slots[i].ndim;
    shape[0] = t->slots[i].shape[0], shape[1] = t->slots[i].shape[1];
    return t->slots[i].n;
}
static float *array_of(const ds_drafter_train *t, ds_train_array a) {
    return a == DS_TRAIN_GRAD ? t->G : a == DS_TRAIN_ADAM_M ? t->M : a == DS_TRAIN_ADAM_V ? t->V : t->P;
}
void ds_drafter_train_get(const ds_drafter_train *t, int i, ds_train_array a, float *host) {
    t->o->download(t->dev, host, array_of(t, a) + t->slots[i].off, (size_t)t->slots[i].n * sizeof(float));
}
void ds_drafter_train_set(ds_drafter_train *t, int i, ds_train_array a, const float *host) {
    t->o->upload(t->dev, array_of(t, a) + t->slots[i].off, host, (size_t)t->slots[i].n * sizeof(float));
}
void ds_drafter_train_get_frozen(const ds_drafter_train *t, bool lm_head, float *host) {
    t->o->download(t->dev, host, lm_head ? t->lm_head : t->embed, (size_t)t->sh.vocab * t->sh.hidden * sizeof(float));
}
const cJSON *ds_drafter_train_config(const ds_drafter_train *t) { return t->config; }
int64_t ds_drafter_train_steps_taken(const ds_drafter_train *t) { return t->steps; }
void ds_drafter_train_set_steps(ds_drafter_train *t, int64_t steps) { t->steps = steps; }

void ds_drafter_train_free(ds_drafter_train *t) {
    if (!t) return;
    const ds_train_ops *o = t->o;
    void *bufs[] = {t->P, t->G, t->M, t->V, t->embed, t->lm_head, t->inv_freq, t->ws};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) o->free(t->dev, bufs[i]);
    free(t->slots);
    cJSON_Delete(t->config);
    free(t);
}

static ds_error *read_shape(const cJSON *cfg, const char *dir, ds_drafter_train_shape *sh) {
    ds_qwen3_config qc;
    DS_TRY(ds_qwen3_config_read(cfg, dir, &qc));
    sh->vocab = qc.vocab, sh->hidden = qc.hidden, sh->n_layers = qc.n_layers, sh->n_heads = qc.n_heads;
    sh->n_kv_heads = qc.n_kv_heads, sh->head_dim = qc.head_dim, sh->inter = qc.inter, sh->eps = qc.eps;
    const bool bias = qc.attention_bias;
    ds_qwen3_config_free(&qc);
    if (bias) return ds_errorf("%s: attention_bias: the trainer has no attention biases", dir);
    const char *arch = NULL;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    if (cJSON_IsArray(archs) && cJSON_GetArraySize(archs) > 0) arch = cJSON_GetStringValue(cJSON_GetArrayItem(archs, 0));
    if (!arch || strcmp(arch, "Qwen3DSparkModel"))
        return ds_errorf("%s: architectures[0] is \"%s\": the trainer trains Qwen3DSparkModel drafters", dir,
                         arch ? arch : "(none)");
    int64_t v;
    DS_TRY(ds_cfg_int(cfg, dir, "block_size", &v));
    if (v < 1 || v > 32) return ds_errorf("%s: block_size %lld is outside 1..32", dir, (long long)v);
    sh->gamma = (int)v;
    DS_TRY(ds_cfg_int(cfg, dir, "mask_token_id", &v));
    if (v < 0 || v >= sh->vocab) return ds_errorf("%s: mask_token_id %lld is outside the vocabulary", dir, (long long)v);
    sh->mask_id = (int)v;
    DS_TRY(ds_cfg_int_or(cfg, dir, "markov_rank", 0, &v));
    if (v < 1 || v > 4096) return ds_errorf("%s: markov_rank %lld: the trainer needs a Markov head (1..4096)", dir, (long long)v);
    sh->markov_rank = (int)v;
    const char *mt = ds_cfg_str(cfg, "markov_head_type");
    if (!mt || strcmp(mt, "vanilla"))
        return ds_errorf("%s: markov_head_type \"%s\": the trainer trains the vanilla Markov head", dir, mt ? mt : "(none)");
    bool conf, with_markov;
    DS_TRY(ds_cfg_bool_or(cfg, dir, "enable_confidence_head", false, &conf));
    if (!conf) return ds_errorf("%s: enable_confidence_head is false: the recipe trains a confidence head", dir);
    DS_TRY(ds_cfg_bool_or(cfg, dir, "confidence_head_with_markov", false, &with_markov));
    sh->conf_in = sh->hidden + (with_markov ? sh->markov_rank : 0);
    int64_t *taps = NULL;
    int n = 0;
    DS_TRY(ds_cfg_int_list(cfg, dir, "target_layer_ids", &taps, &n));
    if (n < 1 || n > 16) {
        free(taps);
        return ds_errorf("%s: target_layer_ids must list 1..16 layers", dir);
    }
    sh->n_taps = n;
    for (int i = 0; i < n; i++) sh->tap_layers[i] = (int)taps[i];
    free(taps);
    DS_TRY(ds_cfg_int_or(cfg, dir, "num_anchors", 0, &v));
    sh->num_anchors = v > 0 && v < 1 << 20 ? (int)v : 0;
    return NULL;
}

static void add_slot(ds_drafter_train *t, const char *name, int ndim, int64_t d0, int64_t d1) {
    tensor_slot *s = &t->slots[t->n_tensors++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ndim = ndim, s->shape[0] = d0, s->shape[1] = ndim == 2 ? d1 : 1;
    s->n = d0 * (ndim == 2 ? d1 : 1);
    s->off = t->n_params;
    t->n_params += s->n;
}

static ds_error *load_tensor(ds_drafter_train *t, const ds_checkpoint *ck, const char *name, int ndim,
                             const int64_t *shape, float *dst) {
    const ds_st_tensor *st;
    DS_TRY(ds_checkpoint_tensor(ck, name, ndim, shape, &st));
    if (st->dtype != DS_F32 && st->dtype != DS_BF16 && st->dtype != DS_F16)
        return ds_errorf("%s: tensor %s is %s (fp32, bf16 or f16 only)", ck->dir, name, ds_dtype_name(st->dtype));
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    float *host = malloc(n * sizeof *host);
    if (!host) return ds_errorf("%s: out of memory reading %s", ck->dir, name);
    ds_to_f32(st->dtype, st->data, host, n);
    t->o->upload(t->dev, dst, host, n * sizeof *host);
    free(host);
    return NULL;
}

/* The shapes, the slots and the device arrays of a drafter with config cfg (where: its path, for errors). */
static ds_error *layout(ds_drafter_train *t, const cJSON *cfg, const char *where) {
    DS_TRY(read_shape(cfg, where, &t->sh));
    t->config = cJSON_Duplicate(cfg, true);
    float *inv = NULL;
    DS_TRY(ds_rope_default_inv_freq(cfg, where, t->sh.head_dim, &inv));
    const ds_drafter_train_shape *s = &t->sh;
    const int H = s->hidden, qd = s->n_heads * s->head_dim, kvd = s->n_kv_heads * s->head_dim;
    t->slots = calloc((size_t)(G_COUNT + L_COUNT * s->n_layers), sizeof *t->slots);
    ds_error *e = t->slots && t->config ? NULL : ds_errorf("out of memory");
    if (!e) {
        add_slot(t, global_names[G_FC], 2, H, (int64_t)s->n_taps * H);
        add_slot(t, global_names[G_HNORM], 1, H, 0);
        for (int l = 0; l < s->n_layers; l++) {
            const int64_t shp[L_COUNT][2] = {{H, 0}, {qd, H}, {kvd, H}, {kvd, H}, {H, qd}, {s->head_dim, 0},
                                             {s->head_dim, 0}, {H, 0}, {s->inter, H}, {s->inter, H},
                                             {H, s->inter}};
            for (int k = 0; k < L_COUNT; k++) {
                char nm[64];
                snprintf(nm, sizeof nm, "layers.%d.%s", l, layer_names[k]);
                add_slot(t, nm, shp[k][1] ? 2 : 1, shp[k][0], shp[k][1]);
            }
        }
        add_slot(t, global_names[G_NORM], 1, H, 0);
        add_slot(t, global_names[G_W1], 2, s->vocab, s->markov_rank);
        add_slot(t, global_names[G_W2], 2, s->vocab, s->markov_rank);
        add_slot(t, global_names[G_CW], 2, 1, s->conf_in);
        add_slot(t, global_names[G_CB], 1, 1, 0);
    }
    const size_t pb = (size_t)t->n_params * sizeof(float), eb = (size_t)s->vocab * s->hidden * sizeof(float);
    if (!e) e = t->o->alloc(t->dev, pb, (void **)&t->P);
    if (!e) e = t->o->alloc(t->dev, pb, (void **)&t->G);
    if (!e) e = t->o->alloc(t->dev, pb, (void **)&t->M);
    if (!e) e = t->o->alloc(t->dev, pb, (void **)&t->V);
    if (!e) e = t->o->alloc(t->dev, eb, (void **)&t->embed);
    if (!e) e = t->o->alloc(t->dev, eb, (void **)&t->lm_head);
    if (!e) e = t->o->alloc(t->dev, (size_t)(s->head_dim / 2) * sizeof(float), (void **)&t->inv_freq);
    if (!e) t->o->upload(t->dev, t->inv_freq, inv, (size_t)(s->head_dim / 2) * sizeof(float));
    free(inv);
    return e;
}

/* embed_tokens and lm_head: a drafter's own, or a target's (DeepSpec copies the target's: its
 * model.embed_tokens.weight, and lm_head.weight unless the embeddings are tied). */
static ds_error *load_frozen(ds_drafter_train *t, const char *dir, bool target) {
    ds_checkpoint *ck = NULL;
    DS_TRY(ds_checkpoint_open(dir, &ck));
    const int64_t vh[2] = {t->sh.vocab, t->sh.hidden};
    const char *emb = target ? "model.embed_tokens.weight" : "embed_tokens.weight";
    const char *head = ds_checkpoint_find(ck, "lm_head.weight") || !target ? "lm_head.weight" : emb;
    ds_error *e = load_tensor(t, ck, emb, 2, vh, t->embed);
    if (!e) e = load_tensor(t, ck, head, 2, vh, t->lm_head);
    ds_checkpoint_close(ck);
    if (e && target) e = ds_error_wrap(e, "the target's embeddings and LM head (frozen in the drafter)");
    return e;
}

static ds_error *open_impl(ds_drafter_train *t, const char *dir, const char *target_dir) {
    ds_checkpoint *ck = NULL;
    DS_TRY(ds_checkpoint_open(dir, &ck));
    ds_error *e = layout(t, ck->config, dir);
    for (int i = 0; !e && i < t->n_tensors; i++) {
        const tensor_slot *sl = &t->slots[i];
        e = load_tensor(t, ck, sl->name, sl->ndim, sl->shape, t->P + sl->off);
    }
    ds_checkpoint_close(ck);
    if (!e) e = load_frozen(t, target_dir ? target_dir : dir, target_dir != NULL);
    return e;
}

/* N(0, std) by Box-Muller from the seeded stream. */
static float normal(ds_rng *r, float std) {
    const double u1 = (ds_rng_uniform(r) + 0x1p-54), u2 = ds_rng_uniform(r);
    return std * (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static ds_error *init_impl(ds_drafter_train *t, const char *config_path, const char *target_dir, uint64_t seed) {
    cJSON *cfg = NULL;
    DS_TRY(ds_read_json(config_path, &cfg));
    ds_error *e = layout(t, cfg, config_path);
    double std = 0.02;
    if (!e) e = ds_cfg_float_or(cfg, config_path, "initializer_range", 0.02, &std);
    cJSON_Delete(cfg);
    if (e) return e;
    if (!(std > 0 && std < 10)) return ds_errorf("%s: initializer_range %g is out of range", config_path, std);
    /* As transformers' _init_weights for these modules: Linear and Embedding weights N(0, initializer_range),
     * biases 0, RMSNorm weights 1. */
    float *host = malloc((size_t)t->n_params * sizeof *host);
    if (!host) return ds_errorf("out of memory");
    ds_rng rng;
    ds_rng_seed(&rng, seed);
    for (int i = 0; i < t->n_tensors; i++) {
        const tensor_slot *sl = &t->slots[i];
        const bool norm = strstr(sl->name, "norm.weight") != NULL, bias = strstr(sl->name, ".bias") != NULL;
        for (int64_t k = 0; k < sl->n; k++) host[sl->off + k] = norm ? 1.0f : bias ? 0.0f : normal(&rng, (float)std);
    }
    t->o->upload(t->dev, t->P, host, (size_t)t->n_params * sizeof *host);
    free(host);
    return load_frozen(t, target_dir, true);
}

static ds_error *make(ds_train_dev *dev, const char *path, const char *target_dir, bool init, uint64_t seed,
                      ds_drafter_train **out) {
    *out = NULL;
    ds_drafter_train *t = calloc(1, sizeof *t);
    if (!t) return ds_errorf("out of memory");
    t->dev = dev, t->o = dev->ops;
    ds_error *e = init ? init_impl(t, path, target_dir, seed) : open_impl(t, path, target_dir);
    if (e) {
        ds_drafter_train_free(t);
        return e;
    }
    *out = t;
    return NULL;
}

ds_error *ds_drafter_train_open(ds_train_dev *dev, const char *dir, const char *target_dir, ds_drafter_train **out) {
    return make(dev, dir, target_dir, false, 0, out);
}

ds_error *ds_drafter_train_init(ds_train_dev *dev, const char *config_path, const char *target_dir, uint64_t seed,
                                ds_drafter_train **out) {
    if (!target_dir) return ds_errorf("%s: a drafter trained from scratch needs the target (its embeddings)", config_path);
    return make(dev, config_path, target_dir, true, seed, out);
}

void ds_drafter_train_zero_grad(ds_drafter_train *t) { t->o->zero(t->dev, t->G, (size_t)t->n_params * sizeof(float)); }

double ds_drafter_train_grad_norm(ds_drafter_train *t) {
    /* torch's clip_grad_norm_: the norm of the per-tensor norms (the same number, summed per tensor) */
    double s = 0;
    for (int i = 0; i < t->n_tensors; i++) s += t->o->sumsq(t->dev, (size_t)t->slots[i].n, t->G + t->slots[i].off);
    return sqrt(s);
}

void ds_drafter_train_step(ds_drafter_train *t, const ds_adamw *opt, float lr, float clip) {
    t->steps++;
    const float bc1 = 1.0f - powf(opt->beta1, (float)t->steps), bc2 = 1.0f - powf(opt->beta2, (float)t->steps);
    for (int i = 0; i < t->n_tensors; i++) {
        const int64_t off = t->slots[i].off;
        t->o->adamw(t->dev, (size_t)t->slots[i].n, t->P + off, t->G + off, t->M + off, t->V + off, clip, lr,
                    opt->beta1, opt->beta2, opt->eps, opt->weight_decay, bc1, bc2);
    }
}

/* ---- the step ---- */

/* Workspace carving: every buffer of one step, in one allocation. */
typedef struct {
    char *base;
    size_t used;
} carve;
static void *take(carve *c, size_t bytes) {
    void *p = c->base ? c->base + c->used : NULL;
    c->used += (bytes + 255) & ~(size_t)255;
    return p;
}
#define TAKE_F(c, n) ((float *)take(c, (size_t)(n) * sizeof(float)))
#define TAKE_I(c, n) ((int32_t *)take(c, (size_t)(n) * sizeof(int32_t)))

typedef struct {
    float *h_in, *x, *x_rs, *qp, *q_rs, *q, *kcp, *kc_rs, *kc, *vc, *kbp, *kb_rs, *kb, *vb, *att, *lse;
    float *h1, *y, *y_rs, *gate, *up, *m;
} layer_acts;

typedef struct {
    /* the batch on the device */
    float *taps, *weight, *tgt_hidden;
    int32_t *ctx_start, *ctx_pos, *block_seq, *block_anchor, *ids, *pos, *labels, *prev;
    /* activations */
    float *ctx_pre, *ctx_rs, *ctx, *hL, *fin_rs, *hid, *w1p, *conf, *dconf, *ones, *Z, *T;
    layer_acts *L;
    /* gradients of activations */
    float *dh, *dx, *dy, *dgate, *dup, *dm, *datt, *dq, *dkb, *dvb, *dkc, *dvc, *dctx, *dctx_pre, *dw1p;
    int chunk;
} step_bufs;

static void plan(const ds_drafter_train *t, const ds_train_batch *b, carve *c, step_bufs *s, layer_acts *L) {
    const ds_drafter_train_shape *h = &t->sh;
    const int64_t Rc = ds_train_batch_ctx_rows(b), Rq = (int64_t)b->n_blocks * b->gamma;
    const int H = h->hidden, qd = h->n_heads * h->head_dim, kvd = h->n_kv_heads * h->head_dim, I = h->inter;
    const int T = h->n_taps * H, r = h->markov_rank, V = h->vocab;
    s->taps = TAKE_F(c, Rc * T);
    s->weight = TAKE_F(c, Rq);
    s->tgt_hidden = TAKE_F(c, Rq * H);
    s->ctx_start = TAKE_I(c, b->n_seqs + 1);
    s->ctx_pos = TAKE_I(c, Rc);
    s->block_seq = TAKE_I(c, b->n_blocks);
    s->block_anchor = TAKE_I(c, b->n_blocks);
    s->ids = TAKE_I(c, Rq), s->pos = TAKE_I(c, Rq), s->labels = TAKE_I(c, Rq), s->prev = TAKE_I(c, Rq);
    s->ctx_pre = TAKE_F(c, Rc * H), s->ctx_rs = TAKE_F(c, Rc), s->ctx = TAKE_F(c, Rc * H);
    for (int l = 0; l < h->n_layers; l++) {
        layer_acts *a = &L[l];
        a->h_in = TAKE_F(c, Rq * H), a->x = TAKE_F(c, Rq * H), a->x_rs = TAKE_F(c, Rq);
        a->qp = TAKE_F(c, Rq * qd), a->q_rs = TAKE_F(c, Rq * h->n_heads), a->q = TAKE_F(c, Rq * qd);
        a->kcp = TAKE_F(c, Rc * kvd), a->kc_rs = TAKE_F(c, Rc * h->n_kv_heads), a->kc = TAKE_F(c, Rc * kvd);
        a->vc = TAKE_F(c, Rc * kvd);
        a->kbp = TAKE_F(c, Rq * kvd), a->kb_rs = TAKE_F(c, Rq * h->n_kv_heads), a->kb = TAKE_F(c, Rq * kvd);
        a->vb = TAKE_F(c, Rq * kvd);
        a->att = TAKE_F(c, Rq * qd), a->lse = TAKE_F(c, Rq * h->n_heads);
        a->h1 = TAKE_F(c, Rq * H), a->y = TAKE_F(c, Rq * H), a->y_rs = TAKE_F(c, Rq);
        a->gate = TAKE_F(c, Rq * I), a->up = TAKE_F(c, Rq * I), a->m = TAKE_F(c, Rq * I);
    }
    s->L = L;
    s->hL = TAKE_F(c, Rq * H), s->fin_rs = TAKE_F(c, Rq), s->hid = TAKE_F(c, Rq * H);
    s->w1p = TAKE_F(c, Rq * r), s->conf = TAKE_F(c, Rq), s->dconf = TAKE_F(c, Rq), s->ones = TAKE_F(c, Rq);
    /* Logits a chunk of rows at a time: two [chunk, V] buffers of the device's logit_values together. */
    int64_t ch = t->o->logit_values / 2 / V;
    ch = ch < 1 ? 1 : ch > Rq ? Rq : ch;
    s->chunk = (int)(ch > 0 ? ch : 1);
    s->Z = TAKE_F(c, (int64_t)s->chunk * V), s->T = TAKE_F(c, (int64_t)s->chunk * V);
    s->dh = TAKE_F(c, Rq * H), s->dx = TAKE_F(c, Rq * H), s->dy = TAKE_F(c, Rq * H);
    s->dgate = TAKE_F(c, Rq * I), s->dup = TAKE_F(c, Rq * I), s->dm = TAKE_F(c, Rq * I);
    s->datt = TAKE_F(c, Rq * qd), s->dq = TAKE_F(c, Rq * qd);
    s->dkb = TAKE_F(c, Rq * kvd), s->dvb = TAKE_F(c, Rq * kvd);
    s->dkc = TAKE_F(c, Rc * kvd), s->dvc = TAKE_F(c, Rc * kvd);
    s->dctx = TAKE_F(c, Rc * H), s->dctx_pre = TAKE_F(c, Rc * H), s->dw1p = TAKE_F(c, Rq * r);
}

/* y[rows, out] = x[rows, in] W^T; accumulate: y += */
static void linear(const ds_drafter_train *t, int rows, int out, int in, const float *x, const float *w, float *y,
                   bool acc) {
    t->o->gemm(t->dev, false, true, rows, out, in, 1.0f, x, in, w, in, acc ? 1.0f : 0.0f, y, out);
}
/* The backward of linear: dx (= or +=) dy W; dW += dy^T x. */
static void linear_bwd(const ds_drafter_train *t, int rows, int out, int in, const float *x, const float *w,
                       const float *dy, float *dx, bool acc_dx, float *dw) {
    if (dx) t->o->gemm(t->dev, false, false, rows, in, out, 1.0f, dy, out, w, in, acc_dx ? 1.0f : 0.0f, dx, in);
    t->o->gemm(t->dev, true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in);
}

static ds_error *step(ds_drafter_train *t, const ds_train_batch *b, const ds_train_loss_recipe *rc, float scale,
                      bool backward, ds_train_loss *out) {
    memset(out, 0, sizeof *out);
    const ds_drafter_train_shape *h = &t->sh;
    const ds_train_ops *o = t->o;
    ds_train_dev *dev = t->dev;
    if (b->gamma != h->gamma || b->hidden != h->hidden || b->tap_width != h->n_taps * h->hidden)
        return ds_errorf("training batch: gamma %d, hidden %d, taps %d do not fit the drafter (%d, %d, %d)",
                         b->gamma, b->hidden, b->tap_width, h->gamma, h->hidden, h->n_taps * h->hidden);
    const int Rc = (int)ds_train_batch_ctx_rows(b), Rq = b->n_blocks * b->gamma;
    if (Rq == 0) return NULL;
    const int H = h->hidden, nh = h->n_heads, nkv = h->n_kv_heads, D = h->head_dim, qd = nh * D, kvd = nkv * D;
    const int I = h->inter, T = h->n_taps * H, r = h->markov_rank, V = h->vocab;

    layer_acts *L = calloc((size_t)h->n_layers, sizeof *L);
    if (!L) return ds_errorf("out of memory");
    step_bufs s;
    carve c = {0};
    plan(t, b, &c, &s, L);
    if (c.used > t->ws_bytes) {
        if (t->ws) o->free(dev, t->ws);
        t->ws = NULL, t->ws_bytes = 0;
        ds_error *e = o->alloc(dev, c.used, &t->ws);
        if (e) {
            free(L);
            return ds_error_wrap(e, "training step workspace (%d context rows, %d block rows)", Rc, Rq);
        }
        t->ws_bytes = c.used;
    }
    c = (carve){.base = t->ws};
    plan(t, b, &c, &s, L);

    /* The batch. */
    o->upload(dev, s.taps, b->taps, (size_t)Rc * T * sizeof(float));
    o->upload(dev, s.weight, b->weight, (size_t)Rq * sizeof(float));
    o->upload(dev, s.tgt_hidden, b->target_hidden, (size_t)Rq * H * sizeof(float));
    o->upload(dev, s.ctx_start, b->ctx_start, (size_t)(b->n_seqs + 1) * sizeof(int32_t));
    o->upload(dev, s.ctx_pos, b->ctx_pos, (size_t)Rc * sizeof(int32_t));
    o->upload(dev, s.block_seq, b->block_seq, (size_t)b->n_blocks * sizeof(int32_t));
    o->upload(dev, s.block_anchor, b->block_anchor, (size_t)b->n_blocks * sizeof(int32_t));
    o->upload(dev, s.ids, b->ids, (size_t)Rq * sizeof(int32_t));
    o->upload(dev, s.pos, b->pos, (size_t)Rq * sizeof(int32_t));
    o->upload(dev, s.labels, b->labels, (size_t)Rq * sizeof(int32_t));
    o->upload(dev, s.prev, b->prev, (size_t)Rq * sizeof(int32_t));
    double wsum = 0;
    for (int i = 0; i < Rq; i++) wsum += b->weight[i], out->rows += b->weight[i] > 0;
    float *ones = malloc((size_t)Rq * sizeof *ones);
    if (!ones) {
        free(L);
        return ds_errorf("out of memory");
    }
    for (int i = 0; i < Rq; i++) ones[i] = 1.0f;
    o->upload(dev, s.ones, ones, (size_t)Rq * sizeof(float));
    free(ones);
    int max_anchor = 0;
    for (int i = 0; i < b->n_blocks; i++) max_anchor = b->block_anchor[i] > max_anchor ? b->block_anchor[i] : max_anchor;
    const ds_train_attn at = {.n_blocks = b->n_blocks, .gamma = b->gamma, .n_seqs = b->n_seqs,
                              .n_ctx = Rc, .max_keys = max_anchor + b->gamma,
                              .seq = s.block_seq, .anchor = s.block_anchor, .ctx_start = s.ctx_start,
                              .n_heads = nh, .n_kv_heads = nkv, .head_dim = D, .scale = 1.0f / sqrtf((float)D)};

    /* ---- forward ---- */
    linear(t, Rc, H, T, s.taps, W(t, t->P, slot_global(t, G_FC)), s.ctx_pre, false);
    o->rmsnorm(dev, Rc, H, s.ctx_pre, W(t, t->P, slot_global(t, G_HNORM)), h->eps, s.ctx, s.ctx_rs);
    o->gather(dev, Rq, H, t->embed, s.ids, L[0].h_in);
    for (int l = 0; l < h->n_layers; l++) {
        layer_acts *a = &L[l];
#define PW(k) W(t, t->P, slot_layer(l, k))
        o->rmsnorm(dev, Rq, H, a->h_in, PW(L_IN), h->eps, a->x, a->x_rs);
        linear(t, Rq, qd, H, a->x, PW(L_Q), a->qp, false);
        o->rmsnorm(dev, Rq * nh, D, a->qp, PW(L_QN), h->eps, a->q, a->q_rs);
        o->rope(dev, Rq, nh, D, s.pos, t->inv_freq, a->q, false);
        linear(t, Rc, kvd, H, s.ctx, PW(L_K), a->kcp, false);
        o->rmsnorm(dev, Rc * nkv, D, a->kcp, PW(L_KN), h->eps, a->kc, a->kc_rs);
        o->rope(dev, Rc, nkv, D, s.ctx_pos, t->inv_freq, a->kc, false);
        linear(t, Rc, kvd, H, s.ctx, PW(L_V), a->vc, false);
        linear(t, Rq, kvd, H, a->x, PW(L_K), a->kbp, false);
        o->rmsnorm(dev, Rq * nkv, D, a->kbp, PW(L_KN), h->eps, a->kb, a->kb_rs);
        o->rope(dev, Rq, nkv, D, s.pos, t->inv_freq, a->kb, false);
        linear(t, Rq, kvd, H, a->x, PW(L_V), a->vb, false);
        o->attn(dev, &at, a->q, a->kc, a->vc, a->kb, a->vb, a->att, a->lse);
        o->zero(dev, a->h1, (size_t)Rq * H * sizeof(float)); /* h1 = h_in + o_proj(att) */
        o->axpy(dev, (size_t)Rq * H, 1.0f, a->h_in, a->h1);
        linear(t, Rq, H, qd, a->att, PW(L_O), a->h1, true);
        o->rmsnorm(dev, Rq, H, a->h1, PW(L_POST), h->eps, a->y, a->y_rs);
        linear(t, Rq, I, H, a->y, PW(L_GATE), a->gate, false);
        linear(t, Rq, I, H, a->y, PW(L_UP), a->up, false);
        o->swiglu(dev, (size_t)Rq * I, a->gate, a->up, a->m);
        float *next = l + 1 < h->n_layers ? L[l + 1].h_in : s.hL;
        o->zero(dev, next, (size_t)Rq * H * sizeof(float));
        o->axpy(dev, (size_t)Rq * H, 1.0f, a->h1, next);
        linear(t, Rq, H, I, a->m, PW(L_DOWN), next, true);
    }
    o->rmsnorm(dev, Rq, H, s.hL, W(t, t->P, slot_global(t, G_NORM)), h->eps, s.hid, s.fin_rs);

    /* ---- heads, loss and their backward, a chunk of rows at a time ---- */
    const float *w1 = W(t, t->P, slot_global(t, G_W1)), *w2 = W(t, t->P, slot_global(t, G_W2));
    const float *cw = W(t, t->P, slot_global(t, G_CW)), *cb = W(t, t->P, slot_global(t, G_CB));
    float *dw2 = W(t, t->G, slot_global(t, G_W2)), *dw1 = W(t, t->G, slot_global(t, G_W1));
    float *dcw = W(t, t->G, slot_global(t, G_CW)), *dcb = W(t, t->G, slot_global(t, G_CB));
    const bool conf_markov = h->conf_in > H;
    o->gather(dev, Rq, r, w1, s.prev, s.w1p);
    /* confidence logits: [hid ; w1p] . cw + cb */
    o->gemm(dev, false, true, Rq, 1, H, 1.0f, s.hid, H, cw, h->conf_in, 0.0f, s.conf, 1);
    if (conf_markov) o->gemm(dev, false, true, Rq, 1, r, 1.0f, s.w1p, r, cw + H, h->conf_in, 1.0f, s.conf, 1);
    o->gemm(dev, false, false, Rq, 1, 1, 1.0f, s.ones, 1, cb, 1, 1.0f, s.conf, 1);
    const float den = (float)(wsum + 1e-6);
    ds_train_terms terms = {0};
    for (int r0 = 0; r0 < Rq; r0 += s.chunk) {
        const int n = Rq - r0 < s.chunk ? Rq - r0 : s.chunk;
        linear(t, n, V, H, s.hid + (size_t)r0 * H, t->lm_head, s.Z, false);
        linear(t, n, V, r, s.w1p + (size_t)r0 * r, w2, s.Z, true);
        linear(t, n, V, H, s.tgt_hidden + (size_t)r0 * H, t->lm_head, s.T, false);
        o->dspark_loss(dev, n, V, s.Z, s.T, s.conf + r0, s.labels + r0, s.weight + r0, rc->alpha_ce * scale / den,
                       rc->alpha_l1 * scale / den, rc->alpha_conf * scale / den, s.dconf + r0, &terms);
        if (!backward) continue;
        /* dZ -> dhid (through the frozen LM head), dw1p, dW2 */
        o->gemm(dev, false, false, n, H, V, 1.0f, s.Z, V, t->lm_head, H, 0.0f, s.dh + (size_t)r0 * H, H);
        linear_bwd(t, n, V, r, s.w1p + (size_t)r0 * r, w2, s.Z, s.dw1p + (size_t)r0 * r, false, dw2);
    }
    out->weight_sum = wsum;
    out->ce = terms.ce / den, out->l1 = terms.l1 / den, out->conf = terms.conf / den;
    out->loss = rc->alpha_ce * out->ce + rc->alpha_l1 * out->l1 + rc->alpha_conf * out->conf;
    if (!backward) {
        free(L);
        return NULL;
    }
    /* the confidence head's backward */
    o->gemm(dev, false, false, Rq, H, 1, 1.0f, s.dconf, 1, cw, h->conf_in, 1.0f, s.dh, H);
    o->gemm(dev, true, false, 1, H, Rq, 1.0f, s.dconf, 1, s.hid, H, 1.0f, dcw, h->conf_in);
    if (conf_markov) {
        o->gemm(dev, false, false, Rq, r, 1, 1.0f, s.dconf, 1, cw + H, h->conf_in, 1.0f, s.dw1p, r);
        o->gemm(dev, true, false, 1, r, Rq, 1.0f, s.dconf, 1, s.w1p, r, 1.0f, dcw + H, h->conf_in);
    }
    o->gemm(dev, true, false, 1, 1, Rq, 1.0f, s.dconf, 1, s.ones, 1, 1.0f, dcb, 1);
    o->scatter_add(dev, Rq, r, s.dw1p, s.prev, dw1);

    /* ---- backward through the backbone (s.dh holds d(loss)/d(hid)) ---- */
    o->rmsnorm_bwd(dev, Rq, H, s.hL, W(t, t->P, slot_global(t, G_NORM)), s.fin_rs, s.dh, s.dx, false,
                   W(t, t->G, slot_global(t, G_NORM)));
    float *dh = s.dx; /* dh: d(loss)/d(the current layer's output) */
    o->zero(dev, s.dctx, (size_t)Rc * H * sizeof(float));
    for (int l = h->n_layers - 1; l >= 0; l--) {
        layer_acts *a = &L[l];
#define GW(k) W(t, t->G, slot_layer(l, k))
        /* MLP */
        linear_bwd(t, Rq, H, I, a->m, PW(L_DOWN), dh, s.dm, false, GW(L_DOWN));
        o->swiglu_bwd(dev, (size_t)Rq * I, a->gate, a->up, s.dm, s.dgate, s.dup);
        linear_bwd(t, Rq, I, H, a->y, PW(L_GATE), s.dgate, s.dy, false, GW(L_GATE));
        linear_bwd(t, Rq, I, H, a->y, PW(L_UP), s.dup, s.dy, true, GW(L_UP));
        o->rmsnorm_bwd(dev, Rq, H, a->h1, PW(L_POST), a->y_rs, s.dy, dh, true, GW(L_POST)); /* dh: d/d h1 */
        /* attention */
        linear_bwd(t, Rq, H, qd, a->att, PW(L_O), dh, s.datt, false, GW(L_O));
        o->attn_bwd(dev, &at, a->q, a->kc, a->vc, a->kb, a->vb, a->att, a->lse, s.datt, s.dq, s.dkc, s.dvc,
                    s.dkb, s.dvb);
        o->rope(dev, Rq, nh, D, s.pos, t->inv_freq, s.dq, true);
        o->rope(dev, Rq, nkv, D, s.pos, t->inv_freq, s.dkb, true);
        o->rope(dev, Rc, nkv, D, s.ctx_pos, t->inv_freq, s.dkc, true);
        /* norms' backward in place: q_pre's gradient into datt (free now), k's into dq-sized scratch */
        o->rmsnorm_bwd(dev, Rq * nh, D, a->qp, PW(L_QN), a->q_rs, s.dq, s.datt, false, GW(L_QN));
        o->rmsnorm_bwd(dev, Rq * nkv, D, a->kbp, PW(L_KN), a->kb_rs, s.dkb, s.dq, false, GW(L_KN));
        float *dkcp = s.dctx_pre; /* free until the end: scratch for the context keys' pre-norm gradient */
        o->rmsnorm_bwd(dev, Rc * nkv, D, a->kcp, PW(L_KN), a->kc_rs, s.dkc, dkcp, false, GW(L_KN));
        linear_bwd(t, Rq, qd, H, a->x, PW(L_Q), s.datt, s.dy, false, GW(L_Q));
        linear_bwd(t, Rq, kvd, H, a->x, PW(L_K), s.dq, s.dy, true, GW(L_K));
        linear_bwd(t, Rq, kvd, H, a->x, PW(L_V), s.dvb, s.dy, true, GW(L_V));
        linear_bwd(t, Rc, kvd, H, s.ctx, PW(L_K), dkcp, s.dctx, true, GW(L_K));
        linear_bwd(t, Rc, kvd, H, s.ctx, PW(L_V), s.dvc, s.dctx, true, GW(L_V));
        /* input norm: d h_in = d h1 + norm_bwd(dx) */
        o->rmsnorm_bwd(dev, Rq, H, a->h_in, PW(L_IN), a->x_rs, s.dy, dh, true, GW(L_IN));
#undef GW
#undef PW
    }
    /* the context projection */
    o->rmsnorm_bwd(dev, Rc, H, s.ctx_pre, W(t, t->P, slot_global(t, G_HNORM)), s.ctx_rs, s.dctx, s.dctx_pre, false,
                   W(t, t->G, slot_global(t, G_HNORM)));
    o->gemm(dev, true, false, H, T, Rc, 1.0f, s.dctx_pre, H, s.taps, T, 1.0f, W(t, t->G, slot_global(t, G_FC)), T);
    free(L);
    return NULL;
}

ds_error *ds_drafter_train_grad(ds_drafter_train *t, const ds_train_batch *b, const ds_train_loss_recipe *r,
                                float scale, ds_train_loss *out) {
    return step(t, b, r, scale, true, out);
}

ds_error *ds_drafter_train_eval(ds_drafter_train *t, const ds_train_batch *b, const ds_train_loss_recipe *r,
                                ds_train_loss *out) {
    return step(t, b, r, 1.0f, false, out);
}
