/* Per-op GPU time for the CUDA backend (DS_CUDA_PROFILE=1): every op is
 * bracketed by two CUDA events, and at each synchronizing call the elapsed
 * times are summed per op name (and per narrow/wide call). The table goes
 * to stderr when the backend is destroyed. Kernel time per op plus the gaps
 * between them is what a decode step costs; the total "gpu busy" against
 * the wall time between the first and last event shows how launch-bound a
 * run is. Off by default: the events cost a little host time per op. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

#define PROF_PENDING 2048
#define PROF_NAMES 48

typedef struct {
    const char *name[PROF_NAMES];
    int calls[PROF_NAMES];
    double ms[PROF_NAMES];
    int n_names;
    cudaEvent_t ev[2 * PROF_PENDING];
    int pending_name[PROF_PENDING];
    int n_pending;
    cudaEvent_t first, last;
    bool have_first;
    const ds_backend_ops *inner;
} prof_state;

static prof_state *prof_of(ds_backend *be) { return (prof_state *)ds_cu(be)->profile; }

static int name_slot(prof_state *p, const char *name) {
    for (int i = 0; i < p->n_names; i++)
        if (!strcmp(p->name[i], name)) return i;
    if (p->n_names == PROF_NAMES) return PROF_NAMES - 1;
    p->name[p->n_names] = name;
    return p->n_names++;
}

/* Sums the pending pairs (waits for them). */
static void prof_flush(ds_backend *be) {
    prof_state *p = prof_of(be);
    if (!p->n_pending) return;
    cudaEventSynchronize(p->ev[2 * p->n_pending - 1]);
    for (int i = 0; i < p->n_pending; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]) == cudaSuccess) {
            p->ms[p->pending_name[i]] += ms;
            p->calls[p->pending_name[i]]++;
        }
    }
    cudaEventRecord(p->last, ds_cu(be)->stream);
    p->n_pending = 0;
}

static int prof_begin(ds_backend *be) {
    prof_state *p = prof_of(be);
    if (p->n_pending == PROF_PENDING) prof_flush(be);
    cudaStream_t st = ds_cu(be)->stream;
    if (!p->have_first) {
        cudaEventRecord(p->first, st);
        p->have_first = true;
    }
    cudaEventRecord(p->ev[2 * p->n_pending], st);
    return p->n_pending;
}

static void prof_end(ds_backend *be, int i, const char *name) {
    prof_state *p = prof_of(be);
    cudaEventRecord(p->ev[2 * i + 1], ds_cu(be)->stream);
    p->pending_name[i] = name_slot(p, name);
    p->n_pending = i + 1;
}

#define WIDE(m) ((m) > DS_CU_NARROW_M)
#define PROF(name, call)              \
    do {                              \
        const int i_ = prof_begin(be); \
        call;                         \
        prof_end(be, i_, name);       \
    } while (0)

static void p_upload(ds_backend *be, ds_tensor d, const float *s) { PROF("upload", prof_of(be)->inner->upload(be, d, s)); }
static void p_download(ds_backend *be, ds_tensor s, float *d) {
    PROF("download", prof_of(be)->inner->download(be, s, d));
    prof_flush(be);
}
static void p_copy(ds_backend *be, ds_tensor d, ds_tensor s) { PROF("copy", prof_of(be)->inner->copy(be, d, s)); }
static void p_embed(ds_backend *be, ds_tensor o, ds_tensor t, const int32_t *ids, float sc) {
    PROF("embed", prof_of(be)->inner->embed(be, o, t, ids, sc));
}
static void p_linear(ds_backend *be, ds_tensor o, ds_tensor x, ds_tensor w, ds_tensor b) {
    PROF(WIDE(x.rows) ? "linear (wide)" : "linear", prof_of(be)->inner->linear(be, o, x, w, b));
}
static void p_rmsnorm(ds_backend *be, ds_tensor o, ds_tensor x, ds_tensor w, int dim, float eps) {
    PROF("rmsnorm", prof_of(be)->inner->rmsnorm(be, o, x, w, dim, eps));
}
static void p_rope(ds_backend *be, ds_tensor x, int hd, const int32_t *pos, const float *f) {
    PROF("rope", prof_of(be)->inner->rope(be, x, hd, pos, f));
}
static void p_attention(ds_backend *be, ds_tensor o, ds_tensor q, ds_tensor k, ds_tensor v, const ds_attn_params *a) {
    PROF(WIDE(q.rows) ? "attention (wide)" : "attention", prof_of(be)->inner->attention(be, o, q, k, v, a));
}
static void p_add(ds_backend *be, ds_tensor o, ds_tensor a, ds_tensor b) { PROF("add", prof_of(be)->inner->add(be, o, a, b)); }
static void p_scale(ds_backend *be, ds_tensor x, float s) { PROF("scale", prof_of(be)->inner->scale(be, x, s)); }
static void p_swiglu(ds_backend *be, ds_tensor o, ds_tensor g, ds_tensor u) {
    PROF("swiglu", prof_of(be)->inner->swiglu(be, o, g, u));
}
static void p_geglu(ds_backend *be, ds_tensor o, ds_tensor g, ds_tensor u) {
    PROF("geglu_tanh", prof_of(be)->inner->geglu_tanh(be, o, g, u));
}
static void p_softcap(ds_backend *be, ds_tensor x, float c) { PROF("softcap", prof_of(be)->inner->softcap(be, x, c)); }
static void p_round(ds_backend *be, ds_tensor x) { PROF("round_bf16", prof_of(be)->inner->round_bf16(be, x)); }
static void p_argmax(ds_backend *be, ds_tensor x, int32_t *out) {
    PROF("argmax", prof_of(be)->inner->argmax(be, x, out));
    prof_flush(be);
}
static void p_linear_residual(ds_backend *be, ds_tensor o, ds_tensor x, ds_tensor w, ds_tensor b, ds_tensor r) {
    PROF(WIDE(x.rows) ? "linear_residual (wide)" : "linear_residual",
         prof_of(be)->inner->linear_residual(be, o, x, w, b, r));
}
static void p_linear_swiglu(ds_backend *be, ds_tensor o, ds_tensor x, ds_tensor g, ds_tensor u) {
    PROF(WIDE(x.rows) ? "linear_swiglu (wide)" : "linear_swiglu", prof_of(be)->inner->linear_swiglu(be, o, x, g, u));
}
static void p_linear_multi(ds_backend *be, int n, const ds_tensor *o, ds_tensor x, const ds_tensor *w,
                           const ds_tensor *b) {
    PROF(WIDE(x.rows) ? "linear_multi (wide)" : "linear_multi", prof_of(be)->inner->linear_multi(be, n, o, x, w, b));
}
static void p_rl_geglu(ds_backend *be, ds_tensor o, ds_tensor x, ds_tensor nw, float eps, ds_tensor g, ds_tensor u) {
    PROF(WIDE(x.rows) ? "rmsnorm_linear_geglu (wide)" : "rmsnorm_linear_geglu",
         prof_of(be)->inner->rmsnorm_linear_geglu(be, o, x, nw, eps, g, u));
}
static void p_rmsnorm_add(ds_backend *be, ds_tensor o, ds_tensor r, ds_tensor x, ds_tensor w, float eps, float sc) {
    PROF("rmsnorm_add", prof_of(be)->inner->rmsnorm_add(be, o, r, x, w, eps, sc));
}
static void p_rmsnorm_rope(ds_backend *be, ds_tensor x, ds_tensor w, int hd, float eps, const int32_t *pos,
                           const float *f) {
    PROF("rmsnorm_rope", prof_of(be)->inner->rmsnorm_rope(be, x, w, hd, eps, pos, f));
}
static void p_qk_norm_rope(ds_backend *be, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw, int hd, float eps,
                           const int32_t *pos, const float *f) {
    PROF("qk_norm_rope", prof_of(be)->inner->qk_norm_rope(be, q, qw, k, kw, hd, eps, pos, f));
}
static void p_qk_norm_rope_store(ds_backend *be, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw, ds_tensor v,
                                 ds_tensor kc, ds_tensor vc, int ring, int hd, float eps, const int32_t *pos,
                                 const float *f) {
    PROF("qk_norm_rope_store",
         prof_of(be)->inner->qk_norm_rope_store(be, q, qw, k, kw, v, kc, vc, ring, hd, eps, pos, f));
}
static void p_key_layers(ds_backend *be, int n, const ds_tensor *k, const ds_tensor *kw, const ds_tensor *v,
                         const ds_tensor *kc, const ds_tensor *vc, int hd, float eps, const int32_t *pos,
                         const float *f) {
    PROF("key_norm_rope_store_layers",
         prof_of(be)->inner->key_norm_rope_store_layers(be, n, k, kw, v, kc, vc, hd, eps, pos, f));
}
static void p_markov(ds_backend *be, ds_tensor b, ds_tensor o, ds_tensor w1, ds_tensor w2,
                     const ds_markov_bound *bnd, bool bf, int32_t a, ds_tensor e, int32_t *t) {
    PROF("markov_greedy", prof_of(be)->inner->spec->markov_greedy(be, b, o, w1, w2, bnd, bf, a, e, t));
    prof_flush(be);
}
static void p_markov_head(ds_backend *be, ds_tensor x, ds_tensor h, ds_tensor b, bool bf, ds_tensor w1, ds_tensor w2,
                          const ds_markov_bound *bnd, int32_t a, ds_tensor e, int32_t *t) {
    PROF("markov_greedy_head", prof_of(be)->inner->spec->markov_greedy_head(be, x, h, b, bf, w1, w2, bnd, a, e, t));
    prof_flush(be);
}
static void p_probs(ds_backend *be, ds_tensor o, ds_tensor l, const ds_sampling *s) {
    PROF("probs", prof_of(be)->inner->probs(be, o, l, s));
}
static void p_sample(ds_backend *be, ds_tensor p, const double *u, int32_t *out) {
    PROF("sample", prof_of(be)->inner->sample(be, p, u, out));
    prof_flush(be);
}
static void p_verify_sample(ds_backend *be, ds_tensor l, const int32_t *x, int n, ds_tensor pd, const ds_sampling *s,
                            const double *u, int32_t *out) {
    PROF("verify_sample", prof_of(be)->inner->spec->verify_sample(be, l, x, n, pd, s, u, out));
    prof_flush(be);
}
static void p_markov_sample(ds_backend *be, ds_tensor b, ds_tensor o, ds_tensor p, ds_tensor w1, ds_tensor w2, bool bf,
                            int32_t a, const ds_sampling *s, const double *u, ds_tensor e, int32_t *t) {
    PROF("markov_sample", prof_of(be)->inner->spec->markov_sample(be, b, o, p, w1, w2, bf, a, s, u, e, t));
    prof_flush(be);
}
static void p_verify_sample_many(ds_backend *be, int m, const ds_verify_job *jobs, int32_t *out) {
    PROF("verify_sample_many", prof_of(be)->inner->spec->verify_sample_many(be, m, jobs, out));
    prof_flush(be);
}
static bool p_markov_greedy_seqs(ds_backend *be, int n, ds_tensor b, ds_tensor w1, ds_tensor w2,
                                 const ds_markov_bound *bd, bool bf, const int32_t *a, ds_tensor e, int32_t *t) {
    bool done = false;
    PROF("markov_greedy_seqs", done = prof_of(be)->inner->spec->markov_greedy_seqs(be, n, b, w1, w2, bd, bf, a, e, t));
    prof_flush(be);
    return done;
}
static bool p_markov_sample_seqs(ds_backend *be, int n, ds_tensor b, ds_tensor w1, ds_tensor w2, bool bf,
                                 const int32_t *a, const ds_sampling *const *s, const double *u, ds_tensor e,
                                 int32_t *t) {
    bool done = false;
    PROF("markov_sample_seqs", done = prof_of(be)->inner->spec->markov_sample_seqs(be, n, b, w1, w2, bf, a, s, u, e, t));
    prof_flush(be);
    return done;
}
static void p_rl_multi(ds_backend *be, int n, const ds_tensor *o, ds_tensor x, ds_tensor nw, float eps,
                       const ds_tensor *w, const ds_tensor *b) {
    PROF(WIDE(x.rows) ? "rmsnorm_linear_multi (wide)" : "rmsnorm_linear_multi",
         prof_of(be)->inner->rmsnorm_linear_multi(be, n, o, x, nw, eps, w, b));
}
static void p_rl_swiglu(ds_backend *be, ds_tensor o, ds_tensor x, ds_tensor nw, float eps, ds_tensor g, ds_tensor u) {
    PROF(WIDE(x.rows) ? "rmsnorm_linear_swiglu (wide)" : "rmsnorm_linear_swiglu",
         prof_of(be)->inner->rmsnorm_linear_swiglu(be, o, x, nw, eps, g, u));
}
static ds_error *p_check(ds_backend *be) {
    ds_error *e = prof_of(be)->inner->check(be);
    prof_flush(be);
    return e;
}

static void p_destroy(ds_backend *be) {
    prof_state *p = prof_of(be);
    prof_flush(be);
    float wall = 0;
    if (p->have_first) cudaEventElapsedTime(&wall, p->first, p->last);
    double busy = 0;
    for (int i = 0; i < p->n_names; i++) busy += p->ms[i];
    fprintf(stderr, "dspark cuda profile (DS_CUDA_PROFILE): %.1f ms in ops, %.1f ms from the first op to the last sync\n",
            busy, wall);
    fprintf(stderr, "  %-30s %8s %10s %9s %6s\n", "op", "calls", "total ms", "mean us", "share");
    for (int i = 0; i < p->n_names; i++)
        fprintf(stderr, "  %-30s %8d %10.2f %9.1f %5.1f%%\n", p->name[i], p->calls[i], p->ms[i],
                p->calls[i] ? 1e3 * p->ms[i] / p->calls[i] : 0.0, busy > 0 ? 100 * p->ms[i] / busy : 0.0);
    const ds_cuda_backend *cb = ds_cu(be);
    if (cb->markov_steps)
        fprintf(stderr, "  markov walk: %.1f of %lld rows computed per pruned step (%llu steps)\n",
                (double)cb->markov_rows / (double)cb->markov_steps, (long long)cb->markov_vocab,
                (unsigned long long)cb->markov_steps);
    for (int i = 0; i < 2 * PROF_PENDING; i++) cudaEventDestroy(p->ev[i]);
    cudaEventDestroy(p->first);
    cudaEventDestroy(p->last);
    const ds_backend_ops *inner = p->inner;
    free(p);
    ds_cu(be)->profile = NULL;
    inner->destroy(be);
}

void ds_cu_profile_wrap(ds_cuda_backend *cb) {
    prof_state *p = (prof_state *)calloc(1, sizeof *p);
    if (!p) return;
    for (int i = 0; i < 2 * PROF_PENDING; i++) cudaEventCreate(&p->ev[i]);
    cudaEventCreate(&p->first);
    cudaEventCreate(&p->last);
    p->inner = cb->base.ops;
    static ds_backend_ops ops;
    ops = *p->inner;
    ops.destroy = p_destroy;
    ops.upload = p_upload;
    ops.download = p_download;
    ops.copy = p_copy;
    ops.embed = p_embed;
    ops.linear = p_linear;
    ops.rmsnorm = p_rmsnorm;
    ops.rope = p_rope;
    ops.attention = p_attention;
    ops.add = p_add;
    ops.scale = p_scale;
    ops.swiglu = p_swiglu;
    ops.geglu_tanh = p_geglu;
    ops.softcap = p_softcap;
    ops.round_bf16 = p_round;
    ops.argmax = p_argmax;
    ops.linear_residual = p_linear_residual;
    ops.linear_swiglu = p_linear_swiglu;
    ops.linear_multi = p_linear_multi;
    ops.rmsnorm_rope = p_rmsnorm_rope;
    ops.rmsnorm_add = p_rmsnorm_add;
    ops.rmsnorm_linear_geglu = p_rl_geglu;
    ops.qk_norm_rope = p_qk_norm_rope;
    ops.qk_norm_rope_store = p_qk_norm_rope_store;
    ops.key_norm_rope_store_layers = p_key_layers;
    static ds_spec_ops spec;
    spec = *p->inner->spec;
    spec.markov_greedy = p_markov;
    spec.markov_greedy_head = p_markov_head;
    spec.verify_sample = p_verify_sample;
    if (spec.verify_sample_many) spec.verify_sample_many = p_verify_sample_many;
    spec.markov_sample = p_markov_sample;
    if (spec.markov_sample_seqs) spec.markov_sample_seqs = p_markov_sample_seqs;
    if (spec.markov_greedy_seqs) spec.markov_greedy_seqs = p_markov_greedy_seqs;
    ops.spec = &spec;
    ops.probs = p_probs;
    ops.sample = p_sample;
    ops.rmsnorm_linear_multi = p_rl_multi;
    ops.rmsnorm_linear_swiglu = p_rl_swiglu;
    ops.check = p_check;
    cb->profile = p;
    cb->base.ops = &ops;
}
