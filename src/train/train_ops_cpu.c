/* The training ops on the CPU (train_ops.h): GEMMs on OpenBLAS, the rest
 * as loops over the shared thread pool. Every reduction runs in a fixed
 * order (a thread owns whole rows or whole columns; per-row partial sums
 * are added up serially), so a step's result does not depend on how the
 * pool's threads claimed the work. */
#include "train/train_ops.h"

#ifdef DS_HAVE_OPENBLAS
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/threadpool.h"

typedef struct {
    ds_train_dev base;
    ds_pool *pool;
    int n_threads;
} cpu_dev;

static cpu_dev *C(ds_train_dev *d) { return (cpu_dev *)d; }

static void cpu_destroy(ds_train_dev *d) {
    if (!d) return;
    ds_pool_free(C(d)->pool);
    free(d);
}

static ds_error *cpu_alloc(ds_train_dev *d, size_t bytes, void **out) {
    (void)d;
    *out = calloc(1, bytes ? bytes : 1);
    return *out ? NULL : ds_errorf("cpu trainer: out of memory allocating %zu bytes", bytes);
}
static void cpu_free(ds_train_dev *d, void *p) { (void)d, free(p); }
static void cpu_copy(ds_train_dev *d, void *dst, const void *src, size_t bytes) {
    (void)d;
    if (bytes) memmove(dst, src, bytes);
}
static void cpu_zero(ds_train_dev *d, void *p, size_t bytes) {
    (void)d;
    if (bytes) memset(p, 0, bytes);
}

static void cpu_gemm(ds_train_dev *d, bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *Cm, int ldc) {
    (void)d;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* an empty product: C = beta * C (BLAS may not touch C at all) */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) Cm[(size_t)i * ldc + j] = beta == 0 ? 0 : beta * Cm[(size_t)i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, Cm, ldc);
}

static void cpu_axpy(ds_train_dev *d, size_t n, float alpha, const float *x, float *y) {
    (void)d;
    for (size_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

static void cpu_gather(ds_train_dev *d, int rows, int cols, const float *table, const int32_t *ids, float *out) {
    (void)d;
    for (int i = 0; i < rows; i++)
        memcpy(out + (size_t)i * cols, table + (size_t)ids[i] * cols, (size_t)cols * sizeof *out);
}

static void cpu_scatter_add(ds_train_dev *d, int rows, int cols, const float *dd, const int32_t *ids, float *dt) {
    (void)d;
    for (int i = 0; i < rows; i++) { /* serial: rows may share an id */
        float *t = dt + (size_t)ids[i] * cols;
        const float *s = dd + (size_t)i * cols;
        for (int c = 0; c < cols; c++) t[c] += s[c];
    }
}

/* ---- RMSNorm ---- */
typedef struct {
    int n;
    const float *x, *w, *rstd, *dy;
    float *y, *rs, *dx, *dw;
    float eps;
    bool add;
    int rows;
} norm_job;

static void norm_fwd_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const norm_job *j = ctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->n;
        float ss = 0;
        for (int i = 0; i < j->n; i++) ss += x[i] * x[i];
        const float rs = 1.0f / sqrtf(ss / (float)j->n + j->eps);
        j->rs[r] = rs;
        float *y = j->y + r * j->n;
        for (int i = 0; i < j->n; i++) y[i] = j->w[i] * (x[i] * rs);
    }
}

static void cpu_rmsnorm(ds_train_dev *d, int rows, int n, const float *x, const float *w, float eps, float *y,
                        float *rstd) {
    norm_job j = {.n = n, .x = x, .w = w, .y = y, .rs = rstd, .eps = eps};
    ds_pool_run(C(d)->pool, rows, 64, norm_fwd_rows, &j);
}

/* dx = rs * (w*dy) - x * rs^3 * mean(w*dy*x) */
static void norm_bwd_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const norm_job *j = ctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->n, *dy = j->dy + r * j->n;
        const float rs = j->rstd[r];
        float dot = 0;
        for (int i = 0; i < j->n; i++) dot += j->w[i] * dy[i] * x[i];
        const float c = rs * rs * rs * dot / (float)j->n;
        float *dx = j->dx + r * j->n;
        for (int i = 0; i < j->n; i++) {
            const float g = rs * j->w[i] * dy[i] - x[i] * c;
            dx[i] = j->add ? dx[i] + g : g;
        }
    }
}

/* dw[i] += sum over rows of dy * x * rs: a thread owns columns, rows in order. */
static void norm_bwd_cols(void *ctx, int64_t c0, int64_t c1, int tid) {
    (void)tid;
    const norm_job *j = ctx;
    for (int64_t c = c0; c < c1; c++) {
        float s = 0;
        for (int r = 0; r < j->rows; r++) s += j->dy[(size_t)r * j->n + c] * j->x[(size_t)r * j->n + c] * j->rstd[r];
        j->dw[c] += s;
    }
}

static void cpu_rmsnorm_bwd(ds_train_dev *d, int rows, int n, const float *x, const float *w, const float *rstd,
                            const float *dy, float *dx, bool add_dx, float *dw) {
    norm_job j = {.n = n, .x = x, .w = w, .rstd = rstd, .dy = dy, .dx = dx, .dw = dw, .add = add_dx, .rows = rows};
    ds_pool_run(C(d)->pool, rows, 64, norm_bwd_rows, &j);
    ds_pool_run(C(d)->pool, n, 8, norm_bwd_cols, &j);
}

/* ---- RoPE ---- */
typedef struct {
    int heads, hd;
    const int32_t *pos;
    const float *inv_freq;
    float *x;
    bool inverse;
} rope_job;

static void rope_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const rope_job *j = ctx;
    const int half = j->hd / 2;
    for (int64_t r = r0; r < r1; r++) {
        const float p = (float)j->pos[r];
        for (int i = 0; i < half; i++) {
            const float ang = p * j->inv_freq[i];
            const float c = cosf(ang), s = j->inverse ? -sinf(ang) : sinf(ang);
            for (int h = 0; h < j->heads; h++) {
                float *v = j->x + (size_t)r * j->heads * j->hd + (size_t)h * j->hd;
                const float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

static void cpu_rope(ds_train_dev *d, int rows, int heads, int head_dim, const int32_t *pos, const float *inv_freq,
                     float *x, bool inverse) {
    rope_job j = {heads, head_dim, pos, inv_freq, x, inverse};
    ds_pool_run(C(d)->pool, rows, 16, rope_rows, &j);
}

/* ---- the training attention ---- */
typedef struct {
    const ds_train_attn *a;
    const float *q, *kc, *vc, *kb, *vb, *out, *lse, *dout;
    float *o, *l, *dq, *dkc, *dvc, *dkb, *dvb;
    float *scratch; /* per thread: 2 * max_keys */
    int max_keys;
} attn_job;

/* Key j of a block with `na` context keys: context row ctx0 + j (j < na) or block row b*g + j - na. */
static inline const float *key_row(const attn_job *j, const float *ctxm, const float *blkm, int64_t ctx0, int b,
                                   int na, int k) {
    const ds_train_attn *a = j->a;
    const int kvd = a->n_kv_heads * a->head_dim;
    return k < na ? ctxm + (ctx0 + k) * kvd : blkm + ((int64_t)b * a->gamma + (k - na)) * kvd;
}

/* One (block, head) a task: every row of the block. */
static void attn_fwd_tasks(void *ctx, int64_t t0, int64_t t1, int tid) {
    const attn_job *j = ctx;
    const ds_train_attn *a = j->a;
    const int H = a->n_heads, D = a->head_dim, g = a->gamma, rep = a->n_heads / a->n_kv_heads;
    float *sc = j->scratch + (size_t)tid * 2 * j->max_keys;
    for (int64_t t = t0; t < t1; t++) {
        const int b = (int)(t / H), h = (int)(t % H), kvh = h / rep;
        const int64_t ctx0 = a->ctx_start[a->seq[b]];
        const int na = a->anchor[b], nk = na + g;
        for (int r = 0; r < g; r++) {
            const int64_t row = (int64_t)b * g + r;
            const float *qv = j->q + row * H * D + (size_t)h * D;
            float mx = -INFINITY;
            for (int k = 0; k < nk; k++) {
                const float *kv = key_row(j, j->kc, j->kb, ctx0, b, na, k) + (size_t)kvh * D;
                float s = 0;
                for (int i = 0; i < D; i++) s += qv[i] * kv[i];
                sc[k] = s * a->scale;
                mx = fmaxf(mx, sc[k]);
            }
            float sum = 0;
            for (int k = 0; k < nk; k++) sum += (sc[k] = expf(sc[k] - mx));
            float *o = j->o + row * H * D + (size_t)h * D;
            for (int i = 0; i < D; i++) o[i] = 0;
            for (int k = 0; k < nk; k++) {
                const float p = sc[k] / sum;
                const float *vv = key_row(j, j->vc, j->vb, ctx0, b, na, k) + (size_t)kvh * D;
                for (int i = 0; i < D; i++) o[i] += p * vv[i];
            }
            j->l[row * H + h] = mx + logf(sum);
        }
    }
}

static float *thread_scratch(ds_train_dev *d, int keys) {
    return malloc((size_t)C(d)->n_threads * 2 * (size_t)keys * sizeof(float));
}

static void cpu_attn(ds_train_dev *d, const ds_train_attn *a, const float *q, const float *kc, const float *vc,
                     const float *kb, const float *vb, float *out, float *lse) {
    attn_job j = {.a = a, .q = q, .kc = kc, .vc = vc, .kb = kb, .vb = vb, .o = out, .l = lse};
    j.max_keys = a->max_keys;
    j.scratch = thread_scratch(d, j.max_keys);
    if (!j.scratch) abort(); /* a few KiB per thread */
    ds_pool_run(C(d)->pool, (int64_t)a->n_blocks * a->n_heads, 1, attn_fwd_tasks, &j);
    free(j.scratch);
}

/* One (sequence, KV head) a task: it alone writes that head's columns of the sequence's context keys and of
 * its blocks' keys, and the dq of the query heads that share the KV head. Blocks in order. */
static void attn_bwd_tasks(void *ctx, int64_t t0, int64_t t1, int tid) {
    const attn_job *j = ctx;
    const ds_train_attn *a = j->a;
    const int H = a->n_heads, KV = a->n_kv_heads, D = a->head_dim, g = a->gamma, rep = H / KV;
    const int kvd = KV * D;
    float *p = j->scratch + (size_t)tid * 2 * j->max_keys, *dp = p + j->max_keys;
    for (int64_t t = t0; t < t1; t++) {
        const int s = (int)(t / KV), kvh = (int)(t % KV);
        const int64_t ctx0 = a->ctx_start[s];
        for (int b = 0; b < a->n_blocks; b++) {
            if (a->seq[b] != s) continue;
            const int na = a->anchor[b], nk = na + g;
            for (int hh = 0; hh < rep; hh++) {
                const int h = kvh * rep + hh;
                for (int r = 0; r < g; r++) {
                    const int64_t row = (int64_t)b * g + r;
                    const float *qv = j->q + row * H * D + (size_t)h * D;
                    const float *ov = j->out + row * H * D + (size_t)h * D;
                    const float *go = j->dout + row * H * D + (size_t)h * D;
                    const float lse = j->lse[row * H + h];
                    float Dd = 0;
                    for (int i = 0; i < D; i++) Dd += go[i] * ov[i];
                    for (int k = 0; k < nk; k++) {
                        const float *kv = key_row(j, j->kc, j->kb, ctx0, b, na, k) + (size_t)kvh * D;
                        const float *vv = key_row(j, j->vc, j->vb, ctx0, b, na, k) + (size_t)kvh * D;
                        float sc = 0, gv = 0;
                        for (int i = 0; i < D; i++) sc += qv[i] * kv[i], gv += go[i] * vv[i];
                        p[k] = expf(sc * a->scale - lse);
                        dp[k] = p[k] * (gv - Dd); /* dS */
                    }
                    float *gq = j->dq + row * H * D + (size_t)h * D;
                    for (int i = 0; i < D; i++) gq[i] = 0;
                    for (int k = 0; k < nk; k++) {
                        const int64_t krow = k < na ? ctx0 + k : (int64_t)b * g + (k - na);
                        float *gk = (k < na ? j->dkc : j->dkb) + krow * kvd + (size_t)kvh * D;
                        float *gv = (k < na ? j->dvc : j->dvb) + krow * kvd + (size_t)kvh * D;
                        const float *kv = key_row(j, j->kc, j->kb, ctx0, b, na, k) + (size_t)kvh * D;
                        const float ds = dp[k] * a->scale;
                        for (int i = 0; i < D; i++) {
                            gq[i] += ds * kv[i];
                            gk[i] += ds * qv[i];
                            gv[i] += p[k] * go[i];
                        }
                    }
                }
            }
        }
    }
}

static void cpu_attn_bwd(ds_train_dev *d, const ds_train_attn *a, const float *q, const float *kc, const float *vc,
                         const float *kb, const float *vb, const float *out, const float *lse, const float *dout,
                         float *dq, float *dkc, float *dvc, float *dkb, float *dvb) {
    const size_t kvd = (size_t)a->n_kv_heads * a->head_dim;
    const size_t n_ctx = (size_t)a->n_ctx, n_blk = (size_t)a->n_blocks * a->gamma;
    memset(dkc, 0, n_ctx * kvd * sizeof *dkc);
    memset(dvc, 0, n_ctx * kvd * sizeof *dvc);
    memset(dkb, 0, n_blk * kvd * sizeof *dkb);
    memset(dvb, 0, n_blk * kvd * sizeof *dvb);
    attn_job j = {.a = a, .q = q, .kc = kc, .vc = vc, .kb = kb, .vb = vb, .out = out, .lse = lse, .dout = dout,
                  .dq = dq, .dkc = dkc, .dvc = dvc, .dkb = dkb, .dvb = dvb};
    j.max_keys = a->max_keys;
    j.scratch = thread_scratch(d, j.max_keys);
    if (!j.scratch) abort();
    ds_pool_run(C(d)->pool, (int64_t)a->n_seqs * a->n_kv_heads, 1, attn_bwd_tasks, &j);
    free(j.scratch);
}

/* ---- SwiGLU ---- */
static inline float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

static void cpu_swiglu(ds_train_dev *d, size_t n, const float *gate, const float *up, float *m) {
    (void)d;
    for (size_t i = 0; i < n; i++) m[i] = gate[i] * sigm(gate[i]) * up[i];
}

static void cpu_swiglu_bwd(ds_train_dev *d, size_t n, const float *gate, const float *up, const float *dm,
                           float *dgate, float *dup) {
    (void)d;
    for (size_t i = 0; i < n; i++) {
        const float s = sigm(gate[i]), si = gate[i] * s;
        const float g = dm[i];
        dgate[i] = g * up[i] * s * (1.0f + gate[i] * (1.0f - s));
        dup[i] = g * si;
    }
}

/* ---- the DSpark loss ---- */
typedef struct {
    int V;
    float *draft, *target, *dconf;
    const float *conf, *w;
    const int32_t *labels;
    float cce, cl1, cconf;
    double *ce, *l1, *bce; /* per row */
} loss_job;

/* Softmax of z in place; returns log-sum-exp. */
static float softmax_inplace(float *z, int V) {
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) mx = fmaxf(mx, z[v]);
    float sum = 0;
    for (int v = 0; v < V; v++) sum += (z[v] = expf(z[v] - mx));
    const float inv = 1.0f / sum;
    for (int v = 0; v < V; v++) z[v] *= inv;
    return mx + logf(sum);
}

static void loss_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const loss_job *j = ctx;
    const int V = j->V;
    for (int64_t r = r0; r < r1; r++) {
        float *pd = j->draft + r * V, *pt = j->target + r * V;
        const float w = j->w[r];
        if (w == 0) { /* no weight: no loss, no gradient */
            memset(pd, 0, (size_t)V * sizeof *pd);
            j->dconf[r] = 0;
            j->ce[r] = j->l1[r] = j->bce[r] = 0;
            continue;
        }
        const int lab = j->labels[r];
        const float zl = pd[lab];
        const float lse = softmax_inplace(pd, V);
        softmax_inplace(pt, V);
        float l1 = 0, sdot = 0; /* sdot = sum pd * sign(pd - pt) */
        for (int v = 0; v < V; v++) {
            const float df = pd[v] - pt[v];
            l1 += fabsf(df);
            sdot += pd[v] * (float)((df > 0) - (df < 0));
        }
        const float c = j->conf[r];
        float cstar = 1.0f - 0.5f * l1;
        cstar = cstar < 0 ? 0 : cstar > 1 ? 1 : cstar;
        const float bce = fmaxf(c, 0) - c * cstar + log1pf(expf(-fabsf(c)));
        j->ce[r] = (double)w * (lse - zl);
        j->l1[r] = (double)w * l1;
        j->bce[r] = (double)w * bce;
        /* d/dz: ce -> pd - onehot; l1 -> pd * (sign - sdot); bce (c* detached) -> only the confidence. */
        const float ace = w * j->cce, al1 = w * j->cl1;
        for (int v = 0; v < V; v++) {
            const float df = pd[v] - pt[v];
            const float sg = (float)((df > 0) - (df < 0));
            pd[v] = ace * pd[v] + al1 * pd[v] * (sg - sdot);
        }
        pd[lab] -= ace;
        j->dconf[r] = w * j->cconf * (sigm(c) - cstar);
    }
}

static void cpu_dspark_loss(ds_train_dev *d, int rows, int vocab, float *draft, float *target, const float *conf,
                            const int32_t *labels, const float *w, float coef_ce, float coef_l1, float coef_conf,
                            float *dconf, ds_train_terms *terms) {
    double *acc = malloc((size_t)(rows > 0 ? rows : 1) * 3 * sizeof *acc);
    if (!acc) abort();
    loss_job j = {.V = vocab, .draft = draft, .target = target, .dconf = dconf, .conf = conf, .w = w,
                  .labels = labels, .cce = coef_ce, .cl1 = coef_l1, .cconf = coef_conf,
                  .ce = acc, .l1 = acc + rows, .bce = acc + 2 * rows};
    ds_pool_run(C(d)->pool, rows, 1, loss_rows, &j);
    for (int r = 0; r < rows; r++) terms->ce += j.ce[r], terms->l1 += j.l1[r], terms->conf += j.bce[r];
    free(acc);
}

static double cpu_sumsq(ds_train_dev *d, size_t n, const float *x) {
    (void)d;
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

static void cpu_adamw(ds_train_dev *d, size_t n, float *p, const float *g, float *m, float *v, float clip, float lr,
                      float beta1, float beta2, float eps, float wd, float bc1, float bc2) {
    (void)d;
    const float step = lr / bc1, bc2s = sqrtf(bc2), decay = 1.0f - lr * wd;
    for (size_t i = 0; i < n; i++) {
        const float gi = g[i] * clip;
        p[i] *= decay;
        m[i] += (1.0f - beta1) * (gi - m[i]);
        v[i] = v[i] * beta2 + (1.0f - beta2) * gi * gi;
        p[i] -= step * m[i] / (sqrtf(v[i]) / bc2s + eps);
    }
}

static const ds_train_ops cpu_ops = {
    .name = "cpu",
    .logit_values = (int64_t)16 << 20, /* 64 MiB */
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .gemm = cpu_gemm,
    .axpy = cpu_axpy,
    .gather = cpu_gather,
    .scatter_add = cpu_scatter_add,
    .rmsnorm = cpu_rmsnorm,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .rope = cpu_rope,
    .attn = cpu_attn,
    .attn_bwd = cpu_attn_bwd,
    .swiglu = cpu_swiglu,
    .swiglu_bwd = cpu_swiglu_bwd,
    .dspark_loss = cpu_dspark_loss,
    .sumsq = cpu_sumsq,
    .adamw = cpu_adamw,
};

ds_error *ds_train_dev_cpu(int n_threads, ds_train_dev **out) {
    *out = NULL;
    if (n_threads <= 0) {
        const long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    cpu_dev *d = calloc(1, sizeof *d);
    if (!d) return ds_errorf("cpu trainer: out of memory");
    d->base.ops = &cpu_ops;
    d->n_threads = n_threads;
    d->pool = ds_pool_new(n_threads);
    if (!d->pool) {
        free(d);
        return ds_errorf("cpu trainer: cannot start %d threads", n_threads);
    }
    *out = &d->base;
    return NULL;
}

#else /* built with -DDS_OPENBLAS=OFF */

ds_error *ds_train_dev_cpu(int n_threads, ds_train_dev **out) {
    (void)n_threads;
    *out = NULL;
    return ds_errorf("cpu trainer: this dspark was built without OpenBLAS (-DDS_OPENBLAS=OFF); rebuild with it, "
                     "or train on a GPU (--backend cuda)");
}

#endif
