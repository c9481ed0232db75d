/* Qwen3 target against the reference's fp32 goldens (testdata/fixtures/qwen3-tiny):
 * logits and every hidden state within 1e-4 relative error, greedy
 * continuation token-identical. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/target.h"
#include "testlib.h"

#define FIX DS_TESTDATA "/fixtures/qwen3-tiny"
#define TOL 1e-4

static ds_backend *be;

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void test_prompt_logits_and_hidden_states(void) {
    ds_target *t;
    CHECK_OK(ds_target_open(be, FIX "/target", NULL, &t));
    ds_safetensors *g = golden_open(FIX "/golden.safetensors");
    size_t T, n;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    float *logits = golden_f32(g, "target_logits_prompt", &n);
    float *layers = golden_f32(g, "target_layer_outputs", NULL);
    float *hs = golden_f32(g, "target_hidden_states", NULL);
    float *fnorm = golden_f32(g, "target_final_norm", NULL);
    const int V = t->vocab, H = t->hidden, L = t->n_layers;
    int taps[DS_MAX_TAPS];
    for (int l = -1; l < L; l++) taps[l + 1] = l;
    CHECK_OK(ds_target_set_taps(t, taps, L + 1));
    CHECK_OK(ds_target_forward(t, ids, (int)T, 0, (int)T));

    float *got = malloc(T * (size_t)V * sizeof *got);
    t->be->ops->download(be, ds_rows(t->logits, 0, (int64_t)T), got);
    double err = rel_err_max(got, logits, T * (size_t)V);
    printf("  prompt logits: max rel err %.2e (tolerance %.0e)\n", err, TOL);
    CHECK(err < TOL, "prompt logits rel err %.3g", err);

    float *tp = malloc(T * (size_t)(L + 1) * H * sizeof *tp), *one = malloc(T * (size_t)H * sizeof *one);
    t->be->ops->download(be, ds_rows(t->taps, 0, (int64_t)T), tp);
    for (int l = -1; l < L; l++) {
        for (size_t r = 0; r < T; r++) memcpy(one + r * H, tp + r * (size_t)(L + 1) * H + (size_t)(l + 1) * H, (size_t)H * 4);
        /* hidden_states[0] = embeddings, [l+1] = layer l output for l < L-1; layer_outputs[l] for all. */
        const float *want = l < 0 ? hs : layers + (size_t)l * T * H;
        err = rel_err_max(one, want, T * (size_t)H);
        CHECK(err < TOL, "layer %d output rel err %.3g", l, err);
        if (l >= 0 && l < L - 1) {
            err = rel_err_max(one, hs + (size_t)(l + 1) * T * H, T * (size_t)H);
            CHECK(err < TOL, "hidden_states[%d] rel err %.3g", l + 1, err);
        }
    }
    t->be->ops->download(be, ds_rows(t->final_hidden, 0, (int64_t)T), one);
    err = rel_err_max(one, fnorm, T * (size_t)H);
    CHECK(err < TOL, "final norm rel err %.3g", err);
    err = rel_err_max(one, hs + (size_t)L * T * H, T * (size_t)H);
    CHECK(err < TOL, "hidden_states[L] rel err %.3g", err);

    free(got);
    free(tp);
    free(one);
    free(ids);
    free(logits);
    free(layers);
    free(hs);
    free(fnorm);
    golden_close(g);
    ds_target_free(t);
}

/* Prefill, then one token at a time: every step's logits match the
 * reference's no-cache forward over the full sequence, and the greedy
 * tokens are the reference's. */
static void test_greedy_decode(void) {
    ds_target *t;
    CHECK_OK(ds_target_open(be, FIX "/target", NULL, &t));
    ds_safetensors *g = golden_open(FIX "/golden.safetensors");
    size_t T, N;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    int32_t *want = golden_i32(g, "ar_output_ids", &N);
    float *full = golden_f32(g, "target_logits_full", NULL);
    const int V = t->vocab;
    float *row = malloc((size_t)V * sizeof *row);
    CHECK_OK(ds_target_forward(t, ids, (int)T, 0, 1));
    int pos = (int)T;
    double worst = 0;
    for (size_t i = 0; i < N; i++) {
        t->be->ops->download(be, ds_rows(t->logits, 0, 1), row);
        double err = rel_err_max(row, full + (size_t)(pos - 1) * V, (size_t)V);
        if (err > worst) worst = err;
        int32_t next = argmax(row, V);
        CHECK(next == want[i], "token %zu: got %d, want %d", i, next, want[i]);
        if (next != want[i]) break;
        CHECK_OK(ds_target_forward(t, &next, 1, pos++, 1));
    }
    printf("  decode-step logits: max rel err %.2e over %zu steps\n", worst, N);
    CHECK(worst < TOL, "decode logits rel err %.3g", worst);
    free(row);
    free(ids);
    free(want);
    free(full);
    golden_close(g);
    ds_target_free(t);
}

/* A row's logits must not depend on how many rows share the forward. */
static void test_row_invariance(void) {
    ds_target *t;
    CHECK_OK(ds_target_open(be, FIX "/target", NULL, &t));
    ds_safetensors *g = golden_open(FIX "/golden.safetensors");
    size_t N;
    int32_t *full = golden_i32(g, "full_ids", &N);
    const int V = t->vocab, T = 24, n = 5;
    float *a = malloc((size_t)n * V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
    CHECK_OK(ds_target_forward(t, full, T, 0, 1));
    CHECK_OK(ds_target_forward(t, full + T, n, T, n));
    t->be->ops->download(be, ds_rows(t->logits, 0, n), a);
    ds_target_crop(t, T);
    for (int i = 0; i < n; i++) {
        CHECK_OK(ds_target_forward(t, full + T + i, 1, T + i, 1));
        t->be->ops->download(be, ds_rows(t->logits, 0, 1), b);
        CHECK(!memcmp(a + (size_t)i * V, b, (size_t)V * sizeof *b), "row %d differs between a %d-row and a 1-row forward", i, n);
    }
    free(a);
    free(b);
    free(full);
    golden_close(g);
    ds_target_free(t);
}

static void setup(void) { CHECK_OK(test_backend_new(&be)); }
static void teardown(void) { be->ops->destroy(be); }

RUN_TESTS("qwen3", setup, test_prompt_logits_and_hidden_states, test_greedy_decode, test_row_invariance, teardown)
