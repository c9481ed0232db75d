/* The bundled pico pair (bf16 weights, fp32 compute, x rounded to bf16 at the
 * matmuls in the default build):
 * - greedy AR vs the reference's bf16 ar_greedy_output_ids: every prompt
 *   either agrees fully or first differs where the reference's token lies
 *   within a near tie of our top logit (< 0.1 or two bf16 ulps of it below),
 *   i.e. a rounding difference and not a bug;
 * - lossless at T=0: drafted greedy output == AR greedy output, token for
 *   token, on every prompt (row-invariant verification makes this exact);
 * - acceptance length tau close to the reference's, for the DSpark drafter
 *   (with and without a confidence threshold) and the DFlash drafter;
 * - and the engine's own numbers exactly: the agreeing prompts and every
 *   tau's rounds and accepted tokens are pinned (pinned.h), since the CPU's
 *   numerics are the same on every host. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "draft/drafter.h"
#include "pico_prompts.h"
#include "pinned.h"
#include "speculate/generate.h"
#include "testlib.h"

#define NEW_TOKENS 128

static ds_backend *be;
static ds_target *target;
static pico_prompt prompts[PICO_MAX_PROMPTS];
static int n_prompts;
static int32_t ar_out[PICO_MAX_PROMPTS][NEW_TOKENS];
static int ar_len[PICO_MAX_PROMPTS];

static void setup(void) {
    CHECK_OK(test_backend_new(&be));
    ds_target_opts o = {.max_rows = 64, .max_logit_rows = 33};
    CHECK_OK(ds_target_open(be, DS_MODELS "/pico-qwen3", &o, &target));
    n_prompts = pico_load_prompts(prompts, PICO_MAX_PROMPTS);
    CHECK(n_prompts == 32, "%d dev prompts", n_prompts);
    /* The sanitizer build runs a subset: the full set is the Release run's job. */
    if (getenv("DS_TEST_QUICK") && n_prompts > 4) n_prompts = 4;
    pinned_open();
}

/* The pinned values are the CPU's (DS_BACKEND=cuda computes other, also
 * exact-to-itself numbers) over the full set (the Release builds' job). */
static void pin(const char *key, const char *fmt, long a, long b) {
    const char *backend = getenv("DS_BACKEND");
    if (n_prompts != 32 || (backend && *backend && strcmp(backend, "cpu"))) return;
    char v[64];
    snprintf(v, sizeof v, fmt, a, b);
    pinned_check(key, v);
}

/* Our fp32 logits (before the bf16 rounding the reference applies) after
 * prompt + out[0..k): the top-2 gap, the top logit, the rank of `ref` and
 * how far below our top logit the reference's token lies. */
typedef struct {
    float gap, top, ref_gap;
    int ref_rank;
} tie_info;

static tie_info near_tie(const pico_prompt *p, const int32_t *out, int k, int32_t ref) {
    tie_info ti = {1e9f, 0, 1e9f, -1};
    bool rounded = target->logits_bf16;
    target->logits_bf16 = false;
    int32_t seq[256];
    int n = p->n_ids + k;
    memcpy(seq, p->ids, (size_t)p->n_ids * sizeof *seq);
    memcpy(seq + p->n_ids, out, (size_t)k * sizeof *seq);
    ds_target_crop(target, 0);
    for (int p0 = 0; p0 < n; p0 += 64) {
        int m = n - p0 < 64 ? n - p0 : 64;
        ds_error *e = ds_target_forward(target, seq + p0, m, p0, p0 + m == n ? 1 : 0);
        if (e) {
            CHECK(0, "%s", ds_error_message(e));
            ds_error_free(e);
            return ti;
        }
    }
    float *l = malloc((size_t)target->vocab * sizeof *l);
    be->ops->download(be, ds_rows(target->logits, 0, 1), l);
    target->logits_bf16 = rounded;
    float a = -1e30f, b = -1e30f;
    int rank = 0;
    for (int i = 0; i < target->vocab; i++) {
        if (l[i] > a) b = a, a = l[i];
        else if (l[i] > b) b = l[i];
        if (ref >= 0 && l[i] > l[ref]) rank++;
    }
    ti.gap = a - b;
    if (ref >= 0) ti.ref_gap = a - l[ref];
    free(l);
    ti.top = a;
    ti.ref_rank = rank;
    return ti;
}

/* One bf16 ulp at magnitude x. The reference runs the whole forward in
 * bf16 (activations rounded to 8 significant bits at every op) and rounds
 * the logits to bf16; gaps of a couple of ulps of the top logit are within
 * that noise. */
static float bf16_ulp(float x) {
    int e;
    frexpf(fabsf(x), &e);
    return ldexpf(1.0f, e - 8);
}

static void test_ar_matches_reference_up_to_near_ties(void) {
    int agree = 0;
    for (int i = 0; i < n_prompts; i++) {
        ds_gen_params p = {.max_new = NEW_TOKENS};
        ds_gen_result r;
        CHECK_OK(ds_generate(target, NULL, prompts[i].ids, prompts[i].n_ids, &p, NULL, NULL, &r));
        memcpy(ar_out[i], r.tokens, (size_t)r.n_tokens * sizeof(int32_t));
        ar_len[i] = r.n_tokens;
        int k = 0;
        while (k < r.n_tokens && k < prompts[i].n_ar && r.tokens[k] == prompts[i].ar[k]) k++;
        if (k == prompts[i].n_ar && k == r.n_tokens) {
            agree++;
        } else {
            int32_t ref = k < prompts[i].n_ar ? prompts[i].ar[k] : -1;
            tie_info ti = near_tie(&prompts[i], r.tokens, k, ref);
            float bound = fmaxf(0.1f, 2 * bf16_ulp(ti.top));
            printf("  prompt %2d: first differs at token %3d (ours %d, reference %d = our rank %d, %.4f below our top), "
                   "top-2 gap %.4f, top logit %.2f (bf16 ulp %.4f)\n",
                   i, k, k < r.n_tokens ? r.tokens[k] : -1, ref, ti.ref_rank, ti.ref_gap, ti.gap, ti.top,
                   bf16_ulp(ti.top));
            /* The reference's token must lie within the bound of our top logit: a near tie (of two tokens or
             * more: with bf16 x a three-way tie within 0.04 occurs), not a different preference. The end of
             * the reference's output (ref < 0) must be a near tie of our top two. */
            CHECK(ref >= 0 ? ti.ref_gap < bound : ti.gap < bound,
                  "prompt %d diverges at %d: the reference token %.4f below our top (top-2 gap %.4f, bound %.4f, "
                  "its rank %d)",
                  i, k, ti.ref_gap, ti.gap, bound, ti.ref_rank);
        }
        ds_gen_result_free(&r);
    }
    printf("  %d of %d prompts agree fully with the reference's bf16 greedy output\n", agree, n_prompts);
    /* An fp32 engine is expected to reach about 16 (models/PROVENANCE-shared-README.md): that is the middle of
     * the count, not its floor. Which prompts agree turns on near ties, so ulp-level changes move it: this
     * build gave 16 with OpenBLAS's Haswell / Zen kernels in the prompt's prefill and 15 with its SkylakeX /
     * Sandybridge ones, the GPU 17, the tile-order norms (81f251f) 16-18 (bench/RESULTS.md, session 26): the
     * floor sits one below the lowest of those. A systematic loss shows as a divergence that is not a near tie
     * (the check above) or as fewer (a norm from bf16(x), session 24: 13). */
    if (n_prompts == 32) CHECK(agree >= 14, "only %d prompts agree fully", agree);
    pin("pico_ar_agree_with_reference", "%ld of %ld", agree, n_prompts);
}

/* Pooled tau (DeepSpec acceptance_length) over the prompts. */
static double run_tau(ds_drafter *d, float temp, float threshold, bool check_lossless, int seed_sets,
                      const char *pin_key) {
    long rounds = 0, lens = 0;
    int same = 0;
    for (int j = 0; j < n_prompts * seed_sets; j++) {
        int i = j % n_prompts;
        ds_gen_params p = {.max_new = NEW_TOKENS, .threshold = threshold,
                           .sampling = {.temperature = temp, .top_p = 1},
                           .seed = 980406 + (uint64_t)i + 1000000 * (uint64_t)(j / n_prompts)};
        ds_gen_result r;
        ds_error *e = ds_generate(target, d, prompts[i].ids, prompts[i].n_ids, &p, NULL, NULL, &r);
        if (e) {
            CHECK(0, "%s", ds_error_message(e));
            ds_error_free(e);
            return 0;
        }
        if (check_lossless && j < n_prompts) {
            bool eq = r.n_tokens == ar_len[i] && !memcmp(r.tokens, ar_out[i], (size_t)r.n_tokens * sizeof(int32_t));
            CHECK(eq, "prompt %d: drafted greedy output differs from AR", i);
            same += eq;
        }
        rounds += r.rounds;
        for (int k = 0; k < r.rounds; k++) lens += r.accept_len[k];
        ds_gen_result_free(&r);
    }
    if (check_lossless) printf("  %d/%d prompts token-identical to AR\n", same, n_prompts);
    pin(pin_key, "%ld accepted / %ld rounds", lens, rounds);
    return rounds ? (double)lens / rounds : 0;
}

/* Lossless greedy on every prompt, and tau at T=0 and T=1 within 5 % of the
 * reference's (models/REFERENCE.md), 128 new tokens, stop at <|endoftext|>;
 * the counts behind each tau pinned exactly.
 * Why 5 %: tau at T=0 is deterministic for given numerics but not across
 * them (a near tie that rounds the other way changes the rest of that
 * prompt; the reference runs bf16 activations, we fp32). Over nine
 * numerics variants measured before the CPU's were fixed (fused-norm
 * orders, three OpenBLAS kernel sets for the prefill, the GPU;
 * bench/RESULTS.md) the 32 prompts' tau moved by up to 4.1 %, and up to
 * 5.4 % on an AVX-512 host, with the threshold the most sensitive; the
 * pinned numerics sit within 2.1 % of every reference figure. 5 % still
 * fails a drafter that ignores its confidence threshold (the reference's
 * tau without it is 14 % higher). */
static void check_drafter(const char *dir, const char *name, float threshold, double ref_t0, double ref_t1) {
    ds_drafter *d;
    CHECK_OK(ds_drafter_open(be, dir, target, NULL, &d));
    /* At T=1 tau is a random quantity: pool three seed sets so that our
     * estimate's own noise (about 2.5 % for one set of 32 prompts) does not
     * eat the tolerance; the reference's number is a single set. */
    char k0[64], k1[64];
    snprintf(k0, sizeof k0, "pico_tau_%s_t0", name);
    snprintf(k1, sizeof k1, "pico_tau_%s_t1", name);
    double t0 = run_tau(d, 0, threshold, true, 1, k0),
           t1 = run_tau(d, 1, threshold, false, n_prompts == 32 ? 3 : 1, k1);
    printf("  %s threshold %.1f: tau T=0 %.3f (reference %.3f, %+.1f%%), T=1 %.3f (reference %.3f, %+.1f%%)\n", dir,
           threshold, t0, ref_t0, 100 * (t0 / ref_t0 - 1), t1, ref_t1, 100 * (t1 / ref_t1 - 1));
    if (n_prompts == 32) {
        CHECK(fabs(t0 / ref_t0 - 1) <= 0.05, "tau at T=0 %.3f is not within 5%% of %.3f", t0, ref_t0);
        CHECK(fabs(t1 / ref_t1 - 1) <= 0.05, "tau at T=1 %.3f is not within 5%% of %.3f", t1, ref_t1);
    }
    ds_drafter_free(d);
}

static void test_dspark(void) { check_drafter(DS_MODELS "/pico-qwen3-dspark", "dspark", 0, 2.672, 2.059); }
static void test_dspark_threshold(void) {
    check_drafter(DS_MODELS "/pico-qwen3-dspark", "dspark_c0.5", 0.5f, 2.337, 1.650);
}
static void test_dflash(void) { check_drafter(DS_DFLASH, "dflash", 0, 2.285, 1.786); }

static void teardown(void) {
    pinned_close();
    ds_target_free(target);
    be->ops->destroy(be);
}

RUN_TESTS("pico", setup, test_ar_matches_reference_up_to_near_ties, test_dspark, test_dspark_threshold, test_dflash,
          teardown)
