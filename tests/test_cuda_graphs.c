/* CUDA graphs (backend.h step regions) against the same GPU running every
 * op by op: two CUDA backends, one made with graphs off (cfg.graphs), one with
 * graphs on, each holding the same target and DSpark drafter, for each
 * model below in turn (pico Qwen3; Gemma 4 tiny: sliding layers over a ring
 * of window 8 + max_rows 8 rows, K = V full layers, proportional RoPE,
 * soft-capped logits, with its DSpark drafter; Gemma 4 E tiny: per-layer
 * inputs and KV sharing, no drafter; `dspark synth --like gemma4-tiny`: the
 * 12B's layout at a tiny width in bf16 (bf16 matmuls, bf16 logits), 48
 * layers, its drafter's gamma 7 verifying 8 rows):
 * - AR: a random prompt, then greedy steps (pico and Gemma 4 tiny: positions
 *   200..359, across the 256-key boundary where attention's grid changes
 *   bucket; the Gemma 4 rings wrap every 16 positions): every step's logits
 *   bit for bit and its argmax token equal;
 * - verify shapes: forwards of n = 1..8 rows (pico: at positions around
 *   256, rewinding each time; Gemma 4: walking forward from a fresh
 *   prefill, keeping a row or two of each, as verification does, since a
 *   ring only holds the window behind the furthest position written), each
 *   shape several times (warm-up, capture, replays): logits bit for bit;
 * - drafter rounds (context update + block + LM head + Markov walk): the
 *   tokens and the corrected logits bit for bit, round after round;
 * - drafted greedy generation == AR greedy generation with graphs on (and
 *   both == graphs off), across the boundary, without and with a
 *   confidence threshold; with graphs on one device->host copy a round
 *   (ds_region_stats.d2h) and one an AR step;
 * - the graphs backend did capture and replay, the other never did.
 * Skips (exit 77) where no CUDA device can be used. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_config.h"
#include "draft/drafter.h"
#include "speculate/generate.h"
#include "testlib.h"

#define MAX_PROMPT 200
#define MAX_STEPS 160

typedef struct {
    const char *name, *target, *drafter; /* drafter NULL: none */
    int max_rows, max_logit_rows, drafter_rows;
    int vocab_ids;   /* prompt ids are drawn below this */
    int prompt, steps;
    int verify_pos0; /* where the verify shapes start */
    bool verify_far; /* rewind to around verify_pos0 for every shape (a cache indexed by position) */
    const char *synth; /* made by `dspark synth --like <synth> --drafter` into a scratch directory */
} model_case;

static const model_case cases[] = {
    {"pico-qwen3", DS_MODELS "/pico-qwen3", DS_MODELS "/pico-qwen3-dspark", 256, 33, 256, 8192, 200, 160, 246, true,
     NULL},
    {"gemma4-tiny", DS_TESTDATA "/fixtures/gemma4-tiny/target", DS_TESTDATA "/fixtures/gemma4-tiny/drafter", 8, 8, 8,
     512, 200, 160, 230, false, NULL},
    {"gemma4-e-tiny", DS_TESTDATA "/fixtures/gemma4-e-tiny/target", NULL, 8, 8, 8, 512, 100, 140, 100, false, NULL},
    {"synth gemma4-tiny (bf16)", NULL, NULL, 8, 8, 8, 512, 100, 140, 100, false, "gemma4-tiny"},
};

static char synth_dir[64]; /* the scratch directory of a synth case ("" when none) */

static const model_case *mc; /* the model under test */
#define PROMPT (mc->prompt)
#define STEPS (mc->steps)

static ds_backend *be[2]; /* [0]: graphs off, [1]: graphs on */
static ds_target *tg[2];
static ds_drafter *dr[2];
static int32_t prompt[MAX_PROMPT];
static int32_t ar_tokens[MAX_STEPS + 1];

static void close_models(void) {
    for (int i = 0; i < 2; i++) {
        ds_drafter_free(dr[i]);
        ds_target_free(tg[i]);
        dr[i] = NULL;
        tg[i] = NULL;
    }
}

static void remove_synth(void) {
    if (!synth_dir[0]) return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", synth_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", synth_dir);
    synth_dir[0] = 0;
}

/* The model directories of mc: its own, or synth's output. */
static ds_error *model_dirs(char *target, char *drafter, size_t n) {
    if (!mc->synth) {
        snprintf(target, n, "%s", mc->target);
        snprintf(drafter, n, "%s", mc->drafter ? mc->drafter : "");
        return NULL;
    }
    snprintf(synth_dir, sizeof synth_dir, "/tmp/ds_test_cuda_graphs_%ld", (long)getpid());
    snprintf(target, n, "%s/t", synth_dir);
    snprintf(drafter, n, "%s/d", synth_dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && '%s' synth --like %s --out '%s' --drafter --drafter-out '%s' >/dev/null",
             synth_dir, DS_CLI, mc->synth, target, drafter);
    if (system(cmd) != 0) return ds_errorf("%s failed (is the dspark CLI built?)", cmd);
    return NULL;
}

static ds_error *open_pair(int i, const char *target, const char *drafter) {
    ds_target_opts to = {.max_rows = mc->max_rows, .max_logit_rows = mc->max_logit_rows};
    DS_TRY(ds_target_open(be[i], target, &to, &tg[i]));
    if (!drafter[0]) return NULL;
    ds_drafter_opts dopt = {.max_rows = mc->drafter_rows};
    DS_TRY(ds_drafter_open(be[i], drafter, tg[i], &dopt, &dr[i]));
    return ds_target_set_taps(tg[i], dr[i]->tap_layers, dr[i]->n_taps);
}

/* Opens cases[c] on both backends (after closing the last one). */
static void open_case(int c) {
    close_models();
    remove_synth();
    mc = &cases[c];
    printf("  -- %s (max_rows %d)\n", mc->name, mc->max_rows);
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < PROMPT; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((s >> 33) % (uint64_t)mc->vocab_ids);
    }
    char target[256], drafter[256];
    CHECK_OK(model_dirs(target, drafter, sizeof target));
    for (int i = 0; i < 2; i++) CHECK_OK(open_pair(i, target, drafter));
    ds_region_stats st0 = ds_backend_region_stats(be[0]), st1 = ds_backend_region_stats(be[1]);
    CHECK(!st0.enabled, "cfg.graphs = false left graphs on");
    CHECK(st1.enabled, "graphs are off on the graphs backend (DS_CUDA_PROFILE or DS_CUDA_RING_TRACE set?)");
    CHECK(tg[0]->graph_safe && (!dr[0] || dr[0]->graph_safe), "%s runs op by op (not graph-safe)", mc->name);
}

static void setup(void) { open_case(0); }
static void open_gemma4(void) { open_case(1); }
static void open_gemma4_e(void) { open_case(2); }
static void open_gemma4_synth(void) { open_case(3); }

/* Both models open (a failed open was reported already). */
static bool have_models(void) { return tg[0] && tg[1] && (!(mc->drafter || mc->synth) || (dr[0] && dr[1])); }

/* ids[0..n) from position 0 on backend i, in chunks of the target's max_rows
 * (and the drafter's, whose context they become when with_drafter); logits
 * of the last row. */
static ds_error *prefill(int i, const int32_t *ids, int n, bool with_drafter) {
    int chunk = tg[i]->max_rows;
    if (with_drafter && dr[i]->max_rows < chunk) chunk = dr[i]->max_rows;
    for (int p = 0; p < n; p += chunk) {
        const int k = n - p < chunk ? n - p : chunk;
        DS_TRY(ds_target_forward(tg[i], ids + p, k, p, p + k == n ? 1 : 0));
        if (with_drafter) DS_TRY(ds_drafter_append(dr[i], tg[i]->taps, p, k));
    }
    return NULL;
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
    if (!have_models()) return;
    for (int i = 0; i < 2; i++) {
        ds_target_crop(tg[i], 0);
        CHECK_OK(prefill(i, prompt, PROMPT, false));
    }
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
    /* One shape, one or two buckets (n_keys <= 256 and above): a capture each, the rest replays. */
    const int buckets = PROMPT + 1 <= 256 && PROMPT + STEPS > 256 ? 2 : 1;
    CHECK(after.captures - before.captures >= buckets, "AR steps captured %lld graphs",
          (long long)(after.captures - before.captures));
    CHECK(after.replays - before.replays >= STEPS - 6, "only %lld of %d AR steps replayed",
          (long long)(after.replays - before.replays), STEPS);
    CHECK(ds_backend_region_stats(be[0]).replays == 0, "graphs off, yet replays");
}

/* One verify forward of ids[0..n) at pos0 on both backends, with and
 * without the argmax (two recordings), compared; n_cached: where each
 * target's cache is cut to before each (at least pos0). */
static void verify_once(const int32_t *ids, int n, int pos0, int n_cached) {
    int32_t best[2][8];
    for (int i = 0; i < 2; i++) tg[i]->n_cached = n_cached;
    for (int i = 0; i < 2; i++) CHECK_OK(ds_target_forward_argmax(tg[i], ids, n, pos0, n, best[i]));
    check_backends("verify");
    CHECK(!memcmp(best[0], best[1], (size_t)n * sizeof(int32_t)), "verify n=%d at %d: argmax differs", n, pos0);
    same_logits(n, "verify", pos0 * 100 + n);
    /* The plain forward (logits only, no argmax) is its own recording. */
    for (int i = 0; i < 2; i++) tg[i]->n_cached = n_cached;
    for (int i = 0; i < 2; i++) CHECK_OK(ds_target_forward(tg[i], ids, n, pos0, n));
    check_backends("verify (no argmax)");
    same_logits(n, "verify (no argmax)", pos0 * 100 + n);
}

static void test_verify_shapes(void) {
    if (!have_models()) return;
    ds_region_stats before = ds_backend_region_stats(be[1]);
    int32_t ids[8];
    int pos0 = mc->verify_pos0;
    if (!mc->verify_far) {
        /* A fresh prefill of the prompt and the AR tokens up to pos0. */
        int32_t seq[MAX_PROMPT + MAX_STEPS + 1];
        memcpy(seq, prompt, (size_t)PROMPT * sizeof *seq);
        memcpy(seq + PROMPT, ar_tokens, (size_t)(STEPS + 1) * sizeof *seq);
        for (int i = 0; i < 2; i++) {
            ds_target_crop(tg[i], 0);
            CHECK_OK(prefill(i, seq, pos0, false));
        }
    }
    const int first = pos0;
    for (int n = 1; n <= 8; n++)
        for (int k = 0; k < 8; k++) {
            for (int j = 0; j < n; j++) ids[j] = prompt[(7 * k + 3 * j + n) % PROMPT];
            if (mc->verify_far) {
                /* pos0 246..260: n_keys from 247 to 268, on both sides of 256.
                 * Rows past pos0 hold what the steps above (and the last
                 * forward) wrote, the same on both backends: score from there. */
                pos0 = mc->verify_pos0 + 2 * k;
                verify_once(ids, n, pos0, PROMPT + STEPS);
            } else {
                /* Score n rows, keep one or two (the cache cut after them), go on. */
                verify_once(ids, n, pos0, pos0);
                pos0 += n < 1 + k % 2 ? n : 1 + k % 2;
                for (int i = 0; i < 2; i++) ds_target_crop(tg[i], pos0);
            }
        }
    ds_region_stats after = ds_backend_region_stats(be[1]);
    printf("  verify n=1..8 at %d..%d: %lld captures, %lld replays\n", first, mc->verify_far ? pos0 : pos0 - 1,
           (long long)(after.captures - before.captures), (long long)(after.replays - before.replays));
    /* Per (n, argmax, bucket): a warm-up run and a capture, then replays (a
     * scratch buffer grown by a new shape's warm-up makes older recordings
     * be captured again, so fewer than the 64 possible). */
    CHECK(after.replays - before.replays >= 32, "only %lld of 128 verify forwards replayed",
          (long long)(after.replays - before.replays));
}

/* The speculative loop by hand on both backends: the drafter round (with the
 * previous round's accepted rows as context), then the verify forward. */
static void test_drafter_rounds(void) {
    if (!have_models() || !dr[0]) return;
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
        CHECK_OK(prefill(i, prompt, PROMPT, true));
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
            CHECK_OK(ds_drafter_round(dr[i], tg[i]->taps, ctx0[i], ctxn[i], last[i], start[i], &greedy, 0, false,
                                      &rng, &prop[i]));
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
 * tokens with graphs off; the AR run also equals the AR steps above. With
 * graphs on, a drafted round moves one array to the host (the verify's
 * argmaxes, accepted count and proposal length): the generation's
 * device->host copies are its rounds plus the first token's argmax. With
 * a threshold the proposal length is decided on the device (conf_cut), the
 * same with graphs off (op by op, its own copy). A model without a drafter
 * checks AR alone. */
static void generate_case(float threshold) {
    ds_gen_params p = {.max_new = STEPS, .sampling = {.top_p = 1.0f}, .ignore_stop = true, .threshold = threshold};
    ds_gen_result r[2][2]; /* [backend][drafted] */
    int64_t d2h[2][2] = {{0}};
    memset(r, 0, sizeof r);
    for (int i = 0; i < 2; i++) {
        int64_t c0 = ds_backend_region_stats(be[i]).d2h;
        CHECK_OK(ds_generate(tg[i], NULL, prompt, PROMPT, &p, NULL, NULL, &r[i][0]));
        int64_t c1 = ds_backend_region_stats(be[i]).d2h;
        d2h[i][0] = c1 - c0;
        if (!dr[i]) continue;
        CHECK_OK(ds_generate(tg[i], dr[i], prompt, PROMPT, &p, NULL, NULL, &r[i][1]));
        d2h[i][1] = ds_backend_region_stats(be[i]).d2h - c1;
    }
    check_backends("generate");
    CHECK(d2h[1][0] == r[1][0].n_tokens, "AR: %lld device->host copies for %d tokens", (long long)d2h[1][0],
          r[1][0].n_tokens);
    if (!dr[0]) { /* AR only: graphs on == off == the AR steps */
        const size_t bytes = (size_t)STEPS * sizeof(int32_t);
        CHECK(r[1][0].n_tokens == STEPS, "%d tokens", r[1][0].n_tokens);
        CHECK(!memcmp(r[1][0].tokens, ar_tokens, bytes), "AR generation (graphs on) differs from the AR steps");
        CHECK(!memcmp(r[0][0].tokens, r[1][0].tokens, bytes), "AR greedy: graphs off != on");
        printf("  generate: %d tokens from position %d (AR, no drafter), graphs on == off; %lld device->host copies\n",
               r[1][0].n_tokens, PROMPT, (long long)d2h[1][0]);
        for (int i = 0; i < 2; i++) ds_gen_result_free(&r[i][0]);
        return;
    }
    printf("  threshold %.2f: device->host copies: AR %lld for %d tokens (graphs on), %lld (off); drafted %lld for %d "
           "rounds + the first token (on), %lld for %d rounds (off)\n", threshold, (long long)d2h[1][0],
           r[1][0].n_tokens, (long long)d2h[0][0], (long long)d2h[1][1], r[1][1].rounds, (long long)d2h[0][1],
           r[0][1].rounds);
    CHECK(d2h[1][1] == r[1][1].rounds + 1, "threshold %.2f: %lld device->host copies for %d drafted rounds (want one "
          "a round, and one for the first token)", threshold, (long long)d2h[1][1], r[1][1].rounds);
    if (r[0][1].rounds == r[1][1].rounds)
        CHECK(!memcmp(r[0][1].proposed, r[1][1].proposed, (size_t)r[1][1].rounds * sizeof(int)) &&
                  !memcmp(r[0][1].accepted, r[1][1].accepted, (size_t)r[1][1].rounds * sizeof(int)),
              "threshold %.2f: proposal lengths or accepted counts differ between graphs off and on", threshold);
    if (threshold > 0) {
        int cut = 0;
        for (int k = 0; k < r[1][1].rounds; k++) cut += r[1][1].proposed[k] < dr[1]->gamma;
        printf("  threshold %.2f: %d of %d proposals cut by the confidence head on the device\n", threshold, cut,
               r[1][1].rounds);
    }
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

static void test_generate_lossless(void) {
    if (!have_models()) return;
    generate_case(0.0f);
    generate_case(0.5f);
}

/* ---- ops in regions, shapes the pico model does not reach ---------------- */

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* The same random fp32 tensor on both backends. Scale 0: +0.0 everywhere
 * (a negative draw times 0 is -0.0, and tensors compared bit for bit must
 * not differ in the sign of a zero nobody wrote). */
static void pair_rand(int64_t rows, int64_t cols, float scale, ds_tensor t[2]) {
    float *v = malloc((size_t)(rows * cols) * sizeof *v);
    for (int64_t i = 0; i < rows * cols; i++) {
        const float r = frand() * scale;
        v[i] = r == 0.0f ? 0.0f : r;
    }
    for (int i = 0; i < 2; i++) {
        ds_error *e = be[i]->ops->alloc(be[i], DS_F32, rows, cols, &t[i]);
        if (e) {
            CHECK(0, "alloc: %s", ds_error_message(e));
            ds_error_free(e);
        } else {
            be[i]->ops->upload(be[i], t[i], v);
        }
    }
    free(v);
}

static bool same_tensor(ds_tensor t[2], const char *what, int at) {
    size_t n = (size_t)(t[0].rows * t[0].cols);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    be[0]->ops->download(be[0], t[0], a);
    be[1]->ops->download(be[1], t[1], b);
    check_backends(what);
    bool eq = !memcmp(a, b, n * sizeof *a);
    CHECK(eq, "%s at %d: graphs on and off differ", what, at);
    free(a);
    free(b);
    return eq;
}

/* Attention in a region (graphs on) vs op by op (off), bit for bit: decode
 * and verify rows at positions that move through buckets of 1, 2, 4 and 8
 * key chunks, causal, windowed over a ring, and not causal; every shape
 * several times (warm-up, capture, replays). */
static void attention_case(bool causal, int window, int ring, const char *name) {
    enum { H = 4, KVH = 2, D = 64, CAP = 2048 };
    const int rows_cache = ring ? ring : CAP;
    ds_tensor q[2], k[2], v[2], out[2];
    pair_rand(8, H * D, 1.0f, q);
    pair_rand(rows_cache, KVH * D, 1.0f, k);
    pair_rand(rows_cache, KVH * D, 1.0f, v);
    pair_rand(8, H * D, 0.0f, out);
    int32_t ids[8] = {0}, pos[8], res[8];
    ds_step st = {.ids = ids, .pos = pos, .out = res, .cap = 8};
    const int p0s[] = {3, 200, 250, 260, 500, 700, 1000, 1030, 1500, 1900};
    ds_region_stats before = ds_backend_region_stats(be[1]);
    int bad = 0;
    for (int R = 1; R <= 8; R += 7)
        for (int rep = 0; rep < 3 && bad < 3; rep++)
            for (size_t c = 0; c < sizeof p0s / sizeof p0s[0] && bad < 3; c++) {
                const int p0 = p0s[c] + 5 * rep;
                for (int i = 0; i < R; i++) pos[i] = p0 + i;
                st.n_keys = p0 + R;
                st.n_ids = 0;
                st.n_pos = R;
                st.n_out = 0;
                ds_attn_params ap = {.n_heads = H, .n_kv_heads = KVH, .head_dim = D, .v_head_dim = D,
                                     .n_keys = st.n_keys, .causal = causal, .window = window, .ring_size = ring,
                                     .scale = 0.125f, .q_pos = pos};
                ds_tensor qr[2] = {ds_rows(q[0], 0, R), ds_rows(q[1], 0, R)};
                ds_tensor orow[2] = {ds_rows(out[0], 0, R), ds_rows(out[1], 0, R)};
                be[0]->ops->attention(be[0], orow[0], qr[0], k[0], v[0], &ap);
                ds_region_key key = {100, R, (causal ? 1 : 0) | window << 1 | ring << 12, &st};
                if (ds_region_begin(be[1], &key, &st)) be[1]->ops->attention(be[1], orow[1], qr[1], k[1], v[1], &ap);
                ds_region_end(be[1]);
                if (!same_tensor(orow, name, p0 * 10 + R)) bad++;
            }
    ds_region_stats after = ds_backend_region_stats(be[1]);
    printf("  attention %-22s %lld captures, %lld replays\n", name, (long long)(after.captures - before.captures),
           (long long)(after.replays - before.replays));
    CHECK(after.replays - before.replays >= 10, "%s: only %lld replays", name,
          (long long)(after.replays - before.replays));
    ds_tensor *all[] = {q, k, v, out};
    for (size_t t = 0; t < 4; t++)
        for (int i = 0; i < 2; i++) be[i]->ops->release(be[i], &all[t][i]);
}

static void test_attention_regions(void) {
    attention_case(true, 0, 0, "causal");
    attention_case(true, 300, 512, "causal, window 300, ring");
    attention_case(false, 0, 0, "not causal");
}

/* Random values into rows [0, rows) of t on both backends (outside regions). */
static void refill(ds_tensor t[2], int64_t rows, float scale) {
    float *v = malloc((size_t)(rows * t[0].cols) * sizeof *v);
    for (int64_t i = 0; i < rows * t[0].cols; i++) v[i] = frand() * scale;
    for (int i = 0; i < 2; i++) be[i]->ops->upload(be[i], ds_rows(t[i], 0, rows), v);
    free(v);
}

static bool same_host(ds_backend *b, ds_tensor x, ds_tensor y) {
    size_t n = (size_t)(x.rows * x.cols);
    float *a = malloc(n * sizeof *a), *c = malloc(n * sizeof *c);
    b->ops->download(b, x, a);
    b->ops->download(b, y, c);
    bool eq = !memcmp(a, c, n * sizeof *a);
    free(a);
    free(c);
    return eq;
}

/* qk_norm_rope_store in a region vs op by op, and op by op vs the unfused
 * sequence (qk_norm_rope in place, then row copies): q and the caches bit
 * for bit, positions wrapping a ring, rows 1, 3, 5, 7, each shape recorded
 * and replayed. */
static void test_store_regions(void) {
    enum { H = 4, KVH = 2, D = 64, RING = 40, STEPS_ = 32 };
    float inv_freq[D / 2];
    for (int i = 0; i < D / 2; i++) inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / D);
    ds_tensor qw[2], kw[2], kc[2], vc[2], kc2[2], vc2[2], q[2], k[2], v[2], qu[2], ku[2];
    pair_rand(1, D, 1.0f, qw);
    pair_rand(1, D, 1.0f, kw);
    pair_rand(RING, KVH * D, 0.0f, kc);
    pair_rand(RING, KVH * D, 0.0f, vc);
    pair_rand(RING, KVH * D, 0.0f, kc2);
    pair_rand(RING, KVH * D, 0.0f, vc2);
    pair_rand(8, H * D, 0.0f, q);
    pair_rand(8, KVH * D, 0.0f, k);
    pair_rand(8, KVH * D, 0.0f, v);
    pair_rand(8, H * D, 0.0f, qu);
    pair_rand(8, KVH * D, 0.0f, ku);
    int32_t ids[8] = {0}, pos[8], res[8];
    ds_step st = {.ids = ids, .pos = pos, .out = res, .cap = 8};
    ds_region_stats before = ds_backend_region_stats(be[1]);
    int bad = 0;
    for (int step = 0; step < STEPS_ && bad < 3; step++) {
        const int R = 1 + step % 4 * 2, p0 = 7 * step; /* wraps the ring of 40 */
        refill(q, R, 2.0f);
        refill(k, R, 2.0f);
        refill(v, R, 2.0f);
        for (int i = 0; i < R; i++) pos[i] = p0 + i;
        st.n_keys = p0 + R;
        st.n_ids = 0;
        st.n_pos = R;
        st.n_out = 0;
        ds_tensor qr[2], kr[2], vr[2];
        for (int i = 0; i < 2; i++) qr[i] = ds_rows(q[i], 0, R), kr[i] = ds_rows(k[i], 0, R), vr[i] = ds_rows(v[i], 0, R);
        /* The unfused sequence, graphs-off backend, on copies. */
        ds_tensor qur = ds_rows(qu[0], 0, R), kur = ds_rows(ku[0], 0, R);
        be[0]->ops->copy(be[0], qur, qr[0]);
        be[0]->ops->copy(be[0], kur, kr[0]);
        be[0]->ops->qk_norm_rope(be[0], qur, qw[0], kur, kw[0], D, 1e-6f, pos, inv_freq);
        ds_store_rows_paged(be[0], kc2[0], kur, RING, pos, NULL);
        ds_store_rows_paged(be[0], vc2[0], vr[0], RING, pos, NULL);
        be[0]->ops->qk_norm_rope_store(be[0], qr[0], qw[0], kr[0], kw[0], vr[0], kc[0], vc[0], RING, D, 1e-6f, pos,
                                       inv_freq);
        ds_region_key key = {101, R, 0, &st};
        if (ds_region_begin(be[1], &key, &st))
            be[1]->ops->qk_norm_rope_store(be[1], qr[1], qw[1], kr[1], kw[1], vr[1], kc[1], vc[1], RING, D, 1e-6f,
                                           pos, inv_freq);
        ds_region_end(be[1]);
        bool ok = same_tensor(qr, "store: q", step) & same_tensor(kc, "store: k cache", step) &
                  same_tensor(vc, "store: v cache", step);
        bool q_ok = same_host(be[0], qur, qr[0]), k_ok = same_host(be[0], kc2[0], kc[0]),
             v_ok = same_host(be[0], vc2[0], vc[0]);
        CHECK(q_ok && k_ok && v_ok, "store step %d: qk_norm_rope_store differs from qk_norm_rope + row copies (q %d, "
              "k %d, v %d)", step, q_ok, k_ok, v_ok);
        bad += !ok || !q_ok || !k_ok || !v_ok;
    }
    check_backends("store");
    ds_region_stats after = ds_backend_region_stats(be[1]);
    printf("  qk_norm_rope_store: %d steps, %lld captures, %lld replays\n", STEPS_,
           (long long)(after.captures - before.captures), (long long)(after.replays - before.replays));
    CHECK(after.replays - before.replays >= 8, "store: only %lld replays", (long long)(after.replays - before.replays));
    ds_tensor *all[] = {qw, kw, kc, vc, kc2, vc2, q, k, v, qu, ku};
    for (size_t t = 0; t < sizeof all / sizeof all[0]; t++)
        for (int i = 0; i < 2; i++) be[i]->ops->release(be[i], &all[t][i]);
}

static void teardown(void) {
    close_models();
    remove_synth();
    for (int i = 0; i < 2; i++)
        if (be[i]) be[i]->ops->destroy(be[i]);
}

int main(int argc, char **argv) {
    const char *dev = getenv("DS_CUDA_DEVICE");
    ds_cuda_config cfg;
    ds_error *ce = ds_cuda_config_from_env(&cfg);
    if (ce) {
        printf("FAIL: %s\n", ds_error_message(ce));
        ds_error_free(ce);
        return 1;
    }
    /* --ring (ctest's test_cuda_graphs_ring): the ring matmul takes every bf16 projection it can, however few
     * its tiles (at the test models' shapes the per-tile kernel takes them otherwise). */
    if (argc > 1 && !strcmp(argv[1], "--ring")) cfg.ring_min_tiles = 1;
    for (int i = 0; i < 2; i++) {
        cfg.graphs = i;
        ds_error *e = ds_backend_cuda_new_with(dev ? atoi(dev) : 0, &cfg, &be[i]);
        if (e) {
            printf("SKIP: no CUDA device [%s]\n", ds_error_message(e));
            ds_error_free(e);
            if (be[0]) be[0]->ops->destroy(be[0]);
            return 77;
        }
    }
    test_fn fns[] = {setup,
                     test_ar_steps,
                     test_verify_shapes,
                     test_drafter_rounds,
                     test_generate_lossless,
                     open_gemma4,
                     test_ar_steps,
                     test_verify_shapes,
                     test_drafter_rounds,
                     test_generate_lossless,
                     open_gemma4_e,
                     test_ar_steps,
                     test_verify_shapes,
                     test_generate_lossless,
                     open_gemma4_synth,
                     test_ar_steps,
                     test_verify_shapes,
                     test_drafter_rounds,
                     test_generate_lossless,
                     test_attention_regions,
                     test_store_regions,
                     teardown};
    const char *names[] = {"setup",
                           "test_ar_steps",
                           "test_verify_shapes",
                           "test_drafter_rounds",
                           "test_generate_lossless",
                           "open_gemma4",
                           "gemma4_ar_steps",
                           "gemma4_verify_shapes",
                           "gemma4_drafter_rounds",
                           "gemma4_generate_lossless",
                           "open_gemma4_e",
                           "gemma4_e_ar_steps",
                           "gemma4_e_verify_shapes",
                           "gemma4_e_generate_lossless",
                           "open_gemma4_synth",
                           "gemma4_synth_ar_steps",
                           "gemma4_synth_verify_shapes",
                           "gemma4_synth_drafter_rounds",
                           "gemma4_synth_generate_lossless",
                           "test_attention_regions",
                           "test_store_regions",
                           "teardown"};
    _Static_assert(sizeof fns / sizeof fns[0] == sizeof names / sizeof names[0], "a name per test");
    return run_tests("cuda_graphs", fns, names, (int)(sizeof fns / sizeof fns[0]));
}
