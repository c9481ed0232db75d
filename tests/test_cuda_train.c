/* The CUDA training ops (src/train/train_ops_cuda.cu) against the CPU ones
 * (src/train/train_ops_cpu.c) on random inputs at small realistic shapes:
 * every op of ds_train_ops, with what each writes, adds and zeroes. Errors
 * are normalized (||gpu - cpu|| / ||cpu|| over the whole output), bounds:
 * 1e-5 for fp32 results whose sums run in another order (GEMMs, norms,
 * attention, the loss at V = 512), 1e-4 for the loss over a 151936-word
 * vocabulary (the CPU's serial fp32 sums over 152k terms are themselves
 * only good to ~1e-5), 1e-6 for elementwise ops; gather and scatter_add
 * (the CPU's additions in the CPU's order) must match bit for bit, and the
 * reductions must give the same bits when repeated (no atomics).
 *
 * The CPU side is this test's own build of train_ops_cpu.c (entry point
 * ds_train_dev_cpu_ref, tests/CMakeLists.txt) so that the comparison also
 * runs where the library is built without OpenBLAS (the GPU machines):
 * there its GEMMs run on a naive sgemm below. Skips (exit 77) where no CUDA
 * device can be used (or the build has no CUDA). The golden checks on the
 * GPU are ctest's test_train_cuda (test_train with DS_TRAIN_DEVICE=cuda). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "testlib.h"
#include "train/train_ops.h"

ds_error *ds_train_dev_cpu_ref(int n_threads, ds_train_dev **out);

#ifdef DS_TEST_NAIVE_SGEMM
/* The reference CPU ops' GEMM where OpenBLAS is absent (row-major only, as train_ops_cpu.c calls it). */
#include <cblas.h>
void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                 float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    (void)order;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)(ta == CblasTrans ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                     (tb == CblasTrans ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
            float *c = &C[(size_t)i * ldc + j];
            *c = (float)(alpha * s + (beta == 0 ? 0.0 : (double)beta * *c));
        }
}
#endif

static ds_train_dev *gpu, *cpu;
static const ds_train_ops *G, *P; /* GPU's, CPU's */
static ds_rng rng;

static void setup(void) {
    ds_error *e = ds_train_dev_cuda(0, &gpu);
    if (e) {
        printf("SKIP: no CUDA device [%s]\n", ds_error_message(e));
        fflush(stdout);
        ds_error_free(e);
        exit(77);
    }
    CHECK_OK(ds_train_dev_cpu_ref(4, &cpu));
    G = gpu->ops, P = cpu->ops;
    ds_rng_seed(&rng, 41);
}

static float uni(float a) { return (float)((ds_rng_uniform(&rng) * 2 - 1) * a); }
static float *rnd(size_t n, float a) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = uni(a);
    return x;
}
/* A device copy of host bytes. */
static void *up(const void *h, size_t bytes) {
    void *d = NULL;
    ds_error *e = G->alloc(gpu, bytes, &d);
    if (e) {
        fprintf(stderr, "gpu alloc of %zu bytes: %s\n", bytes, ds_error_message(e));
        exit(1);
    }
    if (h) G->upload(gpu, d, h, bytes);
    return d;
}
static float *upf(const float *h, size_t n) { return up(h, n * sizeof(float)); }
static int32_t *upi(const int32_t *h, size_t n) { return up(h, n * sizeof(int32_t)); }
static void drop(void *d) { G->free(gpu, d); }

static double norm_err(const float *got, const float *want, size_t n) {
    double dd = 0, ww = 0;
    for (size_t i = 0; i < n; i++) {
        const double df = (double)got[i] - want[i];
        dd += isnan(got[i]) ? INFINITY : df * df, ww += (double)want[i] * want[i];
    }
    return ww > 0 ? sqrt(dd / ww) : sqrt(dd);
}
/* The GPU buffer d against the CPU's result want: normalized error <= tol (0: bit for bit). */
static void compare(const float *d, const float *want, size_t n, double tol, const char *what) {
    float *got = malloc((n ? n : 1) * sizeof *got);
    G->download(gpu, got, d, n * sizeof *got);
    const double err = norm_err(got, want, n);
    const bool same = !memcmp(got, want, n * sizeof *got);
    printf("  %-58s err %.2e%s\n", what, err, same ? " (bitwise equal)" : "");
    if (tol == 0) CHECK(same, "%s: not bitwise equal to the CPU (err %.3g)", what, err);
    else CHECK(err <= tol, "%s: normalized error %.3g > %.0e", what, err, tol);
    free(got);
}
/* Two GPU buffers hold the same bits. */
static void same_bits(const float *a, const float *b, size_t n, const char *what) {
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    G->download(gpu, x, a, n * sizeof *x);
    G->download(gpu, y, b, n * sizeof *y);
    CHECK(!memcmp(x, y, n * sizeof *x), "%s: a repeat gave other bits", what);
    free(x), free(y);
}

/* ---- GEMM, axpy ---- */

static void gemm_case(bool ta, bool tb, int M, int N, int K, int pad, float alpha, float beta) {
    const int ar = ta ? K : M, ac = (ta ? M : K) + pad, br = tb ? N : K, bc = (tb ? K : N) + pad, cc = N + pad;
    float *A = rnd((size_t)ar * ac, 1), *B = rnd((size_t)br * bc, 1), *C = rnd((size_t)M * cc, 1);
    float *dA = upf(A, (size_t)ar * ac), *dB = upf(B, (size_t)br * bc), *dC = upf(C, (size_t)M * cc);
    G->gemm(gpu, ta, tb, M, N, K, alpha, dA, ac, dB, bc, beta, dC, cc);
    P->gemm(cpu, ta, tb, M, N, K, alpha, A, ac, B, bc, beta, C, cc);
    char what[128];
    snprintf(what, sizeof what, "gemm %c%c M=%d N=%d K=%d ld+%d alpha %g beta %g", ta ? 'T' : 'N', tb ? 'T' : 'N', M,
             N, K, pad, alpha, beta);
    compare(dC, C, (size_t)M * cc, 1e-5, what); /* the padding columns too: untouched on both */
    drop(dA), drop(dB), drop(dC);
    free(A), free(B), free(C);
}

static void test_gemm(void) {
    for (int t = 0; t < 4; t++) {
        gemm_case(t & 1, t & 2, 37, 53, 71, 0, 1.0f, 0.0f);
        gemm_case(t & 1, t & 2, 64, 96, 1024, 3, 0.7f, 1.0f);
        gemm_case(t & 1, t & 2, 5, 300, 33, 1, 1.0f, -0.5f);
    }
    /* the step's narrow shapes: confidence logits (N = 1), its weight gradient (M = 1), the bias (K = 1) */
    gemm_case(false, true, 77, 1, 64, 0, 1.0f, 0.0f);
    gemm_case(true, false, 1, 64, 77, 0, 1.0f, 1.0f);
    gemm_case(false, false, 77, 1, 1, 0, 1.0f, 1.0f);
    gemm_case(false, false, 9, 7, 0, 0, 1.0f, 0.5f); /* K = 0: C = beta C */
    gemm_case(false, false, 9, 7, 0, 0, 1.0f, 0.0f);
}

static void test_axpy(void) {
    const size_t n = 100003;
    float *x = rnd(n, 1), *y = rnd(n, 1);
    float *dx = upf(x, n), *dy = upf(y, n);
    G->axpy(gpu, n, -0.37f, dx, dy);
    P->axpy(cpu, n, -0.37f, x, y);
    compare(dy, y, n, 1e-6, "axpy n=100003");
    drop(dx), drop(dy);
    free(x), free(y);
}

/* ---- gather, scatter_add ---- */

static void test_gather_scatter(void) {
    const int rows = 300, cols = 70, trows = 50;
    float *table = rnd((size_t)trows * cols, 1), *out = rnd((size_t)rows * cols, 1);
    int32_t ids[300];
    for (int i = 0; i < rows; i++) ids[i] = (int32_t)(ds_rng_next(&rng) % trows); /* many repeats */
    ids[0] = ids[rows - 1] = 7;
    float *dt = upf(table, (size_t)trows * cols), *dout = upf(out, (size_t)rows * cols);
    int32_t *di = upi(ids, rows);
    G->gather(gpu, rows, cols, dt, di, dout);
    P->gather(cpu, rows, cols, table, ids, out);
    compare(dout, out, (size_t)rows * cols, 0, "gather 300 rows of 70 from 50");
    /* scatter_add onto a non-zero table: adds, repeated ids in row order */
    float *d = rnd((size_t)rows * cols, 1);
    float *dd = upf(d, (size_t)rows * cols);
    G->scatter_add(gpu, rows, cols, dd, di, dt);
    P->scatter_add(cpu, rows, cols, d, ids, table);
    compare(dt, table, (size_t)trows * cols, 0, "scatter_add 300 rows into 50 (repeated ids)");
    /* wide rows (more columns than a block's threads), more rows than a block scans at once */
    const int rows2 = 700, cols2 = 600;
    float *t2 = rnd((size_t)trows * cols2, 1), *d2 = rnd((size_t)rows2 * cols2, 1);
    int32_t *ids2 = malloc(rows2 * sizeof *ids2);
    for (int i = 0; i < rows2; i++) ids2[i] = (int32_t)(ds_rng_next(&rng) % trows);
    float *dt2 = upf(t2, (size_t)trows * cols2), *dd2 = upf(d2, (size_t)rows2 * cols2);
    int32_t *di2 = upi(ids2, rows2);
    G->scatter_add(gpu, rows2, cols2, dd2, di2, dt2);
    P->scatter_add(cpu, rows2, cols2, d2, ids2, t2);
    compare(dt2, t2, (size_t)trows * cols2, 0, "scatter_add 700 rows of 600 into 50");
    drop(dt), drop(dout), drop(di), drop(dd), drop(dt2), drop(dd2), drop(di2);
    free(table), free(out), free(d), free(t2), free(d2), free(ids2);
}

/* ---- RMSNorm ---- */

static void norm_case(int rows, int n) {
    const size_t N = (size_t)rows * n;
    float *x = rnd(N, 2), *w = rnd(n, 1), *y = rnd(N, 1), *rs = rnd(rows, 1);
    float *dx_ = upf(x, N), *dw_ = upf(w, n), *dy_ = upf(y, N), *drs = upf(rs, rows);
    G->rmsnorm(gpu, rows, n, dx_, dw_, 1e-6f, dy_, drs);
    P->rmsnorm(cpu, rows, n, x, w, 1e-6f, y, rs);
    char what[128];
    snprintf(what, sizeof what, "rmsnorm %d x %d: y", rows, n);
    compare(dy_, y, N, 1e-5, what);
    snprintf(what, sizeof what, "rmsnorm %d x %d: rstd", rows, n);
    compare(drs, rs, rows, 1e-5, what);
    /* backward from the CPU's rstd, into a random dx (written, then added) and a random dw (added) */
    G->upload(gpu, drs, rs, rows * sizeof(float));
    for (int add = 0; add < 2; add++) {
        float *g = rnd(N, 1), *dx = rnd(N, 1), *dw = rnd(n, 1);
        float *dg = upf(g, N), *ddx = upf(dx, N), *ddw = upf(dw, n);
        G->rmsnorm_bwd(gpu, rows, n, dx_, dw_, drs, dg, ddx, add, ddw);
        P->rmsnorm_bwd(cpu, rows, n, x, w, rs, g, dx, add, dw);
        snprintf(what, sizeof what, "rmsnorm_bwd %d x %d: dx (%s)", rows, n, add ? "added" : "written");
        compare(ddx, dx, N, 1e-5, what);
        snprintf(what, sizeof what, "rmsnorm_bwd %d x %d: dw (added)", rows, n);
        compare(ddw, dw, n, 1e-5, what);
        drop(dg), drop(ddx), drop(ddw);
        free(g), free(dx), free(dw);
    }
    drop(dx_), drop(dw_), drop(dy_), drop(drs);
    free(x), free(w), free(y), free(rs);
}

static void test_rmsnorm(void) {
    norm_case(37, 16);    /* q / k norms: a warp a row */
    norm_case(300, 128);
    norm_case(19, 1000);  /* a block a row */
    norm_case(130, 4096); /* several column chunks and row chunks of dw */
}

/* dw's partial sums have a fixed shape: the same bits twice. */
static void test_rmsnorm_bwd_repeatable(void) {
    const int rows = 1000, n = 256;
    float *x = rnd((size_t)rows * n, 2), *w = rnd(n, 1), *g = rnd((size_t)rows * n, 1), *rs = rnd(rows, 1);
    float *dx = upf(x, (size_t)rows * n), *dw = upf(w, n), *dg = upf(g, (size_t)rows * n), *drs = upf(rs, rows);
    float *o1 = upf(NULL, (size_t)rows * n), *o2 = upf(NULL, (size_t)rows * n), *w1 = upf(NULL, n), *w2 = upf(NULL, n);
    G->rmsnorm_bwd(gpu, rows, n, dx, dw, drs, dg, o1, false, w1);
    G->rmsnorm_bwd(gpu, rows, n, dx, dw, drs, dg, o2, false, w2);
    same_bits(w1, w2, n, "rmsnorm_bwd dw");
    same_bits(o1, o2, (size_t)rows * n, "rmsnorm_bwd dx");
    drop(dx), drop(dw), drop(dg), drop(drs), drop(o1), drop(o2), drop(w1), drop(w2);
    free(x), free(w), free(g), free(rs);
}

/* ---- RoPE ---- */

static void rope_case(int rows, int heads, int hd, bool inverse) {
    const size_t N = (size_t)rows * heads * hd;
    float *x = rnd(N, 1), *inv = malloc((size_t)(hd / 2) * sizeof *inv);
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)pow(1e6, -2.0 * i / hd);
    int32_t *pos = malloc(rows * sizeof *pos);
    for (int r = 0; r < rows; r++) pos[r] = (int32_t)(ds_rng_next(&rng) % 4096);
    float *dx = upf(x, N), *dinv = upf(inv, hd / 2);
    int32_t *dp = upi(pos, rows);
    G->rope(gpu, rows, heads, hd, dp, dinv, dx, inverse);
    P->rope(cpu, rows, heads, hd, pos, inv, x, inverse);
    char what[96];
    snprintf(what, sizeof what, "rope%s %d rows x %d heads x %d", inverse ? " (inverse)" : "", rows, heads, hd);
    compare(dx, x, N, 1e-5, what);
    drop(dx), drop(dinv), drop(dp);
    free(x), free(inv), free(pos);
}

static void test_rope(void) {
    rope_case(23, 3, 16, false);
    rope_case(23, 3, 16, true);
    rope_case(40, 8, 128, false);
    rope_case(40, 2, 128, true);
}

/* ---- the training attention ---- */

typedef struct {
    int n_seqs, n_blocks, gamma, H, KV, D;
    int ctx_len[4];
    int seq[8], anchor[8];
} attn_cfg;

static void attn_case(const attn_cfg *c) {
    int32_t ctx_start[5] = {0}, seq[8], anchor[8];
    for (int s = 0; s < c->n_seqs; s++) ctx_start[s + 1] = ctx_start[s] + c->ctx_len[s];
    int max_anchor = 0;
    for (int b = 0; b < c->n_blocks; b++) {
        seq[b] = c->seq[b], anchor[b] = c->anchor[b];
        max_anchor = anchor[b] > max_anchor ? anchor[b] : max_anchor;
    }
    const int n_ctx = ctx_start[c->n_seqs], R = c->n_blocks * c->gamma, qd = c->H * c->D, kvd = c->KV * c->D;
    ds_train_attn a = {.n_blocks = c->n_blocks, .gamma = c->gamma, .n_seqs = c->n_seqs, .n_ctx = n_ctx,
                       .max_keys = max_anchor + c->gamma, .seq = seq, .anchor = anchor, .ctx_start = ctx_start,
                       .n_heads = c->H, .n_kv_heads = c->KV, .head_dim = c->D, .scale = 1.0f / sqrtf((float)c->D)};
    ds_train_attn ag = a;
    ag.seq = upi(seq, c->n_blocks), ag.anchor = upi(anchor, c->n_blocks), ag.ctx_start = upi(ctx_start, c->n_seqs + 1);
    const size_t nq = (size_t)R * qd, nc = (size_t)n_ctx * kvd, nb = (size_t)R * kvd;
    float *q = rnd(nq, 2), *kc = rnd(nc, 2), *vc = rnd(nc, 1), *kb = rnd(nb, 2), *vb = rnd(nb, 1);
    float *out = rnd(nq, 1), *lse = rnd((size_t)R * c->H, 1);
    float *dq_ = upf(q, nq), *dkc_ = upf(kc, nc), *dvc_ = upf(vc, nc), *dkb_ = upf(kb, nb), *dvb_ = upf(vb, nb);
    float *dout_ = upf(NULL, nq), *dlse_ = upf(NULL, (size_t)R * c->H);
    G->attn(gpu, &ag, dq_, dkc_, dvc_, dkb_, dvb_, dout_, dlse_);
    P->attn(cpu, &a, q, kc, vc, kb, vb, out, lse);
    char what[160], cfg[120];
    snprintf(cfg, sizeof cfg, "%d seqs, %d blocks of %d, H %d / KV %d, D %d", c->n_seqs, c->n_blocks, c->gamma, c->H,
             c->KV, c->D);
    snprintf(what, sizeof what, "attn out (%s)", cfg);
    compare(dout_, out, nq, 1e-5, what);
    snprintf(what, sizeof what, "attn lse");
    compare(dlse_, lse, (size_t)R * c->H, 1e-5, what);

    /* the backward from the CPU's out and lse, into outputs holding garbage (the op zeroes / writes them) */
    G->upload(gpu, dout_, out, nq * sizeof(float));
    G->upload(gpu, dlse_, lse, (size_t)R * c->H * sizeof(float));
    float *go = rnd(nq, 1);
    float *gq = rnd(nq, 9), *gkc = rnd(nc, 9), *gvc = rnd(nc, 9), *gkb = rnd(nb, 9), *gvb = rnd(nb, 9);
    float *dgo = upf(go, nq), *dgq = upf(gq, nq), *dgkc = upf(gkc, nc), *dgvc = upf(gvc, nc), *dgkb = upf(gkb, nb),
          *dgvb = upf(gvb, nb);
    G->attn_bwd(gpu, &ag, dq_, dkc_, dvc_, dkb_, dvb_, dout_, dlse_, dgo, dgq, dgkc, dgvc, dgkb, dgvb);
    P->attn_bwd(cpu, &a, q, kc, vc, kb, vb, out, lse, go, gq, gkc, gvc, gkb, gvb);
    const char *names[5] = {"dq", "dk (context)", "dv (context)", "dk (block)", "dv (block)"};
    float *gd[5] = {dgq, dgkc, dgvc, dgkb, dgvb}, *gh[5] = {gq, gkc, gvc, gkb, gvb};
    const size_t gn[5] = {nq, nc, nc, nb, nb};
    for (int i = 0; i < 5; i++) {
        snprintf(what, sizeof what, "attn_bwd %s", names[i]);
        compare(gd[i], gh[i], gn[i], 1e-5, what);
    }
    /* no atomics: a repeat gives the same bits */
    float *again[5];
    for (int i = 0; i < 5; i++) again[i] = upf(NULL, gn[i]);
    G->attn_bwd(gpu, &ag, dq_, dkc_, dvc_, dkb_, dvb_, dout_, dlse_, dgo, again[0], again[1], again[2], again[3],
                again[4]);
    for (int i = 0; i < 5; i++) {
        snprintf(what, sizeof what, "attn_bwd %s", names[i]);
        same_bits(gd[i], again[i], gn[i], what);
        drop(again[i]);
    }
    drop((void *)ag.seq), drop((void *)ag.anchor), drop((void *)ag.ctx_start);
    drop(dq_), drop(dkc_), drop(dvc_), drop(dkb_), drop(dvb_), drop(dout_), drop(dlse_);
    drop(dgo), drop(dgq), drop(dgkc), drop(dgvc), drop(dgkb), drop(dgvb);
    free(q), free(kc), free(vc), free(kb), free(vb), free(out), free(lse);
    free(go), free(gq), free(gkc), free(gvc), free(gkb), free(gvb);
}

static void test_attention(void) {
    /* 3 sequences, GQA 2:1, head_dim 16; anchors 0, at a sequence's end, past one key tile (32) and two */
    const attn_cfg a = {.n_seqs = 3, .n_blocks = 7, .gamma = 4, .H = 4, .KV = 2, .D = 16, .ctx_len = {37, 70, 5},
                        .seq = {0, 0, 1, 1, 1, 2, 0}, .anchor = {0, 37, 1, 45, 70, 5, 20}};
    attn_case(&a);
    /* Qwen3's head_dim 128, GQA 4:1, gamma 16 */
    const attn_cfg b = {.n_seqs = 2, .n_blocks = 5, .gamma = 16, .H = 8, .KV = 2, .D = 128, .ctx_len = {100, 33},
                        .seq = {0, 1, 0, 0, 1}, .anchor = {64, 0, 99, 1, 33}};
    attn_case(&b);
    /* head_dim 256 (the largest: most shared memory), MQA */
    const attn_cfg c = {.n_seqs = 1, .n_blocks = 2, .gamma = 8, .H = 2, .KV = 1, .D = 256, .ctx_len = {40},
                        .seq = {0, 0}, .anchor = {0, 40}};
    attn_case(&c);
    /* head_dim 40 (not a multiple of 32), no GQA, gamma 32 (a warp's worth of block keys), gamma 1 */
    const attn_cfg d = {.n_seqs = 2, .n_blocks = 3, .gamma = 32, .H = 3, .KV = 3, .D = 40, .ctx_len = {50, 10},
                        .seq = {0, 1, 0}, .anchor = {50, 10, 17}};
    attn_case(&d);
    const attn_cfg e = {.n_seqs = 2, .n_blocks = 4, .gamma = 1, .H = 2, .KV = 1, .D = 64, .ctx_len = {9, 70},
                        .seq = {1, 0, 1, 1}, .anchor = {66, 3, 0, 32}};
    attn_case(&e);
}

/* ---- SwiGLU ---- */

static void test_swiglu(void) {
    const size_t n = 10007;
    float *gate = rnd(n, 6), *upv = rnd(n, 2), *m = rnd(n, 1), *dm = rnd(n, 1), *dg = rnd(n, 1), *du = rnd(n, 1);
    float *d_gate = upf(gate, n), *d_up = upf(upv, n), *d_m = upf(m, n), *d_dm = upf(dm, n), *d_dg = upf(dg, n),
          *d_du = upf(du, n);
    G->swiglu(gpu, n, d_gate, d_up, d_m);
    P->swiglu(cpu, n, gate, upv, m);
    compare(d_m, m, n, 1e-6, "swiglu n=10007");
    G->swiglu_bwd(gpu, n, d_gate, d_up, d_dm, d_dg, d_du);
    P->swiglu_bwd(cpu, n, gate, upv, dm, dg, du);
    compare(d_dg, dg, n, 1e-6, "swiglu_bwd dgate");
    compare(d_du, du, n, 1e-6, "swiglu_bwd dup");
    drop(d_gate), drop(d_up), drop(d_m), drop(d_dm), drop(d_dg), drop(d_du);
    free(gate), free(upv), free(m), free(dm), free(dg), free(du);
}

/* ---- the DSpark loss ---- */

static void loss_case(int rows, int V, double tol) {
    const size_t N = (size_t)rows * V;
    float *draft = rnd(N, 4), *target = malloc(N * sizeof *target), *conf = rnd(rows, 3), *w = malloc(rows * sizeof *w);
    for (size_t i = 0; i < N; i++) target[i] = draft[i] + uni(1.5f); /* near the draft: an L1 well inside (0, 2) */
    int32_t *lab = malloc(rows * sizeof *lab);
    double wsum = 0;
    for (int r = 0; r < rows; r++) {
        lab[r] = (int32_t)(ds_rng_next(&rng) % (uint64_t)V);
        w[r] = r == 1 ? 0.0f : expf(-(float)(r % 16) / 4.0f); /* row 1: no weight (no loss, no gradient) */
        wsum += w[r];
    }
    lab[0] = V - 1, lab[rows - 1] = 0;
    const float den = (float)(wsum + 1e-6);
    float *dconf = rnd(rows, 1);
    float *d_draft = upf(draft, N), *d_target = upf(target, N), *d_conf = upf(conf, rows), *d_w = upf(w, rows),
          *d_dconf = upf(dconf, rows);
    int32_t *d_lab = upi(lab, rows);
    ds_train_terms tg = {1, 2, 3}, tc = {1, 2, 3}; /* added to */
    G->dspark_loss(gpu, rows, V, d_draft, d_target, d_conf, d_lab, d_w, 0.1f / den, 0.9f / den, 1.0f / den, d_dconf,
                   &tg);
    P->dspark_loss(cpu, rows, V, draft, target, conf, lab, w, 0.1f / den, 0.9f / den, 1.0f / den, dconf, &tc);
    char what[96];
    snprintf(what, sizeof what, "dspark_loss %d rows, V %d: d(draft)", rows, V);
    compare(d_draft, draft, N, tol, what);
    snprintf(what, sizeof what, "dspark_loss %d rows, V %d: dconf", rows, V);
    compare(d_dconf, dconf, rows, tol, what);
    const double g3[3] = {tg.ce - 1, tg.l1 - 2, tg.conf - 3}, c3[3] = {tc.ce - 1, tc.l1 - 2, tc.conf - 3};
    for (int k = 0; k < 3; k++) {
        const double rel = fabs(g3[k] - c3[k]) / fmax(fabs(c3[k]), 1e-30);
        printf("  dspark_loss V %d: term %d %.9g vs cpu %.9g (rel %.2e)\n", V, k, g3[k], c3[k], rel);
        CHECK(rel <= tol, "dspark_loss V %d term %d: %.9g vs %.9g (rel %.3g > %.0e)", V, k, g3[k], c3[k], rel, tol);
    }
    /* the zero-weight row's gradient is zero */
    float *row1 = malloc((size_t)V * sizeof *row1);
    G->download(gpu, row1, d_draft + V, (size_t)V * sizeof *row1);
    bool zero = true;
    for (int v = 0; v < V; v++) zero &= row1[v] == 0;
    CHECK(zero, "dspark_loss V %d: a zero-weight row's gradient is zero", V);
    free(row1);
    drop(d_draft), drop(d_target), drop(d_conf), drop(d_w), drop(d_dconf), drop(d_lab);
    free(draft), free(target), free(conf), free(w), free(lab), free(dconf);
}

static void test_loss(void) {
    loss_case(6, 512, 1e-5);
    loss_case(5, 509, 1e-5); /* V not a multiple of 4: scalar loads */
    loss_case(3, 151936, 1e-4);
}

/* ---- sumsq, AdamW ---- */

static void test_sumsq(void) {
    const size_t ns[] = {1, 1000, 1234567};
    for (int i = 0; i < 3; i++) {
        float *x = rnd(ns[i], 3);
        float *dx = upf(x, ns[i]);
        const double g = G->sumsq(gpu, ns[i], dx), c = P->sumsq(cpu, ns[i], x), g2 = G->sumsq(gpu, ns[i], dx);
        printf("  sumsq n=%zu: %.15g vs cpu %.15g (rel %.2e)\n", ns[i], g, c, fabs(g - c) / c);
        CHECK(fabs(g - c) <= 1e-12 * c, "sumsq n=%zu: %.17g vs %.17g", ns[i], g, c);
        CHECK(g == g2, "sumsq n=%zu: a repeat gave %.17g, then %.17g", ns[i], g, g2);
        drop(dx);
        free(x);
    }
    CHECK(G->sumsq(gpu, 0, NULL) == 0, "sumsq of nothing");
}

static void test_adamw(void) {
    const size_t n = 100003;
    float *p = rnd(n, 1), *g = rnd(n, 1), *m = rnd(n, 0.1f), *v = rnd(n, 0.01f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *dp = upf(p, n), *dg = upf(g, n), *dm = upf(m, n), *dv = upf(v, n);
    for (int t = 1; t <= 3; t++) {
        const float bc1 = 1.0f - powf(0.9f, (float)t), bc2 = 1.0f - powf(0.999f, (float)t);
        const float clip = t == 2 ? 0.25f : 1.0f, wd = t == 3 ? 0.1f : 0.0f;
        G->adamw(gpu, n, dp, dg, dm, dv, clip, 6e-4f, 0.9f, 0.999f, 1e-8f, wd, bc1, bc2);
        P->adamw(cpu, n, p, g, m, v, clip, 6e-4f, 0.9f, 0.999f, 1e-8f, wd, bc1, bc2);
    }
    compare(dp, p, n, 1e-6, "adamw x3: p");
    compare(dm, m, n, 1e-6, "adamw x3: m");
    compare(dv, v, n, 1e-6, "adamw x3: v");
    drop(dp), drop(dg), drop(dm), drop(dv);
    free(p), free(g), free(m), free(v);
}

/* ---- memory ---- */

static void test_memory(void) {
    void *d = NULL;
    CHECK_OK(G->alloc(gpu, 1000, &d));
    unsigned char h[1000];
    memset(h, 7, sizeof h);
    G->download(gpu, h, d, sizeof h);
    bool zero = true;
    for (int i = 0; i < 1000; i++) zero &= h[i] == 0;
    CHECK(zero, "alloc zero-fills");
    memset(h, 9, sizeof h);
    G->upload(gpu, d, h, sizeof h);
    G->zero(gpu, (char *)d + 100, 200);
    memset(h, 1, sizeof h);
    G->download(gpu, h, d, sizeof h);
    CHECK(h[99] == 9 && h[100] == 0 && h[299] == 0 && h[300] == 9, "zero clears only its range");
    G->free(gpu, d);
    void *huge = NULL;
    ds_error *e = G->alloc(gpu, (size_t)1 << 50, &huge);
    CHECK(e && !huge, "a 1 PiB allocation is refused");
    if (e) {
        printf("  alloc 1 PiB: %s\n", ds_error_message(e));
        ds_error_free(e);
    }
    /* and the device still works after it */
    float x = 3, *dx = upf(&x, 1);
    CHECK(G->sumsq(gpu, 1, dx) == 9, "the device works after a refused allocation");
    drop(dx);
}

static void teardown(void) {
    if (gpu) gpu->ops->destroy(gpu);
    if (cpu) cpu->ops->destroy(cpu);
}

RUN_TESTS("cuda_train", setup, test_memory, test_gemm, test_axpy, test_gather_scatter, test_rmsnorm,
          test_rmsnorm_bwd_repeatable, test_rope, test_attention, test_swiglu, test_loss, test_sumsq, test_adamw,
          teardown)
