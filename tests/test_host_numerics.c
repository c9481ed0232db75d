/* Same bits on every host: the bundled pico pair's logits and greedy outputs
 * against values pinned in testdata/pinned/pico.json (pinned.h), which hold for any
 * x86-64-v3-or-newer CPU (AVX2 or AVX-512), any thread count (ctest runs this
 * with 1, 2 and 8 threads: DS_TEST_THREADS) and any optimization level.
 * Every CPU reduction runs in an order the code fixes (cpu_matmul.c), so a
 * mismatch here is a real change of numerics, never a host's luck.
 *
 * Checked:
 * - a prefill of n tokens (n > one matmul slab) gives the last-row logits of
 *   n single steps, bit for bit (row invariance, prefill included);
 * - hashes of the fp32 logits of a prefill and of 16 greedy decode steps;
 * - hashes of the greedy AR output of the 32 dev prompts, and of drafted
 *   greedy runs (tokens and per-round accepted lengths) through the bundled
 *   DSpark drafter.
 * The hashes are kept per build variant (DS_X_BF16 on or off). */
#include <stdlib.h>
#include <string.h>

#include "draft/drafter.h"
#include "pico_prompts.h"
#include "pinned.h"
#include "speculate/generate.h"
#include "testlib.h"

#define NEW_TOKENS 128
#define STEPS 16

static ds_backend *be;
static ds_target *target;
static pico_prompt prompts[PICO_MAX_PROMPTS];
static int n_prompts;

static int env_threads(void) {
    const char *s = getenv("DS_TEST_THREADS");
    return s && atoi(s) > 0 ? atoi(s) : 2;
}

static void setup(void) {
    CHECK_OK(ds_backend_cpu_new(env_threads(), &be));
    printf("  cpu backend, %d threads\n", be->n_threads);
    ds_target_opts o = {.max_rows = 64, .max_logit_rows = 33};
    CHECK_OK(ds_target_open(be, DS_MODELS "/pico-qwen3", &o, &target));
    target->logits_bf16 = false; /* hash the fp32 logits: every bit the forward computed */
    n_prompts = pico_load_prompts(prompts, PICO_MAX_PROMPTS);
    CHECK(n_prompts == 32, "%d dev prompts", n_prompts);
    pinned_open();
}

static ds_error *last_logits(float *out) {
    return (be->ops->download(be, ds_rows(target->logits, 0, 1), out), be->ops->check(be));
}

/* 40 prompt tokens in one forward (two slabs of the matmul) and one token a
 * step: the last rows' logits are the same bits. */
static void test_prefill_equals_steps(void) {
    const pico_prompt *p = NULL;
    for (int i = 0; i < n_prompts && !p; i++)
        if (prompts[i].n_ids >= 40) p = &prompts[i];
    if (!p) {
        /* build a 40-token prompt from two prompts' ids */
        static pico_prompt joined;
        joined.n_ids = 0;
        for (int i = 0; i < n_prompts && joined.n_ids < 40; i++)
            for (int k = 0; k < prompts[i].n_ids && joined.n_ids < 40; k++) joined.ids[joined.n_ids++] = prompts[i].ids[k];
        p = &joined;
    }
    CHECK(p->n_ids >= 40, "no 40-token prompt");
    const int n = 40;
    float *a = malloc((size_t)target->vocab * sizeof *a), *b = malloc((size_t)target->vocab * sizeof *b);
    ds_target_crop(target, 0);
    CHECK_OK(ds_target_forward(target, p->ids, n, 0, 1));
    CHECK_OK(last_logits(a));
    pinned_check_hash("prefill40_last_logits", pinned_fnv(PINNED_FNV_START, a, (size_t)target->vocab * sizeof *a));
    ds_target_crop(target, 0);
    for (int k = 0; k < n; k++) CHECK_OK(ds_target_forward(target, p->ids + k, 1, k, 1));
    CHECK_OK(last_logits(b));
    int diff = 0;
    for (int i = 0; i < target->vocab; i++) diff += memcmp(&a[i], &b[i], sizeof a[i]) != 0;
    CHECK(diff == 0, "prefill of %d vs %d single steps: %d of %d last-row logits differ in their bits", n, n, diff,
          target->vocab);
    free(a);
    free(b);
}

/* The logits of a prefill and of STEPS greedy steps after it, hashed. */
static void test_decode_logits(void) {
    const pico_prompt *p = &prompts[0];
    float *l = malloc((size_t)target->vocab * sizeof *l);
    ds_target_crop(target, 0);
    CHECK_OK(ds_target_forward(target, p->ids, p->n_ids, 0, 1));
    uint64_t h = PINNED_FNV_START;
    int pos = p->n_ids;
    for (int s = 0; s <= STEPS; s++) {
        CHECK_OK(last_logits(l));
        h = pinned_fnv(h, l, (size_t)target->vocab * sizeof *l);
        int32_t best = 0;
        for (int i = 1; i < target->vocab; i++)
            if (l[i] > l[best]) best = i;
        if (s < STEPS) CHECK_OK(ds_target_forward(target, &best, 1, pos++, 1));
    }
    pinned_check_hash("decode16_logits", h);
    free(l);
}

/* The sanitizer build (DS_TEST_QUICK) checks the logits above; the
 * generation hashes are the Release builds' job (minutes under ASan). */
static bool quick(const char *what) {
    if (!getenv("DS_TEST_QUICK")) return false;
    printf("  %s: skipped under DS_TEST_QUICK\n", what);
    return true;
}

static void test_ar_greedy_outputs(void) {
    if (quick("ar_greedy_32x128")) return;
    target->logits_bf16 = true; /* generation as the engine runs it */
    uint64_t all = PINNED_FNV_START;
    for (int i = 0; i < n_prompts; i++) {
        ds_gen_params gp = {.max_new = NEW_TOKENS};
        ds_gen_result r;
        CHECK_OK(ds_generate(target, NULL, prompts[i].ids, prompts[i].n_ids, &gp, NULL, NULL, &r));
        all = pinned_fnv(all, &r.n_tokens, sizeof r.n_tokens);
        all = pinned_fnv(all, r.tokens, (size_t)r.n_tokens * sizeof *r.tokens);
        ds_gen_result_free(&r);
    }
    target->logits_bf16 = false;
    pinned_check_hash("ar_greedy_32x128", all);
}

static void test_drafted_greedy_rounds(void) {
    if (quick("drafted_greedy_8x64")) return;
    target->logits_bf16 = true;
    ds_drafter *d;
    CHECK_OK(ds_drafter_open(be, DS_MODELS "/pico-qwen3-dspark", target, NULL, &d));
    uint64_t all = PINNED_FNV_START;
    long rounds = 0;
    for (int i = 0; i < 8; i++) {
        ds_gen_params gp = {.max_new = 64};
        ds_gen_result r;
        ds_error *e = ds_generate(target, d, prompts[i].ids, prompts[i].n_ids, &gp, NULL, NULL, &r);
        if (e) {
            CHECK(0, "%s", ds_error_message(e));
            ds_error_free(e);
            break;
        }
        all = pinned_fnv(all, r.tokens, (size_t)r.n_tokens * sizeof *r.tokens);
        all = pinned_fnv(all, r.accept_len, (size_t)r.rounds * sizeof *r.accept_len);
        rounds += r.rounds;
        ds_gen_result_free(&r);
    }
    printf("  8 prompts x 64 tokens drafted in %ld rounds\n", rounds);
    ds_drafter_free(d);
    target->logits_bf16 = false;
    pinned_check_hash("drafted_greedy_8x64", all);
}

static void teardown(void) {
    pinned_close();
    ds_target_free(target);
    be->ops->destroy(be);
}

RUN_TESTS("host_numerics", setup, test_prefill_equals_steps, test_decode_logits, test_ar_greedy_outputs,
          test_drafted_greedy_rounds, teardown)
