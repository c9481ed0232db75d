/* Lossless speculative sampling, checked statistically (SPEC §5, T > 0).
 *
 * The qwen3-tiny target with the trained drafter (acceptance is partial, so
 * both the accept and the residual paths run; with gamma = 1 the bonus after
 * an accepted draft too) continues a fixed prompt by NEW = 3 tokens, once
 * per seed, through ds_generate (a later round would only re-run the
 * second-round paths, so the generation stops at NEW). The exact joint
 * distribution of the NEW tokens under the target alone is computed by
 * enumeration: ds_target_forward on prompt + prefix, ds_probs_from_logits
 * with the same temperature / top-k / top-p. A chi-square goodness-of-fit
 * test compares the two: every outcome whose expected count is >= 5 is a
 * bin, everything else is pooled into one bin; the p-value is the upper tail
 * of the chi-square distribution (regularized incomplete gamma, below).
 *
 * Significance level ALPHA = 1e-3 per run. The seeds are fixed, so the
 * verdicts are deterministic. The real verifier must give p >= ALPHA; two
 * broken verifiers (accept every draft; on rejection sample the correction
 * from p_t instead of the residual max(0, p_t - p_d)) go through the very
 * same test and must give p < ALPHA, which shows the test has the power to
 * see a wrong verifier. The real verifier runs N_FULL = 20,000 samples per
 * configuration, each broken one N_BROKEN = 5,000 (they miss by hundreds of
 * standard deviations; this keeps the test near 45 s of 2-core time in a
 * Release build). The acceptance rate of every run is printed, and the real
 * runs must have 0 < rate < 1 with rounds that accept and rounds that reject.
 *
 * Samples are spread over worker threads (one backend + target + drafter
 * each); sample i always uses seed SEED + i and lands in slot i, so the
 * result does not depend on the thread count. DS_TEST_QUICK (set, not "0";
 * CI sets it for the ASan build) runs a quarter of the samples, never fewer
 * than 5,000: the real verifier then runs 5,000, the broken ones still 5,000. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "batch/batch.h"
#include "draft/drafter.h"
#include "sample/draw.h"
#include "sample/probs.h"
#include "sample/verify.h"
#include "speculate/generate.h"
#include "testlib.h"

#define FIX DS_TESTDATA "/fixtures/qwen3-tiny"
#define ALPHA 1e-3
#define NEW 3            /* tokens per sample: outcomes are triples (x1, x2, x3) */
#define MIN_EXPECTED 5.0 /* bins with a smaller expected count are pooled */
#define N_FULL 20000     /* samples per configuration with the real verifier */
#define N_BROKEN 5000    /* samples per configuration with a broken verifier */
#define N_QUICK_MIN 5000
#define MAX_WORKERS 4

/* A short prompt (the prefill of every sample is most of the cost) on which
 * the target is uncertain (next-token entropy about 2 nats at T = 1) and the
 * trained drafter often agrees with it: the first draft is accepted with
 * probability 0.28..0.50 under the settings below, which gives the residual
 * rule plenty to get wrong. */
static const int32_t PROMPT[] = {141, 232};
#define N_PROMPT ((int)(sizeof PROMPT / sizeof PROMPT[0]))

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- chi-square upper tail ------------------------------------------------ */

/* Q(a, x) = Gamma(a, x) / Gamma(a): the series for P when x < a + 1, else
 * the continued fraction for Q (modified Lentz), as in Numerical Recipes. */
static double gamma_q(double a, double x) {
    if (x <= 0) return 1.0;
    double front = exp(-x + a * log(x) - lgamma(a));
    if (x < a + 1) {
        double ap = a, del = 1.0 / a, sum = del;
        for (int n = 0; n < 10000 && fabs(del) > fabs(sum) * 1e-16; n++) {
            ap += 1;
            del *= x / ap;
            sum += del;
        }
        return 1.0 - sum * front;
    }
    const double tiny = 1e-300;
    double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
    for (int i = 1; i < 10000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-16) break;
    }
    return front * h;
}

/* P(X >= stat) for X ~ chi-square with df degrees of freedom. */
static double chi2_pvalue(double stat, int df) { return gamma_q(0.5 * df, 0.5 * stat); }

/* Closed forms: df = 1: erfc(sqrt(x/2)); even df: exp(-x/2) sum_{k<df/2} (x/2)^k / k!. */
static double chi2_pvalue_ref(double x, int df) {
    if (df == 1) return erfc(sqrt(0.5 * x));
    double term = exp(-0.5 * x), sum = 0;
    for (int k = 0; k < df / 2; k++) {
        sum += term;
        term *= 0.5 * x / (k + 1);
    }
    return sum;
}

static void test_chi2_pvalue(void) {
    static const struct {
        int df;
        double x;
    } cases[] = {{1, 0.1},   {1, 3.841458820694124}, {1, 30},    {2, 0.5},  {2, 13.815510557964274},
                 {4, 1},     {4, 30},                {10, 5},    {10, 40},  {100, 80},
                 {100, 150}, {200, 260},             {400, 600}, {60, 600}, {2, 1400}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = chi2_pvalue(cases[i].x, cases[i].df), want = chi2_pvalue_ref(cases[i].x, cases[i].df);
        CHECK(fabs(got - want) <= 1e-9 * want + 1e-300, "df %d x %g: p %.15g, want %.15g", cases[i].df, cases[i].x,
              got, want);
    }
    CHECK(fabs(chi2_pvalue(3.841458820694124, 1) - 0.05) < 1e-12, "5%% point of chi2(1)");
    CHECK(chi2_pvalue(0, 7) == 1.0, "p(0) = 1");
}

/* ---- models --------------------------------------------------------------- */

typedef struct {
    ds_backend *be;
    ds_target *t;
    ds_drafter *d;
} models;

static models W[MAX_WORKERS];
static int n_workers;

static ds_error *open_models(models *m, bool cpu) {
    DS_TRY(cpu ? ds_backend_cpu_new(1, &m->be) : test_backend_new(&m->be));
    DS_TRY(ds_target_open(m->be, FIX "/target", NULL, &m->t));
    /* DS_TEST_DRAFTER: another drafter for the same target (tests/CMakeLists.txt runs the gated and RNN heads'). */
    const char *drafter = getenv("DS_TEST_DRAFTER");
    DS_TRY(ds_drafter_open(m->be, drafter && *drafter ? drafter : FIX "/drafter-trained", m->t, NULL, &m->d));
    return NULL;
}

/* On the CPU, one single-threaded backend per core (the models are tiny);
 * another DS_BACKEND gets one worker on test_backend_new's backend. */
static void setup(void) {
    const char *backend = getenv("DS_BACKEND");
    bool cpu = !backend || !*backend || !strcmp(backend, "cpu");
    long cpus = cpu ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
    int want = cpus < 1 ? 1 : cpus > MAX_WORKERS ? MAX_WORKERS : (int)cpus;
    for (int w = 0; w < want; w++) {
        n_workers = w + 1;
        CHECK_OK(open_models(&W[w], cpu));
    }
    printf("  %d worker thread(s)\n", n_workers);
}

static void teardown(void) {
    for (int w = 0; w < n_workers; w++) {
        if (W[w].d) ds_drafter_free(W[w].d);
        if (W[w].t) ds_target_free(W[w].t);
        if (W[w].be) W[w].be->ops->destroy(W[w].be);
    }
}

/* ---- broken verifiers ----------------------------------------------------- */

/* Accepts every draft, then the bonus from p_t: outputs the drafter's distribution. */
static int verify_accept_all(const float *target_logits, int V, const int32_t *draft, int n, const float *draft_probs,
                             const ds_sampling *s, ds_rng *rng, float *scratch, int32_t *next) {
    ds_probs_from_logits(target_logits + (size_t)n * V, V, s, scratch);
    *next = ds_sample_probs(scratch, V, rng);
    return n;
}

/* The right acceptance rule, but the correction comes from p_t, not from
 * normalize(max(0, p_t - p_d)): tokens the drafter likes are over-produced. */
static int verify_no_residual(const float *target_logits, int V, const int32_t *draft, int n, const float *draft_probs,
                              const ds_sampling *s, ds_rng *rng, float *scratch, int32_t *next) {
    double u[DS_MAX_GAMMA];
    for (int i = 0; i < n; i++) u[i] = ds_rng_uniform(rng);
    int a = 0;
    for (; a < n; a++) {
        ds_probs_from_logits(target_logits + (size_t)a * V, V, s, scratch);
        double pd = draft_probs[(size_t)a * V + draft[a]];
        if (!(u[a] < scratch[draft[a]] / (pd > 1e-8 ? pd : 1e-8))) break;
    }
    ds_probs_from_logits(target_logits + (size_t)a * V, V, s, scratch);
    *next = ds_sample_probs(scratch, V, rng);
    return a;
}

/* ---- the exact distribution ------------------------------------------------ */

typedef struct {
    int32_t code; /* (x1 * V + x2) * V + x3 */
    double p;
} cell;

typedef struct {
    cell *cells; /* every outcome with p >= pmin, sorted by code */
    int n, cap;
    double pmin;
    int V;
    ds_target *t;
    const ds_sampling *s;
    float *logits, *probs; /* [NEW][V] */
} exact_dist;

static int cell_cmp(const void *a, const void *b) {
    int32_t x = ((const cell *)a)->code, y = ((const cell *)b)->code;
    return (x > y) - (x < y);
}

/* The target's cache holds the prompt and `depth` continuation tokens and its
 * last forward left the next token's logits: extend every prefix that can
 * still reach pmin. */
static ds_error *enumerate(exact_dist *ex, int depth, int32_t code, double prob) {
    const int V = ex->V;
    float *logits = ex->logits + (size_t)depth * V, *probs = ex->probs + (size_t)depth * V;
    ex->t->be->ops->download(ex->t->be, ds_rows(ex->t->logits, 0, 1), logits);
    ds_probs_from_logits(logits, V, ex->s, probs);
    for (int32_t x = 0; x < V; x++) {
        double q = prob * probs[x];
        if (q < ex->pmin) continue;
        int32_t c = code * V + x;
        if (depth + 1 == NEW) {
            if (ex->n == ex->cap) {
                ex->cap = ex->cap ? 2 * ex->cap : 1024;
                cell *nc = realloc(ex->cells, (size_t)ex->cap * sizeof *nc);
                if (!nc) return ds_errorf("out of memory");
                ex->cells = nc;
            }
            ex->cells[ex->n++] = (cell){c, q};
        } else {
            DS_TRY(ds_target_forward(ex->t, &x, 1, N_PROMPT + depth, 1));
            DS_TRY(enumerate(ex, depth + 1, c, q));
        }
    }
    return NULL;
}

static ds_error *exact_distribution(ds_target *t, const ds_sampling *s, double pmin, exact_dist *ex) {
    memset(ex, 0, sizeof *ex);
    ex->pmin = pmin;
    ex->V = t->vocab;
    ex->t = t;
    ex->s = s;
    ex->logits = malloc((size_t)NEW * t->vocab * sizeof(float));
    ex->probs = malloc((size_t)NEW * t->vocab * sizeof(float));
    if (!ex->logits || !ex->probs) return ds_errorf("out of memory");
    ds_target_crop(t, 0);
    DS_TRY(ds_target_forward(t, PROMPT, N_PROMPT, 0, 1));
    DS_TRY(enumerate(ex, 0, 0, 1.0));
    qsort(ex->cells, (size_t)ex->n, sizeof *ex->cells, cell_cmp);
    return NULL;
}

static void exact_free(exact_dist *ex) {
    free(ex->cells);
    free(ex->logits);
    free(ex->probs);
}

/* ---- sampling through ds_generate ----------------------------------------- */

typedef struct {
    ds_sampling s;
    int gamma; /* 0: the drafter's block size */
} config;

typedef struct {
    models *m;
    const config *c;
    ds_verify_fn verify;
    int n, w, nw;
    uint64_t seed;
    int32_t *codes;
    long accepted, proposed, rounds;
    long hit, missed; /* rounds with >= 1 draft accepted; rounds with a rejection (residual path) */
    ds_error *err;
} job;

/* Stops the generation once NEW tokens are out: the reference loop would
 * run one more round whose tokens are trimmed anyway (SPEC §5 "Length"). */
static bool stop_at_new(void *user, int32_t token) {
    int *count = user;
    return ++*count < NEW;
}

static void *run_job(void *arg) {
    job *j = arg;
    const int V = j->m->t->vocab;
    for (int i = j->w; i < j->n && !j->err; i += j->nw) {
        ds_gen_params p = {.max_new = NEW,
                           .sampling = j->c->s,
                           .seed = j->seed + (uint64_t)i,
                           .gamma = j->c->gamma,
                           .ignore_stop = true,
                           .verify = j->verify};
        ds_gen_result r;
        int count = 0;
        j->err = ds_generate(j->m->t, j->m->d, PROMPT, N_PROMPT, &p, stop_at_new, &count, &r);
        if (j->err) break;
        if (r.n_tokens != NEW) j->err = ds_errorf("sample %d: %d tokens, want %d", i, r.n_tokens, NEW);
        int32_t code = 0;
        for (int k = 0; k < NEW && !j->err; k++) code = code * V + r.tokens[k];
        j->codes[i] = code;
        for (int k = 0; k < r.rounds; k++) {
            j->accepted += r.accepted[k];
            j->proposed += r.proposed[k];
            j->hit += r.accepted[k] > 0;
            j->missed += r.accepted[k] < r.proposed[k];
        }
        j->rounds += r.rounds;
        ds_gen_result_free(&r);
    }
    return NULL;
}

typedef struct {
    double stat, p, pooled_expected;
    int df, bins;
    double accept_rate; /* accepted drafts / proposed drafts */
    long rounds, hit, missed;
    double seconds;
} run_result;

static int code_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Number of entries equal to v in the sorted array a[n]. */
static long count_eq(const int32_t *a, long n, int32_t v) {
    long lo = 0, hi = n;
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (a[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    long first = lo;
    hi = n;
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (a[mid] <= v) lo = mid + 1;
        else hi = mid;
    }
    return lo - first;
}

/* Chi-square of sorted outcome codes[n] against the exact distribution. */
static void chi_square(const int32_t *codes, int n, const exact_dist *ex, run_result *rr) {
    double stat = 0, e_binned = 0, smallest_e = INFINITY, smallest_o = 0;
    long o_binned = 0;
    int bins = 0, smallest = -1;
    for (int i = 0; i < ex->n; i++) {
        double e = n * ex->cells[i].p;
        if (e < MIN_EXPECTED) continue;
        long o = count_eq(codes, n, ex->cells[i].code);
        stat += (o - e) * (o - e) / e;
        e_binned += e;
        o_binned += o;
        bins++;
        if (e < smallest_e) {
            smallest_e = e;
            smallest_o = (double)o;
            smallest = i;
        }
    }
    double e_pool = fmax(0.0, n - e_binned), o_pool = (double)(n - o_binned);
    if (e_pool >= MIN_EXPECTED || smallest < 0) {
        if (e_pool > 0) stat += (o_pool - e_pool) * (o_pool - e_pool) / e_pool;
        bins++;
    } else { /* too little pooled mass for a bin of its own: fold it into the smallest bin */
        stat -= (smallest_o - smallest_e) * (smallest_o - smallest_e) / smallest_e;
        double o = smallest_o + o_pool, e = smallest_e + e_pool;
        stat += (o - e) * (o - e) / e;
    }
    rr->stat = stat;
    rr->bins = bins;
    rr->df = bins - 1;
    rr->pooled_expected = e_pool;
    rr->p = rr->df > 0 ? chi2_pvalue(stat, rr->df) : 1.0;
}

static bool run(const config *c, ds_verify_fn verify, int n, uint64_t seed, const exact_dist *ex, run_result *rr) {
    memset(rr, 0, sizeof *rr);
    int32_t *codes = malloc((size_t)n * sizeof *codes);
    job jobs[MAX_WORKERS];
    pthread_t th[MAX_WORKERS];
    bool started[MAX_WORKERS] = {false};
    double t0 = now_s();
    for (int w = 0; w < n_workers; w++)
        jobs[w] = (job){.m = &W[w], .c = c, .verify = verify, .n = n, .w = w, .nw = n_workers, .seed = seed,
                        .codes = codes};
    for (int w = 1; w < n_workers; w++) started[w] = pthread_create(&th[w], NULL, run_job, &jobs[w]) == 0;
    run_job(&jobs[0]);
    for (int w = 1; w < n_workers; w++) {
        if (started[w]) pthread_join(th[w], NULL);
        else run_job(&jobs[w]);
    }
    rr->seconds = now_s() - t0;
    bool ok = true;
    long accepted = 0, proposed = 0;
    for (int w = 0; w < n_workers; w++) {
        if (jobs[w].err) {
            ds_test_failures++;
            fprintf(stderr, "ds_generate failed: %s\n", ds_error_message(jobs[w].err));
            ds_error_free(jobs[w].err);
            ok = false;
        }
        accepted += jobs[w].accepted;
        proposed += jobs[w].proposed;
        rr->rounds += jobs[w].rounds;
        rr->hit += jobs[w].hit;
        rr->missed += jobs[w].missed;
    }
    if (ok) {
        rr->accept_rate = proposed ? (double)accepted / (double)proposed : 0;
        qsort(codes, (size_t)n, sizeof *codes, code_cmp);
        chi_square(codes, n, ex, rr);
    }
    free(codes);
    return ok;
}

static int samples(int n) {
    const char *q = getenv("DS_TEST_QUICK");
    if (q && *q && strcmp(q, "0") != 0) {
        n /= 4;
        if (n < N_QUICK_MIN) n = N_QUICK_MIN;
    }
    return n;
}

static void print_run(const char *what, int n, const run_result *rr) {
    printf("    %-11s n=%-5d chi2=%9.2f df=%-3d p=%-9.3g accept rate %.3f; "
           "%ld rounds: %ld accepted a draft, %ld rejected one; %.1fs\n",
           what, n, rr->stat, rr->df, rr->p, rr->accept_rate, rr->rounds, rr->hit, rr->missed, rr->seconds);
}

static void check_lossless(const char *name, const config *c, uint64_t seed) {
    if (!n_workers || !W[n_workers - 1].d) return; /* setup failed (reported there) */
    const int64_t V = W[0].t->vocab;
    if (V * V * V > INT32_MAX) { /* outcome codes are int32 */
        CHECK(false, "vocabulary of %lld tokens too large for %d-token outcome codes", (long long)V, NEW);
        return;
    }
    const int n = samples(N_FULL), n_broken = samples(N_BROKEN);
    const double pmin = MIN_EXPECTED / (n > n_broken ? n : n_broken);
    exact_dist ex;
    ds_error *e = exact_distribution(W[0].t, &c->s, pmin, &ex);
    if (e) {
        exact_free(&ex);
        CHECK_OK(e);
    }
    double mass = 0;
    for (int i = 0; i < ex.n; i++) mass += ex.cells[i].p;
    printf("  %s (T=%.2f top_k=%d top_p=%.2f gamma=%d): %d outcomes with p >= %.2g hold mass %.4f; alpha = %g\n", name,
           c->s.temperature, c->s.top_k, c->s.top_p, c->gamma ? c->gamma : W[0].d->gamma, ex.n, pmin, mass, ALPHA);

    run_result rr;
    if (run(c, NULL, n, seed, &ex, &rr)) {
        print_run("ds_verify", n, &rr);
        CHECK(rr.df >= 10, "%s: only %d degrees of freedom", name, rr.df);
        CHECK(rr.p >= ALPHA, "%s: chi2 %.2f df %d p %.3g < alpha %g: drafted sampling is not the target's distribution",
              name, rr.stat, rr.df, rr.p, ALPHA);
        CHECK(rr.accept_rate > 0 && rr.accept_rate < 1, "%s: acceptance rate %.3f: the drafts do not matter", name,
              rr.accept_rate);
        CHECK(rr.hit > 0 && rr.missed > 0, "%s: of %ld rounds %ld accepted a draft and %ld rejected one", name,
              rr.rounds, rr.hit, rr.missed);
    }
    static const struct {
        const char *name;
        ds_verify_fn fn;
    } broken[] = {{"accept-all", verify_accept_all}, {"no-residual", verify_no_residual}};
    for (size_t b = 0; b < sizeof broken / sizeof broken[0]; b++) {
        if (!run(c, broken[b].fn, n_broken, seed + 1000000 * (b + 1), &ex, &rr)) continue;
        print_run(broken[b].name, n_broken, &rr);
        CHECK(rr.p < ALPHA, "%s: the broken verifier %s passes (chi2 %.2f df %d p %.3g): the test has no power", name,
              broken[b].name, rr.stat, rr.df, rr.p);
    }
    exact_free(&ex);
}

static void test_temperature_1(void) {
    const config c = {.s = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f}};
    check_lossless("T=1", &c, 0x1000000);
}

static void test_temperature_07_top_k_20(void) {
    const config c = {.s = {.temperature = 0.7f, .top_k = 20, .top_p = 1.0f}};
    check_lossless("T=0.7 top-k", &c, 0x2000000);
}

static void test_temperature_1_top_p_08(void) {
    const config c = {.s = {.temperature = 1.0f, .top_k = 0, .top_p = 0.8f}};
    check_lossless("T=1 top-p", &c, 0x3000000);
}

/* Top-k and top-p together, one draft per round: a round whose draft is
 * accepted ends with the bonus from p_t, so that path is tested too. */
static void test_top_k_top_p_gamma_1(void) {
    const config c = {.s = {.temperature = 0.8f, .top_k = 50, .top_p = 0.9f}, .gamma = 1};
    check_lossless("T=0.8 top-k top-p gamma=1", &c, 0x4000000);
}

/* The same test through the batched engine (src/batch/) with Algorithm 1
 * choosing how much of each proposal is verified: every sample is a request
 * of one batch, 64 in flight. The step cost is made up so that Algorithm 1
 * admits a varying part of the proposals (a step of B rows costs 1 + B / 64
 * units: with 64 requests in the step, a draft pays only where its survival
 * is above about one half): the test checks it verified some drafts and not
 * all. */
static void test_batched_algorithm1(void) {
    if (!n_workers || !W[0].d) return;
    const config c = {.s = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f}};
    const char *q = getenv("DS_TEST_QUICK");
    const int n = q && *q && strcmp(q, "0") ? 2000 : N_FULL; /* the sanitizer build: the batched path is slow there */
    exact_dist ex;
    ds_error *e = exact_distribution(W[0].t, &c.s, MIN_EXPECTED / n, &ex);
    if (e) {
        exact_free(&ex);
        CHECK_OK(e);
    }
    enum { SEQS = 64, PAGE = 16 };
    const int G = W[0].d->gamma;
    static const int tokens[] = {1, 64, 512};
    static const double secs[] = {1.015625, 2, 9}; /* 1 + B / 64 */
    ds_step_cost *sps;
    CHECK_OK(ds_step_cost_new(tokens, secs, 3, DS_STEP_COST_LINEAR, &sps));
    const ds_batch_opts bo = {.max_seqs = SEQS, .step_rows = SEQS * (G + 1), .page_rows = PAGE,
                              .n_pages = SEQS * 2, .schedule = DS_SCHEDULE_CONFIDENCE, .sps = sps};
    ds_backend *be = NULL;
    ds_target *t = NULL;
    ds_drafter *d = NULL;
    ds_batch *b = NULL;
    const ds_target_opts to = {.max_rows = bo.step_rows, .max_logit_rows = bo.step_rows,
                               .cache_rows = bo.n_pages * PAGE};
    const ds_drafter_opts dopts = {.cache_rows = ds_batch_drafter_rows(&bo, G)};
    e = test_backend_new(&be); /* DS_BACKEND: the CPU (2 threads) or the GPU's batched path */
    if (!e) e = ds_target_open(be, FIX "/target", &to, &t);
    if (!e) e = ds_drafter_open(be, FIX "/drafter-trained", t, &dopts, &d);
    if (!e) e = ds_batch_new(t, d, &bo, &b);
    int32_t *codes = malloc((size_t)n * sizeof *codes);
    int64_t *ids = malloc((size_t)n * sizeof *ids);
    const double t0 = now_s();
    for (int i = 0; i < n && !e; i++) {
        const ds_batch_request rq = {.prompt = PROMPT, .n_prompt = N_PROMPT,
                                     .params = {.max_new = NEW, .sampling = c.s, .seed = 0x5000000 + (uint64_t)i,
                                                .ignore_stop = true}};
        e = ds_batch_submit(b, &rq, &ids[i]);
    }
    if (!e) e = ds_batch_run(b);
    long accepted = 0, proposed = 0, rounds = 0, hit = 0, missed = 0;
    for (int i = 0; i < n && !e; i++) {
        const ds_gen_result *r = ds_batch_result(b, ids[i]);
        if (!r || r->n_tokens != NEW) {
            e = ds_errorf("sample %d: %d tokens", i, r ? r->n_tokens : -1);
            break;
        }
        codes[i] = (r->tokens[0] * W[0].t->vocab + r->tokens[1]) * W[0].t->vocab + r->tokens[2];
        for (int k = 0; k < r->rounds; k++) {
            accepted += r->accepted[k], proposed += r->proposed[k];
            hit += r->accepted[k] > 0, missed += r->accepted[k] < r->proposed[k];
        }
        rounds += r->rounds;
    }
    if (e) {
        CHECK(0, "batched sampling failed: %s", ds_error_message(e));
        ds_error_free(e);
    } else {
        const ds_batch_stats st = ds_batch_get_stats(b);
        run_result rr = {.accept_rate = proposed ? (double)accepted / (double)proposed : 0,
                         .rounds = rounds, .hit = hit, .missed = missed, .seconds = now_s() - t0};
        qsort(codes, (size_t)n, sizeof *codes, code_cmp);
        chi_square(codes, n, &ex, &rr);
        printf("  batched, Algorithm 1 (T=1): %lld of %lld drafts verified\n", (long long)st.verified_drafts,
               (long long)st.drafted);
        print_run("batched", n, &rr);
        CHECK(rr.df >= 10, "batched: only %d degrees of freedom", rr.df);
        CHECK(rr.p >= ALPHA, "batched with Algorithm 1: chi2 %.2f df %d p %.3g < alpha %g", rr.stat, rr.df, rr.p,
              ALPHA);
        CHECK(st.verified_drafts > 0 && st.verified_drafts < st.drafted,
              "Algorithm 1 verified %lld of %lld drafts: it does not choose", (long long)st.verified_drafts,
              (long long)st.drafted);
    }
    free(codes);
    free(ids);
    ds_batch_free(b);
    if (d) ds_drafter_free(d);
    if (t) ds_target_free(t);
    if (be) be->ops->destroy(be);
    ds_step_cost_free(sps);
    exact_free(&ex);
}

RUN_TESTS("lossless_sampling", setup, test_chi2_pvalue, test_temperature_1, test_temperature_07_top_k_20,
          test_temperature_1_top_p_08, test_top_k_top_p_gamma_1, test_batched_algorithm1, teardown)
