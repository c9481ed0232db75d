/* The batched engine (src/batch/) on the bundled pico pair: every dev
 * prompt (cut to mixed lengths) through it, many at once, must give exactly its solo run's output
 * (ds_generate, same parameters and seed): the same tokens, stop reason and
 * per-round accepted / proposed counts, for autoregressive decoding, the
 * DSpark drafter (threshold 0.5 and none) and the DFlash drafter, at T = 0
 * and at T = 1 with a seed per request; with Algorithm 1 choosing how much
 * of each proposal is verified, the same tokens at T = 0 (at T = 1 it is
 * lossless, test_lossless_sampling, but where rounds end depends on the
 * batch). Two engine shapes: 8 in flight with
 * 64 rows a step (prompts longer than the step's room are prefilled in
 * chunks beside decoding rows), 32 in flight, and 32 in flight over a pool
 * that holds 3 finished sequences, so that sequences are preempted and
 * recomputed mid-run (the test checks that it happened). Then requests the engine must refuse. */
#include <stdlib.h>
#include <string.h>

#include "batch/batch.h"
#include "pico_prompts.h"
#include "testlib.h"

#define NEW_TOKENS 16
#define PAGE_ROWS 16

static ds_backend *be;
static pico_prompt prompts[PICO_MAX_PROMPTS];
static int n_prompts;

typedef struct {
    const char *name;
    int max_seqs, step_rows, n_pages;
    bool expect_preemption;
} shape;

static const shape shapes[] = {
    {"8 in flight, 64 rows a step", 8, 64, 160, false},
    {"32 in flight, 96 rows a step, a pool of 200 pages", 32, 96, 200, false},
    /* prompts of up to 64 tokens + 16 new + a block: at most 6 pages each at the end */
    {"32 in flight, 96 rows a step, a pool of 20 pages", 32, 96, 20, true},
};

typedef struct {
    const char *name;
    const char *target;
    const char *drafter; /* NULL: autoregressive */
    float threshold;
    int n_prompts;       /* the first n dev prompts (ids mod vocab) */
    bool alg1;           /* Algorithm 1 picks the drafts verified (T = 0 only: the output is the target's, the
                            rounds are not the solo run's) */
    bool ar_pays;        /* with alg1: target steps made up a million times cheaper than the drafter pass
                            measured here, so that most steps skip drafting (every 16th still drafts) */
} mode;

static const mode modes[] = {
    {"AR", DS_MODELS "/pico-qwen3", NULL, 0, 32, false, false},
    {"DSpark", DS_MODELS "/pico-qwen3", DS_MODELS "/pico-qwen3-dspark", 0, 32, false, false},
    {"DSpark, threshold 0.5", DS_MODELS "/pico-qwen3", DS_MODELS "/pico-qwen3-dspark", 0.5f, 32, false, false},
    {"DFlash", DS_MODELS "/pico-qwen3", DS_DFLASH, 0, 32, false, false},
    {"DSpark, Algorithm 1", DS_MODELS "/pico-qwen3", DS_MODELS "/pico-qwen3-dspark", 0, 32, true, false},
    {"DSpark, Alg. 1, AR pays", DS_MODELS "/pico-qwen3", DS_MODELS "/pico-qwen3-dspark", 0, 32, true, true},
    /* Gemma 4 (random-init fixtures): sliding layers (window 8) read through the pages, a Gemma 4
     * drafter; the E-series' shared K/V and per-layer inputs */
    {"Gemma 4 AR", DS_TESTDATA "/fixtures/gemma4-tiny/target", NULL, 0, 8, false, false},
    {"Gemma 4 DSpark", DS_TESTDATA "/fixtures/gemma4-tiny/target", DS_TESTDATA "/fixtures/gemma4-tiny/drafter-trained",
     0, 8, false, false},
    {"Gemma 4 E AR", DS_TESTDATA "/fixtures/gemma4-e-tiny/target", NULL, 0, 8, false, false},
};

/* Mixed lengths: the dev prompts (64 tokens each) cut to 12..64 tokens. */
static int prompt_len(int i) {
    const int n = 12 + (i * 13) % 53;
    return n < prompts[i].n_ids ? n : prompts[i].n_ids;
}

static ds_gen_params params(const mode *m, float temp, int i) {
    ds_gen_params p = {.max_new = NEW_TOKENS, .seed = 1000 + (uint64_t)i, .threshold = m->threshold};
    p.sampling = (ds_sampling){.temperature = temp, .top_k = 0, .top_p = 1.0f};
    return p;
}

static bool same_result(const ds_gen_result *a, const ds_gen_result *b, bool rounds, char *why, size_t n) {
    if (a->n_tokens != b->n_tokens || memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof *a->tokens)) {
        int k = 0;
        while (k < a->n_tokens && k < b->n_tokens && a->tokens[k] == b->tokens[k]) k++;
        snprintf(why, n, "tokens differ at %d (%d vs %d tokens)", k, a->n_tokens, b->n_tokens);
        return false;
    }
    if (a->stop_reason != b->stop_reason) {
        snprintf(why, n, "stop reason %s vs %s", ds_stop_reason_name(a->stop_reason),
                 ds_stop_reason_name(b->stop_reason));
        return false;
    }
    if (!rounds) return true;
    if (a->rounds != b->rounds) {
        snprintf(why, n, "%d vs %d rounds", a->rounds, b->rounds);
        return false;
    }
    for (int r = 0; r < a->rounds; r++)
        if (a->accepted[r] != b->accepted[r] || a->proposed[r] != b->proposed[r] ||
            a->accept_len[r] != b->accept_len[r]) {
            snprintf(why, n, "round %d: accepted %d/%d, proposed %d/%d", r, a->accepted[r], b->accepted[r],
                     a->proposed[r], b->proposed[r]);
            return false;
        }
    return true;
}

/* DS_TEST_QUICK (CI's sanitizer build): 4 prompts a mode, and not the middle shape. */
static bool quick(void) {
    const char *q = getenv("DS_TEST_QUICK");
    return q && *q && strcmp(q, "0");
}

static void run_mode(const mode *m, float temp) {
    /* solo runs: one sequence, its own cache */
    ds_target *t;
    ds_drafter *d = NULL;
    ds_target_opts so = {.max_rows = 64, .max_logit_rows = DS_MAX_GAMMA + 1};
    CHECK_OK(ds_target_open(be, m->target, &so, &t));
    if (m->drafter) CHECK_OK(ds_drafter_open(be, m->drafter, t, NULL, &d));
    int n = m->n_prompts < n_prompts ? m->n_prompts : n_prompts;
    if (quick() && n > 4) n = 4;
    const int G = d ? d->gamma : 0;
    static int32_t ids[PICO_MAX_PROMPTS][128];
    for (int i = 0; i < n; i++)
        for (int k = 0; k < prompt_len(i); k++) ids[i][k] = prompts[i].ids[k] % t->vocab;
    ds_gen_result solo[PICO_MAX_PROMPTS];
    for (int i = 0; i < n; i++) {
        const ds_gen_params p = params(m, temp, i);
        CHECK_OK(ds_generate(t, d, ids[i], prompt_len(i), &p, NULL, NULL, &solo[i]));
    }
    if (d) ds_drafter_free(d);
    ds_target_free(t);

    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const shape *S = &shapes[sh];
        if ((quick() || m->n_prompts < 32) && sh == 1) continue; /* the fixtures' 8 prompts: 8 in flight is all */
        /* Algorithm 1's step cost, made up: a step of B rows costs 1 + B / 64 */
        static const int tok[] = {1, 64, 512};
        static const double sec[] = {1.015625, 2, 9}, usec[] = {1.015625e-6, 2e-6, 9e-6};
        ds_step_cost *sps = NULL;
        if (m->alg1) CHECK_OK(ds_step_cost_new(tok, m->ar_pays ? usec : sec, 3, DS_STEP_COST_LINEAR, &sps));
        const ds_batch_opts bo = {.max_seqs = S->max_seqs, .step_rows = S->step_rows, .page_rows = PAGE_ROWS,
                                  .n_pages = S->n_pages, .schedule = m->alg1 ? DS_SCHEDULE_CONFIDENCE : DS_SCHEDULE_FIXED,
                                  .sps = sps};
        ds_target_opts to = {.max_rows = S->step_rows, .max_logit_rows = S->step_rows,
                             .cache_rows = S->n_pages * PAGE_ROWS};
        CHECK_OK(ds_target_open(be, m->target, &to, &t));
        d = NULL;
        if (m->drafter) {
            ds_drafter_opts dopts = {.cache_rows = ds_batch_drafter_rows(&bo, G)};
            CHECK_OK(ds_drafter_open(be, m->drafter, t, &dopts, &d));
        }
        ds_batch *b;
        CHECK_OK(ds_batch_new(t, d, &bo, &b));
        int64_t rid[PICO_MAX_PROMPTS];
        for (int i = 0; i < n; i++) {
            const ds_batch_request rq = {.prompt = ids[i], .n_prompt = prompt_len(i), .params = params(m, temp, i)};
            CHECK_OK(ds_batch_submit(b, &rq, &rid[i]));
        }
        CHECK_OK(ds_batch_run(b));
        int same = 0;
        for (int i = 0; i < n; i++) {
            const ds_gen_result *r = ds_batch_result(b, rid[i]);
            char why[160] = "";
            if (!r) {
                CHECK(0, "%s T=%g, %s: prompt %d has no result", m->name, temp, S->name, i);
                continue;
            }
            const bool ok = same_result(&solo[i], r, !m->alg1, why, sizeof why);
            CHECK(ok, "%s T=%g, %s: prompt %d differs from its solo run: %s", m->name, temp, S->name, i, why);
            same += ok;
        }
        const ds_batch_stats st = ds_batch_get_stats(b);
        CHECK(st.max_running > 1, "%s, %s: at most %d sequences ran at once", m->name, S->name, st.max_running);
        CHECK(st.prefill_rows > 0, "%s: no prefill rows", S->name);
        /* Steps of decoding rows alone: at least one row each, none of them prefill rows. */
        CHECK(st.decode_steps > 0 && st.decode_step_s > 0 && st.decode_rows >= st.decode_steps &&
                  st.decode_rows <= st.rows - st.prefill_rows && st.decode_steps < st.steps,
              "%s: %lld decode steps (%g s) of %lld rows, %lld steps of %lld rows (%lld prefill)", S->name,
              (long long)st.decode_steps, st.decode_step_s, (long long)st.decode_rows, (long long)st.steps,
              (long long)st.rows, (long long)st.prefill_rows);
        if (S->expect_preemption && n == 32)
            CHECK(st.preemptions > 0, "%s T=%g, %s: no sequence was preempted", m->name, temp, S->name);
        printf("  %-22s T=%g  %-48s %2d/%d identical to solo; %lld steps, %lld rows (%lld prefill), up to %d at "
               "once, %lld preemptions, %lld steps without drafting\n",
               m->name, temp, S->name, same, n, (long long)st.steps, (long long)st.rows,
               (long long)st.prefill_rows, st.max_running, (long long)st.preemptions, (long long)st.draft_skips);
        if (m->alg1 && !m->ar_pays)
            CHECK(st.verified_drafts > 0 && st.verified_drafts < st.drafted && st.draft_skips == 0,
                  "%s: Algorithm 1 verified %lld of %lld drafts, skipped drafting %lld steps", S->name,
                  (long long)st.verified_drafts, (long long)st.drafted, (long long)st.draft_skips);
        if (m->ar_pays) /* the first draft measures the pass (other counts are bounded from it); probes back off */
            CHECK(st.steps - st.draft_skips <= 6 && st.draft_skips < st.steps && st.drafts > 0,
                  "%s: %lld of %lld steps skipped drafting, %lld verify rounds had drafts", S->name,
                  (long long)st.draft_skips, (long long)st.steps, (long long)st.drafts);
        ds_batch_free(b);
        ds_step_cost_free(sps);
        if (d) ds_drafter_free(d);
        ds_target_free(t);
    }
    for (int i = 0; i < n; i++) ds_gen_result_free(&solo[i]);
}

static void test_refusals(void) {
    ds_target *t;
    const ds_batch_opts bo = {.max_seqs = 4, .step_rows = 32, .page_rows = PAGE_ROWS, .n_pages = 8};
    ds_target_opts to = {.max_rows = 32, .max_logit_rows = 32, .cache_rows = 8 * PAGE_ROWS};
    CHECK_OK(ds_target_open(be, DS_MODELS "/pico-qwen3", &to, &t));
    ds_batch *b;
    CHECK_OK(ds_batch_new(t, NULL, &bo, &b));
    int32_t ids[200] = {0};
    int64_t id;
    ds_batch_request rq = {.prompt = ids, .n_prompt = 0, .params = {.max_new = 4}};
    CHECK_ERR(ds_batch_submit(b, &rq, &id), "empty prompt");
    rq.n_prompt = 200; /* 8 pages of 16 rows hold 128 */
    CHECK_ERR(ds_batch_submit(b, &rq, &id), "does not fit the KV pool");
    rq.n_prompt = 3;
    ids[1] = 1 << 20;
    CHECK_ERR(ds_batch_submit(b, &rq, &id), "outside the vocabulary");
    ids[1] = 5;
    rq.params.max_new = -1;
    CHECK_ERR(ds_batch_submit(b, &rq, &id), "negative");
    ds_batch_free(b);
    /* a pool larger than the target's caches */
    const ds_batch_opts big = {.max_seqs = 4, .step_rows = 32, .page_rows = PAGE_ROWS, .n_pages = 9};
    CHECK_ERR(ds_batch_new(t, NULL, &big, &b), "caches hold 128 rows");
    ds_target_free(t);
}

/* The step-cost profile times steps of up to step_rows rows, more than one
 * sequence's context holds: decode-shaped blocks of 8 rows, each a scratch
 * sequence at the end of a context that fits (here 24 keys of 32). */
static void test_profile_past_context(void) {
    ds_target *t;
    const ds_batch_opts bo = {.max_seqs = 4, .step_rows = 80, .page_rows = PAGE_ROWS, .n_pages = 8};
    ds_target_opts to = {.max_rows = 80, .max_logit_rows = 80, .cache_rows = 8 * PAGE_ROWS, .max_ctx = 32};
    CHECK_OK(ds_target_open(be, DS_MODELS "/pico-qwen3", &to, &t));
    CHECK(t->max_ctx == 32, "context %d", t->max_ctx);
    ds_batch *b;
    CHECK_OK(ds_batch_new(t, NULL, &bo, &b));
    ds_step_cost *sps = NULL;
    CHECK_OK(ds_batch_profile(b, NULL, NULL, NULL, &sps));
    int n = sps ? ds_step_cost_n(sps) : 0, last = 0;
    double sec = 0, measured = 0;
    if (n > 0) ds_step_cost_bucket(sps, n - 1, &last, &sec, &measured);
    printf("  step-cost profile, steps of up to 80 rows, context 32: %d buckets, the last %d rows %.3g s\n", n, last,
           sec);
    CHECK(n >= 2 && last == 80 && sec > 0, "%d buckets, the last %d rows %g s", n, last, sec);
    ds_step_cost_free(sps);
    ds_batch_free(b);
    ds_target_free(t);
}

static void setup(void) {
    CHECK_OK(test_backend_new(&be));
    n_prompts = pico_load_prompts(prompts, PICO_MAX_PROMPTS);
    CHECK(n_prompts == 32, "%d dev prompts", n_prompts);
}

static void test_solo_equals_batched(void) {
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        run_mode(&modes[m], 0.0f);
        if (!modes[m].alg1) run_mode(&modes[m], 1.0f);
    }
}

static void teardown(void) {
    if (be) be->ops->destroy(be);
}

RUN_TESTS("batch", setup, test_solo_equals_batched, test_refusals, test_profile_past_context, teardown)
