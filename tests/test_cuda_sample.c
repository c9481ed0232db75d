/* The CUDA backend's argmax (argmax.cu) and sampling ops at T > 0
 * (sample.cu: probs, sample, verify_sample) against the CPU backend: argmax
 * equal with ties; distributions within SAMPLE_PROB_TOL, kept sets, draws
 * and rejection decisions identical but for borderline uniforms
 * (cuda_vs_cpu.h says which). Skips (exit 77) where no CUDA device can be
 * used. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/spec_ops.h"
#include "sample/draw.h"
#include "sample/probs.h"
#include "cuda_vs_cpu.h"

/* ---- argmax --------------------------------------------------------------- */

/* Row argmax, ties to the lowest index: coarse values make many exact ties,
 * including across the GPU's threads; a vocabulary-sized row too. */
static void test_argmax(void) {
    const int64_t R = 9, C = 151936;
    float *v = rand_vec((size_t)(R * C), 1.0f);
    for (int64_t i = 0; i < R * C; i++) v[i] = (float)(int)(v[i] * 8); /* 17 levels: ties everywhere */
    v[3 * C + 151935] = 100; /* maximum at the very end of row 3 */
    v[5 * C + 0] = 100;      /* and at the very start of row 5 */
    pair x = act(R, C, v);
    int32_t g[16], c[16];
    gpu->ops->argmax(gpu, x.g, g);
    cpu->ops->argmax(cpu, x.c, c);
    check_gpu_ok("argmax");
    int same = 0;
    for (int r = 0; r < R; r++) same += g[r] == c[r];
    printf("  argmax %lldx%lld with ties: %d/%lld rows equal the CPU's\n", (long long)R, (long long)C, same, (long long)R);
    CHECK(same == R, "argmax differs from the CPU on %lld rows", (long long)R - same);
    CHECK(c[3] == 151935 && c[5] == 0, "planted maxima at %d, %d", c[3], c[5]);
    release(&x);
    free(v);
}

/* ---- sampling at T > 0 (probs, sample, verify_sample) ---------------------- */

/* Logits of one of four shapes: 0 spread, 1 coarse (many exact ties), 2 peaked, 3 nearly flat. */
static void shaped_logits(float *x, int64_t V, int kind) {
    for (int64_t i = 0; i < V; i++) {
        const float f = frand();
        x[i] = kind == 0 ? 4.0f * f : kind == 1 ? (float)(int)(f * 8) / 2.0f : kind == 2 ? 16.0f * f : 0.05f * f;
    }
}

typedef struct {
    float p;
    int32_t id;
} ranked;

static int rank_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id > y->id ? 1 : -1;
}

/* How close the cuts of the unprocessed distribution plain[V] are to
 * deciding otherwise, relative: the gap between the k-th and (k+1)-th
 * probabilities (top-k) and between the cumulative mass and its target
 * (top-p); infinite without truncation. From a full ranking. */
static double cut_margin(const float *plain, int64_t V, const ds_sampling *s) {
    ranked *c = malloc((size_t)V * sizeof *c);
    for (int64_t i = 0; i < V; i++) c[i] = (ranked){plain[i], (int32_t)i};
    qsort(c, (size_t)V, sizeof *c, rank_desc);
    const int64_t keep = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    double mass = 0, cum = 0, margin = INFINITY;
    /* (an exact tie is no excuse: equal logits give equal probabilities on both sides, and the lower id wins) */
    if (keep < V && c[keep - 1].p != c[keep].p) margin = (c[keep - 1].p - c[keep].p) / c[keep - 1].p;
    if (!(s->top_p > 0 && s->top_p < 1.0f)) {
        free(c);
        return margin;
    }
    for (int64_t i = 0; i < keep; i++) mass += c[i].p;
    const double target = s->top_p * mass;
    for (int64_t i = 0; i < keep; i++) {
        cum += c[i].p;
        margin = fmin(margin, fabs(cum - target) / target);
        if (cum >= target) break;
    }
    free(c);
    return margin;
}

/* Processed distributions on both backends, compared. */
static void test_sample_probs(void) {
    const int64_t Vs[] = {151936, 3000, 7};
    const int R = 4;
    double worst = 0;
    int rows = 0, kept_differ = 0, borderline = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        const int64_t V = Vs[vi];
        float *l = malloc((size_t)(R * V) * sizeof *l), *g = malloc((size_t)(R * V) * sizeof *g);
        float *c = malloc((size_t)(R * V) * sizeof *c), *plain = malloc((size_t)V * sizeof *plain);
        for (int si = 0; si < N_SAMP; si++) {
            const ds_sampling s = samp(&SAMP[si]), sp = {.temperature = s.temperature, .top_p = 1.0f};
            for (int r = 0; r < R; r++) shaped_logits(l + (size_t)r * V, V, r);
            pair x = act(R, V, l), pg = act(R, V, NULL);
            gpu->ops->probs(gpu, pg.g, x.g, &s);
            cpu->ops->probs(cpu, pg.c, x.c, &s);
            check_gpu_ok("probs");
            gpu->ops->download(gpu, pg.g, g);
            cpu->ops->download(cpu, pg.c, c);
            const double err = rel_err_max(g, c, (size_t)(R * V));
            worst = fmax(worst, err);
            CHECK(err <= SAMPLE_PROB_TOL, "probs V=%lld T=%g k=%d p=%g: normalized error %.3g over %.0e", (long long)V,
                  (double)s.temperature, s.top_k, (double)s.top_p, err, SAMPLE_PROB_TOL);
            for (int r = 0; r < R; r++) {
                int64_t diff = 0;
                for (int64_t i = 0; i < V; i++) diff += (g[(size_t)r * V + i] > 0) != (c[(size_t)r * V + i] > 0);
                rows++;
                if (!diff) continue;
                ds_probs_from_logits(l + (size_t)r * V, (int)V, &sp, plain);
                const double m = cut_margin(plain, V, &s);
                if (m < SAMPLE_PROB_TOL) {
                    borderline++;
                } else {
                    kept_differ++;
                    CHECK(0, "probs V=%lld T=%g k=%d p=%g row %d (shape %d): %lld tokens kept by one side only "
                          "(cut margin %.3g)", (long long)V, (double)s.temperature, s.top_k, (double)s.top_p, r, r,
                          (long long)diff, m);
                }
            }
            release(&x);
            release(&pg);
        }
        free(l), free(g), free(c), free(plain);
    }
    printf("  probs (V 151936 / 3000 / 7, %d settings, 4 shapes): worst err %.2e (bound %.0e); kept sets equal in "
           "%d of %d rows, %d borderline cuts\n", N_SAMP, worst, SAMPLE_PROB_TOL, rows - kept_differ - borderline,
           rows, borderline);
}

/* Draws from the same rows (uploaded identically) with the same uniforms. */
static void test_sample_draw(void) {
    const int64_t Vs[] = {151936, 7};
    int draws = 0, differ = 0, excluded = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        const int64_t V = Vs[vi];
        const int R = 24;
        float *l = malloc((size_t)V * sizeof *l), *p = malloc((size_t)(R * V) * sizeof *p);
        for (int r = 0; r < R; r++) {
            float *row = p + (size_t)r * V;
            if (r == R - 2) { /* one-hot */
                memset(row, 0, (size_t)V * sizeof *row);
                row[V / 2] = 1.0f;
            } else if (r == R - 1) { /* nothing: the host returns 0 */
                memset(row, 0, (size_t)V * sizeof *row);
            } else {
                shaped_logits(l, V, r % 4);
                const ds_sampling s = samp(&SAMP[r % N_SAMP]);
                ds_probs_from_logits(l, (int)V, &s, row);
            }
        }
        pair pp = act(R, V, p);
        for (int trial = 0; trial < 8; trial++) {
            double u[24];
            for (int r = 0; r < R; r++) u[r] = trial == 0 ? 0.0 : trial == 1 ? 0.9999999999999999 : ds_rng_uniform(&urng);
            int32_t g[24], c[24];
            gpu->ops->sample(gpu, pp.g, u, g);
            cpu->ops->sample(cpu, pp.c, u, c);
            check_gpu_ok("sample");
            for (int r = 0; r < R; r++) {
                draws++;
                if (g[r] == c[r]) continue;
                if (draw_margin(p + (size_t)r * V, V, u[r]) < DRAW_EPS) {
                    excluded++;
                    continue;
                }
                differ++;
                CHECK(0, "sample V=%lld row %d u=%.17g: gpu %d, cpu %d", (long long)V, r, u[r], g[r], c[r]);
            }
        }
        release(&pp);
        free(l), free(p);
    }
    printf("  sample: %d draws, %d differ, %d excluded (u within %.0e of a CDF step)\n", draws, differ, excluded,
           DRAW_EPS);
    CHECK(excluded * 50 <= draws, "%d of %d draws excluded", excluded, draws);
}

/* ds_verify_uniforms' rule on processed rows pt[n+1][V], pd[n][V]; *margin:
 * the closest any uniform came to its boundary (relative). */
static int host_rule(const float *pt, const float *pd, const int32_t *x, int n, int64_t V, const double *u,
                     float *res, int32_t *next, double *margin) {
    int a = 0;
    *margin = INFINITY;
    for (; a < n; a++) {
        const double q = pd[(size_t)a * V + x[a]];
        const double ratio = (double)pt[(size_t)a * V + x[a]] / (q > 1e-8 ? q : 1e-8);
        *margin = fmin(*margin, fabs(u[a] - ratio) / fmax(ratio, 1e-300));
        if (!(u[a] < ratio)) break;
    }
    const float *row = pt + (size_t)a * V;
    if (a < n) {
        double mass = 0;
        for (int64_t i = 0; i < V; i++) {
            const float r = row[i] - pd[(size_t)a * V + i];
            res[i] = r > 0 ? r : 0;
            mass += res[i];
        }
        if (mass > 1e-8) row = res;
    }
    *next = ds_sample_probs_u(row, (int)V, u[n]);
    *margin = fmin(*margin, draw_margin(row, V, u[n]));
    return a;
}

/* Rejection sampling rounds on both backends: the same (accepted, next). */
static void test_sample_verify(void) {
    const int64_t Vs[] = {151936, 3000};
    const int NS[] = {0, 1, 3, 8};
    int rounds = 0, differ = 0, excluded = 0, none = 0, partial = 0, all = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        const int64_t V = Vs[vi];
        const int NMAX = 8;
        float *tl = malloc((size_t)((NMAX + 1) * V) * sizeof *tl), *dl = malloc((size_t)V * sizeof *dl);
        float *dp = malloc((size_t)(NMAX * V) * sizeof *dp), *ptc = malloc((size_t)((NMAX + 1) * V) * sizeof *ptc);
        float *ptg = malloc((size_t)((NMAX + 1) * V) * sizeof *ptg), *res = malloc((size_t)V * sizeof *res);
        for (int si = 0; si < N_SAMP; si++) {
            const ds_sampling s = samp(&SAMP[si]);
            for (int trial = 0; trial < (V > 100000 ? 4 : 12); trial++) {
                const int n = NS[trial % 4];
                int32_t x[8];
                for (int r = 0; r <= n; r++) shaped_logits(tl + (size_t)r * V, V, (trial / 4 + r) % 3);
                for (int i = 0; i < n; i++) {
                    const float noise = trial % 2 ? 0.2f : 2.0f;
                    for (int64_t j = 0; j < V; j++) dl[j] = tl[(size_t)i * V + j] + noise * frand();
                    ds_probs_from_logits(dl, (int)V, &s, dp + (size_t)i * V);
                    x[i] = ds_sample_probs(dp + (size_t)i * V, (int)V, &urng);
                }
                double u[9];
                for (int i = 0; i <= n; i++) u[i] = ds_rng_uniform(&urng);
                pair lt = act(n + 1, V, tl), pd = act(n > 0 ? n : 1, V, n > 0 ? dp : NULL), pt = act(n + 1, V, NULL);
                const ds_tensor dg = n > 0 ? pd.g : ds_no_tensor(), dc = n > 0 ? pd.c : ds_no_tensor();
                int32_t g[2], c[2];
                ds_spec(gpu)->verify_sample(gpu, lt.g, x, n, dg, &s, u, g);
                ds_spec(cpu)->verify_sample(cpu, lt.c, x, n, dc, &s, u, c);
                gpu->ops->probs(gpu, pt.g, lt.g, &s); /* for the borderline analysis */
                cpu->ops->probs(cpu, pt.c, lt.c, &s);
                check_gpu_ok("verify_sample");
                gpu->ops->download(gpu, pt.g, ptg);
                cpu->ops->download(cpu, pt.c, ptc);
                int32_t want_c, want_g;
                double mc, mg;
                const int ac = host_rule(ptc, dp, x, n, V, u, res, &want_c, &mc);
                const int ag = host_rule(ptg, dp, x, n, V, u, res, &want_g, &mg);
                CHECK(c[0] == ac && c[1] == want_c, "cpu verify_sample (%d, %d) vs the host rule (%d, %d)", c[0], c[1],
                      ac, want_c);
                rounds++;
                if (n > 0) none += ac == 0, partial += ac > 0 && ac < n, all += ac == n;
                if (g[0] != c[0] || g[1] != c[1]) {
                    if (ac != ag || want_c != want_g || fmin(mc, mg) < DRAW_EPS) {
                        excluded++;
                    } else {
                        differ++;
                        CHECK(0, "verify_sample V=%lld T=%g k=%d p=%g n=%d: gpu (%d, %d), cpu (%d, %d)", (long long)V,
                              (double)s.temperature, s.top_k, (double)s.top_p, n, g[0], g[1], c[0], c[1]);
                    }
                }
                release(&lt), release(&pd), release(&pt);
            }
        }
        free(tl), free(dl), free(dp), free(ptc), free(ptg), free(res);
    }
    printf("  verify_sample: %d rounds (%d reject the first draft, %d accept part, %d accept all), %d differ, "
           "%d excluded (borderline)\n", rounds, none, partial, all, differ, excluded);
    CHECK(excluded * 50 <= rounds, "%d of %d rounds excluded", excluded, rounds);
    CHECK(none > 0 && partial > 0 && all > 0, "every acceptance path is exercised");
    /* Greedy is argmax's business; more drafts than a launch takes are refused. */
    pair l = act_rand(2, 16, 1.0f);
    const ds_sampling greedy = {.temperature = 0.0f, .top_p = 1.0f}, t1 = {.temperature = 1.0f, .top_p = 1.0f};
    const double u[2] = {0.5, 0.5};
    int32_t out[2];
    ds_spec(gpu)->verify_sample(gpu, l.g, NULL, 0, ds_no_tensor(), &greedy, u, out);
    CHECK_ERR(ds_backend_check(gpu), "greedy");
    int32_t many[65] = {0};
    ds_spec(gpu)->verify_sample(gpu, l.g, many, 65, l.g, &t1, u, out);
    CHECK_ERR(ds_backend_check(gpu), "cuda verify_sample");
    release(&l);
}

/* verify_sample_many (a batched step's verifications, one wait) against
 * verify_sample job by job on the GPU: the same (accepted, next) for every
 * job, with every sampling rule (spread and block-per-row distributions),
 * 0..8 drafts, in one call; then a failing job (a draft outside the
 * vocabulary) records an error instead of running on. */
static void test_sample_verify_many(void) {
    const int64_t V = 3000;
    enum { M = 12, NMAX = 8 };
    float *tl = malloc((size_t)M * (NMAX + 1) * V * sizeof *tl), *dp = malloc((size_t)M * NMAX * V * sizeof *dp);
    float *dl = malloc((size_t)V * sizeof *dl);
    ds_sampling sv[M];
    int32_t x[M][NMAX], one[M][2], many[2 * M];
    double u[M][NMAX + 1];
    pair lt[M], pd[M];
    ds_verify_job jobs[M];
    for (int j = 0; j < M; j++) {
        const int n = (j * 3) % (NMAX + 1);
        sv[j] = samp(&SAMP[j % N_SAMP]);
        float *tj = tl + (size_t)j * (NMAX + 1) * V, *dj = dp + (size_t)j * NMAX * V;
        for (int r = 0; r <= n; r++) shaped_logits(tj + (size_t)r * V, V, (j + r) % 3);
        for (int i = 0; i < n; i++) {
            for (int64_t k = 0; k < V; k++) dl[k] = tj[(size_t)i * V + k] + (j % 2 ? 0.2f : 2.0f) * frand();
            ds_probs_from_logits(dl, (int)V, &sv[j], dj + (size_t)i * V);
            x[j][i] = ds_sample_probs(dj + (size_t)i * V, (int)V, &urng);
        }
        for (int i = 0; i <= n; i++) u[j][i] = ds_rng_uniform(&urng);
        lt[j] = act(n + 1, V, tj);
        pd[j] = act(n > 0 ? n : 1, V, n > 0 ? dj : NULL);
        jobs[j] = (ds_verify_job){.logits = lt[j].g, .draft_probs = n > 0 ? pd[j].g : ds_no_tensor(), .draft = x[j],
                                  .n = n, .s = &sv[j], .u = u[j]};
        ds_spec(gpu)->verify_sample(gpu, jobs[j].logits, x[j], n, jobs[j].draft_probs, &sv[j], u[j], one[j]);
    }
    ds_spec(gpu)->verify_sample_many(gpu, M, jobs, many);
    check_gpu_ok("verify_sample_many");
    int same = 0;
    for (int j = 0; j < M; j++) same += many[2 * j] == one[j][0] && many[2 * j + 1] == one[j][1];
    printf("  verify_sample_many: %d of %d jobs (0..8 drafts, %d rules) equal verify_sample's\n", same, M, N_SAMP);
    CHECK(same == M, "%d of %d jobs differ from verify_sample alone", M - same, M);
    x[2][0] = (int32_t)V; /* job 2 has drafts (n = 6): one outside the vocabulary */
    ds_spec(gpu)->verify_sample_many(gpu, M, jobs, many);
    CHECK_ERR(ds_backend_check(gpu), "outside the vocabulary");
    for (int j = 0; j < M; j++) release(&lt[j]), release(&pd[j]);
    free(tl), free(dp), free(dl);
}

/* verify_sample_many's runs of jobs without drafts (sequences that did not
 * draft: rows of one logits tensor, one rule) taken as one batch of rows,
 * against verify_sample on each: the same tokens. V 151936 (many slices)
 * and 3000; runs broken by a rule change, a job with drafts, a gap in the
 * rows, and 70 rows (past one launch's 64). */
static void test_sample_verify_runs(void) {
    enum { M = 80 };
    static const int64_t Vs[2] = {151936, 3000};
    static const int rule[] = {0, 1, 2, 3, 7, 8}; /* SAMP's settings the spread path takes */
    for (int vi = 0; vi < 2; vi++) {
        const int64_t V = Vs[vi];
        float *tl = malloc((size_t)(M + 2) * V * sizeof *tl), *dp = malloc((size_t)V * sizeof *dp);
        for (int r = 0; r < M + 2; r++) shaped_logits(tl + (size_t)r * V, V, r % 3);
        pair lt = act(M + 2, V, tl); /* 80 jobs, one of 2 rows, one row skipped */
        ds_sampling sv[M];
        ds_verify_job jobs[M];
        double u[M][2];
        int32_t one[M][2], many[2 * M], x = 7;
        int row = 0;
        for (int j = 0; j < M; j++) {
            /* rows 0..69 one rule, then runs of 3 of other rules; job 72 drafts one token; a row skipped at 75 */
            sv[j] = samp(&SAMP[j < 70 ? 0 : rule[1 + (j - 70) / 3 % 5]]);
            if (j == 75) row++;
            u[j][0] = ds_rng_uniform(&urng), u[j][1] = ds_rng_uniform(&urng);
            const int n = j == 72;
            jobs[j] = (ds_verify_job){.logits = ds_rows(lt.g, row, n + 1), .draft = &x, .n = n, .s = &sv[j], .u = u[j]};
            row += n + 1;
        }
        ds_probs_from_logits(tl + (size_t)73 * V, (int)V, &sv[72], dp); /* job 72's draft distribution */
        pair pd = act(1, V, dp);
        jobs[72].draft_probs = pd.g;
        for (int j = 0; j < M; j++)
            ds_spec(gpu)->verify_sample(gpu, jobs[j].logits, jobs[j].draft, jobs[j].n, jobs[j].draft_probs, jobs[j].s,
                                        jobs[j].u, one[j]);
        ds_spec(gpu)->verify_sample_many(gpu, M, jobs, many);
        check_gpu_ok("verify_sample_many (runs)");
        int same = 0;
        for (int j = 0; j < M; j++) same += many[2 * j] == one[j][0] && many[2 * j + 1] == one[j][1];
        printf("  verify_sample_many, runs without drafts (V %lld): %d of %d jobs equal verify_sample's\n",
               (long long)V, same, M);
        CHECK(same == M, "V %lld: %d of %d jobs differ from verify_sample alone", (long long)V, M - same, M);
        release(&lt), release(&pd);
        free(tl), free(dp);
    }
}

RUN_CUDA_TESTS("cuda_sample", test_argmax, test_sample_probs, test_sample_draw, test_sample_verify,
               test_sample_verify_many, test_sample_verify_runs)
