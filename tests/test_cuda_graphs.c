/* CUDA graphs (backend.h step regions) against the same GPU running every
 * op by op: two CUDA backends, one made with DS_CUDA_GRAPHS=0, one with
 * graphs on, each holding the pico target and its DSpark drafter.
 * - AR: a 200-token random prompt, then 160 greedy steps (positions
 *   200..359: across the 256-key boundary where attention's grid changes
 *   bucket): every step's logits bit for bit and its argmax token equal;
 * - verify shapes: forwards of n = 1..8 rows at positions around 256, each
 *   shape several times (warm-up, capture, replays): logits bit for bit;
 * - drafter rounds (context update + block + LM head + Markov walk): the
 *   tokens and the corrected logits bit for bit, round after round;
 * - drafted greedy generation == AR greedy generation with graphs on (and
 *   both == graphs off), across the boundary;
 * - the graphs backend did capture and replay, the other never did.
 * Skips (exit 77) where no CUDA device can be used. */
#include <stdlib.h>
#include <string.h>

#include "draft/drafter.h"
#include "spec/generate.h"
#include "testlib.h"

#define PROMPT 200
#define STEPS 160

static ds_backend *be[2]; /* [0]: graphs off, [1]: graphs on */
static ds_target *tg[2];
static ds_drafter *dr[2];
static int32_t prompt[PROMPT];
static int32_t ar_tokens[STEPS + 1];

static ds_error *open_pair(int i) {
    ds_target_opts to = {.max_rows = 256, .max_logit_rows = 33};
    DS_TRY(ds_target_open(be[i], DS_MODELS "/pico-qwen3", &to, &tg[i]));
    ds_drafter_opts dopt = {.max_rows = 256};
    DS_TRY(ds_drafter_open(be[i], DS_MODELS "/pico-qwen3-dspark", tg[i], &dopt, &dr[i]));
    return ds_target_set_taps(tg[i], dr[i]->tap_layers, dr[i]->n_taps);
}

static void setup(void) {
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < PROMPT; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((s >> 33) % 8192);
    }
    for (int i = 0; i < 2; i++) CHECK_OK(open_pair(i));
    ds_region_stats st0 = ds_backend_region_stats(be[0]), st1 = ds_backend_region_stats(be[1]);
    CHECK(!st0.enabled, "DS_CUDA_GRAPHS=0 left graphs on");
    CHECK(st1.enabled, "graphs are off on the graphs backend (DS_CUDA_PROFILE or DS_CUDA_RING_TRACE set?)");
}

static float *logits_of(int i, int rows) {
    float *l = malloc((size_t)rows * tg[i]->vocab * sizeof *l);
    be[i]->ops->download(be[i], ds_rows(tg[i]->logits, 0, rows), l);
    return l;
}

static void check_backends(const char *what) {
    for (int i = 0; i < 2; i++) {
        ds_error *e = ds_backend_check(be[i]);
        if (e) {
            CHECK(0, "%s (graphs %s): %s", what, i ? "on" : "off", ds_error_message(e));
            ds_error_free(e);
        }
    }
}

/* Both targets' logits rows [0, rows) bit for bit; returns whether equal. */
static bool same_logits(int rows, const char *what, int at) {
    float *a = logits_of(0, rows), *b = logits_of(1, rows);
    size_t n = (size_t)rows * tg[0]->vocab;
    bool eq = !memcmp(a, b, n * sizeof *a);
    if (!eq) {
        size_t k = 0;
        while (k < n && !memcmp(a + k, b + k, sizeof *a)) k++;
        CHECK(0, "%s at %d: logits differ first at row %zu column %zu (%.9g off, %.9g on)", what, at,
              k / tg[0]->vocab, k % tg[0]->vocab, a[k], b[k]);
    }
    free(a);
    free(b);
    return eq;
}

static void test_ar_steps(void) {
    for (int i = 0; i < 2; i++) CHECK_OK(ds_target_forward(tg[i], prompt, PROMPT, 0, 1));
    check_backends("prefill");
    int32_t tok[2];
    for (int i = 0; i < 2; i++) be[i]->ops->argmax(be[i], ds_rows(tg[i]->logits, 0, 1), &tok[i]);
    CHECK(tok[0] == tok[1], "prefill argmax %d (off) vs %d (on)", tok[0], tok[1]);
    ar_tokens[0] = tok[1];
    ds_region_stats before = ds_backend_region_stats(be[1]);
    int bad = 0;
    for (int k = 0; k < STEPS; k++) {
        int32_t in[2] = {tok[0], tok[1]};
        for (int i = 0; i < 2; i++) CHECK_OK(ds_target_forward_argmax(tg[i], &in[i], 1, PROMPT + k, 1, &tok[i]));
        check_backends("AR step");
        if (tok[0] != tok[1] || !same_logits(1, "AR step", PROMPT + k)) {
            CHECK(tok[0] == tok[1], "AR step at %d: token %d (off) vs %d (on)", PROMPT + k, tok[0], tok[1]);
            if (++bad > 3) break;
        }
        ar_tokens[k + 1] = tok[1];
    }
    ds_region_stats after = ds_backend_region_stats(be[1]);
    printf("  AR: %d steps at positions %d..%d, graphs on: %lld captures, %lld replays\n", STEPS, PROMPT,
           PROMPT + STEPS - 1, (long long)(after.captures - before.captures),
           (long long)(after.replays - before.replays));
    /* One shape, two buckets (n_keys <= 256 and above): a capture each, the rest replays. */
    CHECK(after.captures - before.captures >= 2, "AR steps captured %lld graphs",
          (long long)(after.captures - before.captures));
    CHECK(after.replays - before.replays >= STEPS - 6, "only %lld of %d AR steps replayed",
          (long long)(after.replays - before.replays), STEPS);
    CHECK(ds_backend_region_stats(be[0]).replays == 0, "graphs off, yet replays");
}

static void test_verify_shapes(void) {
    ds_region_stats before = ds_backend_region_stats(be[1]);
    int32_t ids[8];
    for (int n = 1; n <= 8; n++)
        for (int k = 0; k < 8; k++) {
            /* pos0 246..260: n_keys from 247 to 268, on both sides of 256 */
            const int pos0 = 246 + 2 * k;
            for (int j = 0; j < n; j++) ids[j] = prompt[(7 * k + 3 * j + n) % PROMPT];
            int32_t best[2][8];
            /* Rows past pos0 hold what the steps above (and the last
             * forward) wrote, the same on both backends: score from there. */
            for (int i = 0; i < 2; i++) tg[i]->n_cached = PROMPT + STEPS;
            for (int i = 0; i < 2; i++) CHECK_OK(ds_target_forward_argmax(tg[i], ids, n, pos0, n, best[i]));
            check_backends("verify");
            CHECK(!memcmp(best[0], best[1], (size_t)n * sizeof(int32_t)), "verify n=%d at %d: argmax differs", n,
                  pos0);
            same_logits(n, "verify", pos0 * 100 + n);
            /* The plain forward (logits only, no argmax) is its own recording. */
            for (int i = 0; i < 2; i++) tg[i]->n_cached = PROMPT + STEPS;
            for (int i = 0; i < 2; i++) CHECK_OK(ds_target_forward(tg[i], ids, n, pos0, n));
            check_backends("verify (no argmax)");
            same_logits(n, "verify (no argmax)", pos0 * 100 + n);
        }
    ds_region_stats after = ds_backend_region_stats(be[1]);
    printf("  verify n=1..8: %lld captures, %lld replays\n", (long long)(after.captures - before.captures),
           (long long)(after.replays - before.replays));
    /* Per (n, argmax, bucket): a warm-up run and a capture, then replays (a
     * scratch buffer grown by a new shape's warm-up makes older recordings
     * be captured again, so fewer than the 64 possible). */
    CHECK(after.replays - before.replays >= 32, "only %lld of 128 verify forwards replayed",
          (long long)(after.replays - before.replays));
}

/* The speculative loop by hand on both backends: the drafter round (with the
 * previous round's accepted rows as context), then the verify forward. */
static void test_drafter_rounds(void) {
    ds_region_stats before = ds_backend_region_stats(be[1]);
    ds_sampling greedy = {.top_p = 1.0f};
    ds_rng rng;
    ds_rng_seed(&rng, 1);
    const int G = dr[0]->gamma, V = tg[0]->vocab;
    int start[2], ctx0[2], ctxn[2];
    int32_t last[2];
    for (int i = 0; i < 2; i++) {
        ds_target_crop(tg[i], 0);
        dr[i]->n_ctx = 0;
        CHECK_OK(ds_target_forward(tg[i], prompt, PROMPT, 0, 1));
        CHECK_OK(ds_drafter_append(dr[i], tg[i]->taps, 0, PROMPT));
        be[i]->ops->argmax(be[i], ds_rows(tg[i]->logits, 0, 1), &last[i]);
        start[i] = PROMPT;
        ctx0[i] = PROMPT;
        ctxn[i] = 0;
    }
    check_backends("drafter prefill");
    int rounds = 0, bad = 0;
    float *keep0 = malloc((size_t)G * V * sizeof *keep0);
    while (start[1] < PROMPT + STEPS && bad < 4) {
        ds_proposal prop[2];
        const bool keep = rounds % 3 == 2; /* the corrected logits kept: another recording */
        for (int i = 0; i < 2; i++) {
            dr[i]->keep_logits = keep;
            CHECK_OK(ds_drafter_round(dr[i], tg[i]->taps, ctx0[i], ctxn[i], last[i], start[i], &greedy, 0, &rng,
                                      &prop[i]));
            if (i == 0 && keep) memcpy(keep0, prop[0].logits, (size_t)G * V * sizeof *keep0);
        }
        check_backends("drafter round");
        if (memcmp(prop[0].tokens, prop[1].tokens, (size_t)G * sizeof(int32_t))) {
            CHECK(0, "drafter round %d at %d: tokens differ", rounds, start[1]);
            bad++;
        }
        if (keep && memcmp(keep0, prop[1].logits, (size_t)G * V * sizeof *keep0)) {
            CHECK(0, "drafter round %d at %d: corrected logits differ", rounds, start[1]);
            bad++;
        }
        if (dr[0]->confidence)
            CHECK(!memcmp(prop[0].conf_logit, prop[1].conf_logit, (size_t)G * sizeof(float)),
                  "drafter round %d: confidence differs", rounds);
        for (int i = 0; i < 2; i++) {
            int32_t ids[DS_MAX_GAMMA + 1], best[DS_MAX_GAMMA + 1];
            ids[0] = last[i];
            memcpy(ids + 1, prop[i].tokens, (size_t)G * sizeof(int32_t));
            CHECK_OK(ds_target_forward_argmax(tg[i], ids, G + 1, start[i], G + 1, best));
            int a = 0;
            while (a < G && best[a] == prop[i].tokens[a]) a++;
            ds_target_crop(tg[i], start[i] + a + 1);
            ctx0[i] = start[i];
            ctxn[i] = a + 1;
            start[i] += a + 1;
            last[i] = best[a];
        }
        check_backends("verify round");
        if (start[0] != start[1] || last[0] != last[1]) {
            CHECK(0, "round %d: accepted differently (graphs off at %d, on at %d)", rounds, start[0], start[1]);
            break;
        }
        rounds++;
    }
    free(keep0);
    for (int i = 0; i < 2; i++) dr[i]->keep_logits = false;
    ds_region_stats after = ds_backend_region_stats(be[1]);
    printf("  drafter: %d rounds to position %d, %lld captures, %lld replays (drafter rounds and verifies)\n", rounds,
           start[1], (long long)(after.captures - before.captures), (long long)(after.replays - before.replays));
    /* Two regions a round (the drafter round, the verify); each key (context
     * rows, kept logits, bucket) is warmed up and captured before it replays. */
    CHECK(after.replays - before.replays >= rounds / 2, "only %lld replays in %d rounds",
          (long long)(after.replays - before.replays), rounds);
}

/* Greedy generation: drafted == AR on the graphs backend, and the same
 * tokens with graphs off; the AR run also equals the AR steps above. */
static void test_generate_lossless(void) {
    ds_gen_params p = {.max_new = STEPS, .sampling = {.top_p = 1.0f}, .ignore_stop = true};
    ds_gen_result r[2][2]; /* [backend][drafted] */
    for (int i = 0; i < 2; i++) {
        CHECK_OK(ds_generate(tg[i], NULL, prompt, PROMPT, &p, NULL, NULL, &r[i][0]));
        CHECK_OK(ds_generate(tg[i], dr[i], prompt, PROMPT, &p, NULL, NULL, &r[i][1]));
    }
    check_backends("generate");
    CHECK(r[1][0].n_tokens == STEPS && r[1][1].n_tokens == STEPS, "%d / %d tokens", r[1][0].n_tokens,
          r[1][1].n_tokens);
    const size_t bytes = (size_t)STEPS * sizeof(int32_t);
    CHECK(!memcmp(r[1][0].tokens, ar_tokens, bytes), "AR generation (graphs on) differs from the AR steps");
    CHECK(!memcmp(r[1][1].tokens, r[1][0].tokens, bytes), "drafted greedy != AR greedy with graphs on");
    CHECK(!memcmp(r[0][1].tokens, r[1][1].tokens, bytes), "drafted greedy: graphs off != on");
    CHECK(!memcmp(r[0][0].tokens, r[1][0].tokens, bytes), "AR greedy: graphs off != on");
    CHECK(r[0][1].rounds == r[1][1].rounds, "rounds %d (off) vs %d (on)", r[0][1].rounds, r[1][1].rounds);
    printf("  generate: %d tokens from position %d, drafted in %d rounds, token-identical to AR\n", r[1][1].n_tokens,
           PROMPT, r[1][1].rounds);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) ds_gen_result_free(&r[i][j]);
    ds_region_stats s = ds_backend_region_stats(be[1]);
    printf("  graphs on, in all: %lld captures, %lld replays, %lld regions op by op, %lld graphs held\n",
           (long long)s.captures, (long long)s.replays, (long long)s.eager, (long long)s.graphs);
}

static void teardown(void) {
    for (int i = 0; i < 2; i++) {
        ds_drafter_free(dr[i]);
        ds_target_free(tg[i]);
        if (be[i]) be[i]->ops->destroy(be[i]);
    }
}

int main(void) {
    const char *dev = getenv("DS_CUDA_DEVICE");
    for (int i = 0; i < 2; i++) {
        setenv("DS_CUDA_GRAPHS", i ? "1" : "0", 1);
        ds_error *e = ds_backend_cuda_new(dev ? atoi(dev) : 0, &be[i]);
        if (e) {
            printf("SKIP: no CUDA device [%s]\n", ds_error_message(e));
            ds_error_free(e);
            if (be[0]) be[0]->ops->destroy(be[0]);
            return 77;
        }
    }
    test_fn fns[] = {setup, test_ar_steps, test_verify_shapes, test_drafter_rounds, test_generate_lossless, teardown};
    const char *names[] = {"setup", "test_ar_steps", "test_verify_shapes", "test_drafter_rounds",
                           "test_generate_lossless", "teardown"};
    return run_tests("cuda_graphs", fns, names, (int)(sizeof fns / sizeof fns[0]));
}
