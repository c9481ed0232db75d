/* The public API end to end on the bundled pico pair: text in, tokens out,
 * drafted greedy == plain greedy, streaming callback sees every token, a
 * callback can stop the generation, and bad options are errors. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

static ds_engine *eng;

typedef struct {
    int seen, stop_after;
} counter;

static bool count(void *user, int32_t tok) {
    counter *c = user;
    c->seen++;
    return c->stop_after == 0 || c->seen < c->stop_after;
}

static void setup(void) {
    ds_engine_opts o = {.model_dir = DS_MODELS "/pico-qwen3", .drafter_dir = DS_MODELS "/pico-qwen3-dspark"};
    CHECK_OK(ds_engine_open(&o, &eng));
}

static void test_drafted_equals_plain(void) {
    const char *text = "It is a truth universally acknowledged, that a single man";
    int32_t *ids;
    size_t n;
    CHECK_OK(ds_tokenizer_encode(ds_engine_tokenizer(eng), text, strlen(text), false, &ids, &n));
    ds_generate_opts g = {.max_new = 48};
    ds_output a, b;
    counter c = {0};
    CHECK_OK(ds_engine_generate(eng, ids, n, &g, count, &c, &a));
    g.no_draft = true;
    CHECK_OK(ds_engine_generate(eng, ids, n, &g, NULL, NULL, &b));
    CHECK(a.n_tokens == b.n_tokens && !memcmp(a.tokens, b.tokens, (size_t)a.n_tokens * sizeof *a.tokens),
          "drafted and plain greedy outputs differ");
    CHECK(c.seen == a.n_tokens, "callback saw %d of %d tokens", c.seen, a.n_tokens);
    CHECK(a.rounds > 0 && a.acceptance_length > 1.0, "rounds %d tau %.2f", a.rounds, a.acceptance_length);
    CHECK(b.rounds == 0, "plain decoding reported %d rounds", b.rounds);
    char *out;
    size_t len;
    CHECK_OK(ds_tokenizer_decode(ds_engine_tokenizer(eng), a.tokens, (size_t)a.n_tokens, true, &out, &len));
    printf("  \"%s\" -> \"%s\" (tau %.2f)\n", text, out, a.acceptance_length);
    free(out);
    ds_output_free(&a);
    ds_output_free(&b);
    free(ids);
}

static void test_callback_stops(void) {
    int32_t ids[] = {2811, 385, 1969};
    ds_generate_opts g = {.max_new = 40};
    counter c = {.stop_after = 5};
    ds_output o;
    CHECK_OK(ds_engine_generate(eng, ids, 3, &g, count, &c, &o));
    CHECK(o.n_tokens == 5, "stopped after %d tokens, want 5", o.n_tokens);
    ds_output_free(&o);
}

static void test_bad_options(void) {
    ds_engine *e2;
    ds_engine_opts o = {.model_dir = DS_MODELS "/pico-qwen3", .backend = "tpu"};
    CHECK_ERR(ds_engine_open(&o, &e2), "unknown backend \"tpu\"");
    ds_engine_opts none = {0};
    CHECK_ERR(ds_engine_open(&none, &e2), "no model directory");
    int32_t ids[600] = {0};
    ds_generate_opts g = {.max_new = 4};
    ds_output out;
    CHECK_ERR(ds_engine_generate(eng, ids, 600, &g, NULL, NULL, &out), "does not fit the model's context of 512");
    int32_t bad[] = {9000};
    CHECK_ERR(ds_engine_generate(eng, bad, 1, &g, NULL, NULL, &out), "outside the vocabulary");
}

static void teardown(void) { ds_engine_free(eng); }

RUN_TESTS("engine_api", setup, test_drafted_equals_plain, test_callback_stops, test_bad_options, teardown)
