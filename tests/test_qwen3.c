/* Qwen3 target against the reference's fp32 goldens (testdata/fixtures/qwen3-tiny):
 * logits and every hidden state within 1e-4 relative error, greedy
 * continuation token-identical. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "target_goldens.h"

#define FIX DS_TESTDATA "/fixtures/qwen3-tiny"
#define TOL 1e-4

static ds_backend *be;

static void test_prompt_logits_and_hidden_states(void) {
    ds_target *t;
    ds_safetensors *g;
    CHECK_OK(open_target_fixture(be, FIX, NULL, &t, &g));
    check_target_prompt(t, g, TOL, "qwen3-tiny");
    golden_close(g);
    ds_target_free(t);
}

/* Prefill, then one token at a time: every step's logits match the
 * reference's no-cache forward over the full sequence, and the greedy
 * tokens are the reference's. */
static void test_greedy_decode(void) {
    ds_target *t;
    ds_safetensors *g;
    CHECK_OK(open_target_fixture(be, FIX, NULL, &t, &g));
    size_t T;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    CHECK_OK(ds_target_forward(t, ids, (int)T, 0, 1));
    check_target_greedy(t, g, (int)T, TOL, "qwen3-tiny");
    free(ids);
    golden_close(g);
    ds_target_free(t);
}

/* A row's logits must not depend on how many rows share the forward. */
static void test_row_invariance(void) {
    ds_target *t;
    ds_safetensors *g;
    CHECK_OK(open_target_fixture(be, FIX, NULL, &t, &g));
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
