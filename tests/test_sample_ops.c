/* The CPU backend's sampling ops (backend.h probs, sample, verify_sample,
 * markov_sample) against the host functions they stand for, bit for bit:
 * ds_probs_from_logits, ds_sample_probs, ds_verify (same seed, same
 * uniforms consumed) and draft/markov.c's host walk. Then whole
 * generations: a CPU backend with the ops and one without them (the host
 * path: logits downloaded, sample/verify.c) give the same tokens for the
 * same seeds, and so does a custom verifier hook (p->verify). The GPU's
 * ops are checked against these in test_cuda_sample; with DS_BACKEND=cuda the
 * generations run on the GPU (its sampling ops against the host path on
 * the same logits: the distributions agree to the last bit or so, so the
 * tokens must be the same barring a uniform within ~1e-12 of a boundary). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/spec_ops.h"
#include "base/dtype.h"
#include "draft/drafter.h"
#include "sample/draw.h"
#include "sample/probs.h"
#include "sample/verify.h"
#include "speculate/generate.h"
#include "testlib.h"

static ds_backend *cpu;
static ds_rng rng;

static float frand(void) { return (float)(2.0 * ds_rng_uniform(&rng) - 1.0); }

/* Logits: `levels` > 0 quantizes them (many exact ties); scale sets how peaked. */
static void rand_logits(float *x, int64_t n, float scale, int levels) {
    for (int64_t i = 0; i < n; i++) {
        float v = frand() * scale;
        x[i] = levels > 0 ? roundf(v * (float)levels) / (float)levels : v;
    }
}

static ds_tensor host_tensor(int64_t rows, int64_t cols) {
    ds_tensor t = ds_no_tensor();
    ds_error *e = cpu->ops->alloc(cpu, DS_F32, rows, cols, &t);
    if (e) {
        CHECK(0, "alloc: %s", ds_error_message(e));
        ds_error_free(e);
    }
    return t;
}

static const float *row_of(ds_tensor t, int64_t r) { return (const float *)t.data + r * t.stride; }

typedef struct {
    float T;
    int k;
    float p;
} setting;

static const setting SETTINGS[] = {{1.0f, 0, 1.0f},  {0.7f, 20, 1.0f}, {1.0f, 0, 0.8f},  {0.8f, 50, 0.9f},
                                   {1.3f, 1, 1.0f},  {0.5f, 0, 0.05f}, {0.9f, 400, 0.97f}, {2.0f, 3000, 0.5f}};
#define N_SETTINGS (int)(sizeof SETTINGS / sizeof SETTINGS[0])

static ds_sampling sampling_of(const setting *st) {
    ds_sampling s = {.temperature = st->T, .top_k = st->k, .top_p = st->p};
    return s;
}

static void check_cpu_ok(const char *what) {
    ds_error *e = ds_backend_check(cpu);
    if (e) {
        CHECK(0, "%s: %s", what, ds_error_message(e));
        ds_error_free(e);
    }
}

/* probs op == ds_probs_from_logits per row, through strided views too. */
static void test_probs_op(void) {
    const int64_t Vs[] = {1, 7, 3000, 151936};
    int rows_checked = 0, differ = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        const int64_t V = Vs[vi], R = 3, pad = 5;
        ds_tensor lt = host_tensor(R, V + pad), pt = host_tensor(R, V + pad);
        ds_tensor l = ds_cols(lt, pad, V), p = ds_cols(pt, 0, V);
        float *want = malloc((size_t)V * sizeof *want);
        for (int si = 0; si < N_SETTINGS; si++) {
            const ds_sampling s = sampling_of(&SETTINGS[si]);
            for (int64_t r = 0; r < R; r++)
                rand_logits((float *)l.data + r * l.stride, V, r == 2 ? 12.0f : 4.0f, r == 1 ? 4 : 0);
            cpu->ops->probs(cpu, p, l, &s);
            check_cpu_ok("probs");
            for (int64_t r = 0; r < R; r++) {
                ds_probs_from_logits(row_of(l, r), (int)V, &s, want);
                differ += memcmp(want, row_of(p, r), (size_t)V * sizeof *want) != 0;
                rows_checked++;
            }
        }
        free(want);
        cpu->ops->release(cpu, &lt);
        cpu->ops->release(cpu, &pt);
    }
    printf("  probs: %d rows, %d differ from ds_probs_from_logits\n", rows_checked, differ);
    CHECK(differ == 0, "%d of %d rows differ", differ, rows_checked);
}

/* sample op == ds_sample_probs with the uniform it would draw. */
static void test_sample_op(void) {
    const int64_t V = 3000, R = 16;
    ds_tensor l = host_tensor(R, V), p = host_tensor(R, V);
    const ds_sampling s = {.temperature = 1.0f, .top_k = 0, .top_p = 0.9f};
    int differ = 0;
    for (int trial = 0; trial < 20; trial++) {
        for (int64_t r = 0; r < R; r++) rand_logits((float *)l.data + r * l.stride, V, 6.0f, 0);
        cpu->ops->probs(cpu, p, l, &s);
        ds_rng a, b;
        ds_rng_seed(&a, 1000 + (uint64_t)trial);
        b = a;
        double u[16];
        for (int64_t r = 0; r < R; r++) u[r] = ds_rng_uniform(&a);
        int32_t got[16];
        cpu->ops->sample(cpu, p, u, got);
        for (int64_t r = 0; r < R; r++) differ += got[r] != ds_sample_probs(row_of(p, r), (int)V, &b);
    }
    check_cpu_ok("sample");
    CHECK(differ == 0, "%d draws differ from ds_sample_probs", differ);
    /* the rounding fallback: u just below 1 draws the last nonzero id */
    float q[6] = {0.25f, 0, 0.5f, 0.25f, 0, 0};
    CHECK(ds_sample_probs_u(q, 6, 0.9999999999999999) == 3, "fallback to the last nonzero id");
    CHECK(ds_sample_probs_u(q, 6, 0.0) == 0 && ds_sample_probs_u(q, 6, 0.25) == 2, "first step, zero skipped");
    cpu->ops->release(cpu, &l);
    cpu->ops->release(cpu, &p);
}

/* Draft distributions that agree with the target's in part: some drafts
 * are accepted, some rejected (residual path), some rounds take all. */
static void make_round(float *tl, int V, int n, const ds_sampling *s, float *dl, float *dp, int32_t *draft,
                       float noise) {
    rand_logits(tl, (int64_t)(n + 1) * V, 5.0f, 0);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < V; j++) dl[j] = tl[(size_t)i * V + j] + noise * frand();
        ds_probs_from_logits(dl, V, s, dp + (size_t)i * V);
        draft[i] = ds_sample_probs(dp + (size_t)i * V, V, &rng);
    }
}

/* verify_sample op == ds_verify: same (accepted, next), same uniforms used. */
static void test_verify_op(void) {
    const int V = 3000, NMAX = 8;
    float *tl = malloc((size_t)(NMAX + 1) * V * sizeof *tl), *dl = malloc((size_t)V * sizeof *dl);
    float *dp = malloc((size_t)NMAX * V * sizeof *dp), *scratch = malloc((size_t)2 * V * sizeof *scratch);
    ds_tensor lt = host_tensor(NMAX + 1, V), pt = host_tensor(NMAX, V);
    int differ = 0, rounds = 0, none = 0, partial = 0, all = 0;
    for (int si = 0; si < N_SETTINGS; si++) {
        const ds_sampling s = sampling_of(&SETTINGS[si]);
        for (int trial = 0; trial < 40; trial++) {
            const int n = trial % (NMAX + 1);
            int32_t draft[NMAX];
            make_round(tl, V, n, &s, dl, dp, draft, trial % 3 == 0 ? 0.3f : 2.0f);
            cpu->ops->upload(cpu, ds_rows(lt, 0, n + 1), tl);
            if (n) cpu->ops->upload(cpu, ds_rows(pt, 0, n), dp);
            ds_rng a, b;
            ds_rng_seed(&a, 77 + (uint64_t)(si * 100 + trial));
            b = a;
            int32_t want_next;
            const int want_a = ds_verify(tl, V, draft, n, dp, &s, &a, scratch, &want_next);
            double u[NMAX + 1];
            for (int i = 0; i <= n; i++) u[i] = ds_rng_uniform(&b);
            int32_t got[2];
            ds_spec(cpu)->verify_sample(cpu, ds_rows(lt, 0, n + 1), draft, n, n ? ds_rows(pt, 0, n) : ds_no_tensor(), &s,
                                    u, got);
            differ += got[0] != want_a || got[1] != want_next || ds_rng_next(&a) != ds_rng_next(&b);
            rounds++;
            if (n > 0) {
                none += want_a == 0;
                partial += want_a > 0 && want_a < n;
                all += want_a == n;
            }
        }
    }
    check_cpu_ok("verify_sample");
    printf("  verify_sample: %d rounds (%d reject at once, %d partly accepted, %d all accepted), %d differ\n", rounds,
           none, partial, all, differ);
    CHECK(differ == 0, "%d of %d rounds differ from ds_verify", differ, rounds);
    CHECK(none > 0 && partial > 0 && all > 0, "every acceptance path is exercised");
    free(tl);
    free(dl);
    free(dp);
    free(scratch);
    cpu->ops->release(cpu, &lt);
    cpu->ops->release(cpu, &pt);
}

/* A [rows, cols] weight of dtype dt (values exact in bf16), host bytes in *host. */
static ds_tensor make_weight(ds_dtype dt, int64_t rows, int64_t cols, void **host) {
    const size_t n = (size_t)(rows * cols);
    *host = malloc(n * ds_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        float f = (float)((int)(frand() * 1023.0f)) / 256.0f;
        if (dt == DS_BF16) ((uint16_t *)*host)[i] = ds_f32_to_bf16(f);
        else ((float *)*host)[i] = f;
    }
    ds_st_tensor st = {.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = *host,
                       .nbytes = n * ds_dtype_size(dt)};
    ds_tensor t = ds_no_tensor();
    ds_error *e = cpu->ops->weight(cpu, &st, rows, cols, &t);
    if (e) {
        CHECK(0, "weight: %s", ds_error_message(e));
        ds_error_free(e);
    }
    return t;
}

/* markov_sample == draft/markov.c's host walk (embed, 1-row linear, bias
 * add with bf16 rounding, ds_probs_from_logits, ds_sample_probs). */
static void test_markov_sample_op(void) {
    const int64_t G = 6, V = 2500, r = 24, H = 40;
    int differ = 0, cases = 0;
    for (int head = 0; head < 3; head++) { /* fp32 head, bf16 head, no head */
        const bool markov = head < 2, bf16 = head == 1;
        void *h1 = NULL, *h2 = NULL;
        ds_tensor w1 = markov ? make_weight(bf16 ? DS_BF16 : DS_F32, V, r, &h1) : ds_no_tensor();
        ds_tensor w2 = markov ? make_weight(bf16 ? DS_BF16 : DS_F32, V, r, &h2) : ds_no_tensor();
        ds_tensor base = host_tensor(G, V), out = host_tensor(G, V), probs = host_tensor(G, V);
        ds_tensor feat = host_tensor(G, H + r + 1), e1 = host_tensor(1, r), b1 = host_tensor(1, V);
        ds_tensor emb = markov ? ds_cols(feat, H, r) : ds_no_tensor();
        float *logits = malloc((size_t)V * sizeof *logits), *want = malloc((size_t)V * sizeof *want);
        for (int si = 0; si < N_SETTINGS; si++) {
            const ds_sampling s = sampling_of(&SETTINGS[si]);
            rand_logits(base.data, G * V, 3.0f, si % 2 ? 0 : 8);
            if (bf16) ds_round_bf16_n(base.data, (size_t)(G * V));
            ds_rng a, b;
            ds_rng_seed(&a, 4242 + (uint64_t)(head * 100 + si));
            b = a;
            double u[8];
            for (int k = 0; k < G; k++) u[k] = ds_rng_uniform(&a);
            int32_t got[8];
            const int32_t anchor = (int32_t)(si * 97 % V);
            ds_spec(cpu)->markov_sample(cpu, base, si % 2 ? out : ds_no_tensor(), probs, w1, w2, bf16, anchor, &s, u, emb,
                                    got);
            check_cpu_ok("markov_sample");
            int32_t prev = anchor;
            for (int k = 0; k < G; k++) {
                memcpy(logits, row_of(base, k), (size_t)V * sizeof *logits);
                if (markov) {
                    cpu->ops->embed(cpu, e1, w1, &prev, 1.0f);
                    differ += memcmp(e1.data, row_of(emb, k), (size_t)r * sizeof(float)) != 0;
                    cpu->ops->linear(cpu, b1, e1, w2, ds_no_tensor());
                    float *bias = b1.data;
                    if (bf16) ds_round_bf16_n(bias, (size_t)V);
                    for (int64_t i = 0; i < V; i++) logits[i] += bias[i];
                    if (bf16) ds_round_bf16_n(logits, (size_t)V);
                }
                if (si % 2) differ += memcmp(logits, row_of(out, k), (size_t)V * sizeof *logits) != 0;
                ds_probs_from_logits(logits, (int)V, &s, want);
                differ += memcmp(want, row_of(probs, k), (size_t)V * sizeof *want) != 0;
                prev = ds_sample_probs(want, (int)V, &b);
                differ += prev != got[k];
            }
            differ += ds_rng_next(&a) != ds_rng_next(&b);
            cases++;
        }
        free(logits);
        free(want);
        ds_tensor *all[] = {&w1, &w2, &base, &out, &probs, &feat, &e1, &b1};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cpu->ops->release(cpu, all[i]);
        free(h1);
        free(h2);
    }
    printf("  markov_sample: %d walks (fp32, bf16, no head), %d mismatches with the host walk\n", cases, differ);
    CHECK(differ == 0, "%d mismatches", differ);
}

static void test_greedy_refused(void) {
    ds_tensor l = host_tensor(1, 10), p = host_tensor(1, 10);
    const ds_sampling g = {.temperature = 0.0f, .top_p = 1.0f};
    cpu->ops->probs(cpu, p, l, &g);
    CHECK_ERR(ds_backend_check(cpu), "greedy");
    const double u = 0.5;
    int32_t out[2];
    ds_spec(cpu)->verify_sample(cpu, l, NULL, 0, ds_no_tensor(), &g, &u, out);
    CHECK_ERR(ds_backend_check(cpu), "greedy");
    cpu->ops->release(cpu, &l);
    cpu->ops->release(cpu, &p);
}

/* ---- whole generations ---------------------------------------------------- */

#define FIX DS_TESTDATA "/fixtures/qwen3-tiny"

typedef struct {
    ds_backend *be;
    ds_target *t;
    ds_drafter *d;
} models;

static ds_backend_ops host_path_ops; /* the CPU backend's table without the sampling ops */
static ds_spec_ops host_path_spec;

/* On test_backend_new's backend: the CPU, or the GPU with DS_BACKEND=cuda
 * (where this compares the device's sampling with the host path's). */
static ds_error *open_models(models *m, bool sampling_ops) {
    DS_TRY(test_backend_new(&m->be));
    if (!sampling_ops) {
        host_path_ops = *m->be->ops;
        host_path_ops.probs = NULL;
        host_path_ops.sample = NULL;
        host_path_spec = *ds_spec(m->be);
        host_path_spec.verify_sample = NULL;
        host_path_spec.markov_sample = NULL;
        host_path_spec.markov_sample_latent = NULL;
        host_path_ops.spec = &host_path_spec;
        m->be->ops = &host_path_ops;
    }
    DS_TRY(ds_target_open(m->be, FIX "/target", NULL, &m->t));
    DS_TRY(ds_drafter_open(m->be, FIX "/drafter-trained", m->t, NULL, &m->d));
    return NULL;
}

static void close_models(models *m) {
    if (m->d) ds_drafter_free(m->d);
    if (m->t) ds_target_free(m->t);
    if (m->be) m->be->ops->destroy(m->be);
}

static bool same_result(const ds_gen_result *a, const ds_gen_result *b) {
    if (a->n_tokens != b->n_tokens || a->rounds != b->rounds) return false;
    if (memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof *a->tokens)) return false;
    for (int i = 0; i < a->rounds; i++)
        if (a->accepted[i] != b->accepted[i] || a->proposed[i] != b->proposed[i]) return false;
    return true;
}

static void test_generate_paths_agree(void) {
    models ops = {0}, host = {0};
    ds_error *e = open_models(&ops, true);
    if (!e) e = open_models(&host, false);
    if (e) {
        close_models(&ops);
        close_models(&host);
        CHECK_OK(e);
    }
    CHECK(ops.d->probs.data != NULL && host.d->probs.data == NULL, "the drafters take the two paths");
    static const int32_t prompt[] = {141, 232}; /* test_lossless_sampling's: the drafter often agrees */
    int runs = 0, differ = 0, hook_differ = 0;
    long rounds = 0, accepted = 0, proposed = 0;
    for (int si = 0; si < N_SETTINGS; si++) {
        for (int seed = 0; seed < 6; seed++) {
            ds_gen_params p = {.max_new = 24, .sampling = sampling_of(&SETTINGS[si]), .seed = 99 + (uint64_t)seed,
                               .gamma = seed % 3 == 2 ? 1 : 0, .ignore_stop = true};
            ds_gen_result a, b, c;
            e = ds_generate(ops.t, ops.d, prompt, 2, &p, NULL, NULL, &a);
            if (e) CHECK_OK(e);
            e = ds_generate(host.t, host.d, prompt, 2, &p, NULL, NULL, &b);
            if (e) {
                ds_gen_result_free(&a);
                CHECK_OK(e);
            }
            p.verify = ds_verify; /* a host verifier hook on the backend that samples */
            e = ds_generate(ops.t, ops.d, prompt, 2, &p, NULL, NULL, &c);
            if (e) {
                ds_gen_result_free(&a);
                ds_gen_result_free(&b);
                CHECK_OK(e);
            }
            differ += !same_result(&a, &b);
            hook_differ += !same_result(&a, &c);
            runs++;
            for (int i = 0; i < a.rounds; i++) accepted += a.accepted[i], proposed += a.proposed[i];
            rounds += a.rounds;
            ds_gen_result_free(&a);
            ds_gen_result_free(&b);
            ds_gen_result_free(&c);
        }
    }
    printf("  generate: %d runs, %ld rounds, %ld of %ld drafts accepted; %d differ between the op and host paths, "
           "%d with the verifier hook\n", runs, rounds, accepted, proposed, differ, hook_differ);
    CHECK(differ == 0, "%d of %d generations differ between the sampling ops and the host path", differ, runs);
    CHECK(hook_differ == 0, "%d of %d generations differ with a host verifier hook", hook_differ, runs);
    CHECK(accepted > 0 && accepted < proposed, "acceptance is partial (%ld of %ld)", accepted, proposed);
    close_models(&ops);
    close_models(&host);
}

static void setup(void) {
    ds_rng_seed(&rng, 2024);
    CHECK_OK(ds_backend_cpu_new(2, &cpu));
}
static void teardown(void) { cpu->ops->destroy(cpu); }

RUN_TESTS("sample_ops", setup, test_probs_op, test_sample_op, test_verify_op, test_markov_sample_op,
          test_greedy_refused, test_generate_paths_agree, teardown)
