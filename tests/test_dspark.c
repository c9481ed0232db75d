/* DSpark drafter + speculative loop against the reference's fp32 goldens
 * (testdata/fixtures/qwen3-tiny): context projection, block hidden states,
 * base and Markov-corrected logits within 1e-4 relative error, confidences
 * within 1e-5, draft tokens exact, and the speculative greedy run's tokens
 * and per-round accepted lengths identical — for the random drafter and the
 * trained one (where acceptance is partial). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "draft/drafter.h"
#include "spec/generate.h"
#include "testlib.h"

#define FIX DS_TESTDATA "/fixtures/qwen3-tiny"
#define TOL 1e-4

static ds_backend *be;

static void check_round0(const char *drafter_dir, const char *golden) {
    ds_target *t;
    ds_drafter *d;
    CHECK_OK(ds_target_open(be, FIX "/target", NULL, &t));
    CHECK_OK(ds_drafter_open(be, drafter_dir, t, NULL, &d));
    ds_safetensors *g = golden_open(golden);
    size_t T, n;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    float *ctx_want = golden_f32(g, "context_projected", NULL);
    float *hid_want = golden_f32(g, "round0_block_hidden", NULL);
    float *base_want = golden_f32(g, "round0_base_logits", NULL);
    float *markov_want = golden_f32(g, "round0_markov_logits", NULL);
    int32_t *draft_want = golden_i32(g, "round0_draft_tokens", &n);
    int32_t *block_in = golden_i32(g, "round0_block_input_ids", NULL);
    float *conf_want = golden_f32(g, "round0_confidence_logits", NULL);
    const int H = d->hidden, V = d->vocab, G = d->gamma;
    CHECK(n == (size_t)G, "gamma %d vs golden %zu", G, n);

    CHECK_OK(ds_target_set_taps(t, d->tap_layers, d->n_taps));
    CHECK_OK(ds_target_forward(t, ids, (int)T, 0, 1));
    CHECK_OK(ds_drafter_append(d, t->taps, 0, (int)T));
    float *got = malloc(T * (size_t)V * sizeof *got);
    be->ops->download(be, ds_rows(d->ctx, 0, (int64_t)T), got);
    double err = rel_err_max(got, ctx_want, T * (size_t)H);
    printf("  context projection rel err %.2e\n", err);
    CHECK(err < TOL, "context_projected rel err %.3g", err);

    ds_sampling greedy = {0};
    ds_proposal prop;
    CHECK_OK(ds_drafter_propose(d, block_in[0], (int)T, &greedy, 0, NULL, &prop));
    be->ops->download(be, d->block_hidden, got);
    err = rel_err_max(got, hid_want, (size_t)G * H);
    printf("  block hidden rel err %.2e\n", err);
    CHECK(err < TOL, "block hidden rel err %.3g", err);
    be->ops->download(be, d->logits, got);
    err = rel_err_max(got, base_want, (size_t)G * V);
    printf("  base logits rel err %.2e\n", err);
    CHECK(err < TOL, "base logits rel err %.3g", err);
    err = rel_err_max(prop.logits, markov_want, (size_t)G * V);
    printf("  markov logits rel err %.2e\n", err);
    CHECK(err < TOL, "markov logits rel err %.3g", err);
    for (int k = 0; k < G; k++) CHECK(prop.tokens[k] == draft_want[k], "draft %d: %d vs %d", k, prop.tokens[k], draft_want[k]);
    double cerr = 0;
    for (int k = 0; k < G; k++) cerr = fmax(cerr, fabs(1 / (1 + exp(-prop.conf_logit[k])) - 1 / (1 + exp(-conf_want[k]))));
    printf("  confidence max abs err %.2e\n", cerr);
    CHECK(cerr < 1e-5, "confidence err %.3g", cerr);
    CHECK(prop.n == G, "threshold 0 keeps all %d, got %d", G, prop.n);

    free(got);
    free(ids);
    free(ctx_want);
    free(hid_want);
    free(base_want);
    free(markov_want);
    free(draft_want);
    free(block_in);
    free(conf_want);
    golden_close(g);
    ds_drafter_free(d);
    ds_target_free(t);
}

static void check_spec_run(const char *drafter_dir, const char *golden) {
    ds_target *t;
    ds_drafter *d;
    CHECK_OK(ds_target_open(be, FIX "/target", NULL, &t));
    CHECK_OK(ds_drafter_open(be, drafter_dir, t, NULL, &d));
    ds_safetensors *g = golden_open(golden);
    size_t T, N, R;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    int32_t *want = golden_i32(g, "spec_output_ids", &N);
    int32_t *acc_want = golden_i32(g, "spec_accepted_draft_lengths", &R);
    ds_gen_params p = {.max_new = (int)N, .ignore_stop = true};
    ds_gen_result r;
    CHECK_OK(ds_generate(t, d, ids, (int)T, &p, NULL, NULL, &r));
    CHECK(r.n_tokens == (int)N, "%d tokens, want %zu", r.n_tokens, N);
    for (int i = 0; i < r.n_tokens && i < (int)N; i++)
        CHECK(r.tokens[i] == want[i], "token %d: %d vs %d", i, r.tokens[i], want[i]);
    CHECK(r.rounds == (int)R, "%d rounds, want %zu", r.rounds, R);
    for (int i = 0; i < r.rounds && i < (int)R; i++)
        CHECK(r.accepted[i] == acc_want[i], "round %d accepted %d, want %d", i, r.accepted[i], acc_want[i]);
    int sum = 0;
    for (int i = 0; i < r.rounds; i++) sum += r.accepted[i];
    printf("  %d rounds, %d drafts accepted\n", r.rounds, sum);
    ds_gen_result_free(&r);
    free(ids);
    free(want);
    free(acc_want);
    golden_close(g);
    ds_drafter_free(d);
    ds_target_free(t);
}

static void test_random_drafter_round0(void) { check_round0(FIX "/drafter", FIX "/golden.safetensors"); }
static void test_trained_drafter_round0(void) { check_round0(FIX "/drafter-trained", FIX "/golden-trained.safetensors"); }
static void test_random_drafter_spec_run(void) { check_spec_run(FIX "/drafter", FIX "/golden.safetensors"); }
static void test_trained_drafter_spec_run(void) { check_spec_run(FIX "/drafter-trained", FIX "/golden-trained.safetensors"); }

static void setup(void) { CHECK_OK(test_backend_new(&be)); }
static void teardown(void) { be->ops->destroy(be); }

RUN_TESTS("dspark", setup, test_random_drafter_round0, test_trained_drafter_round0, test_random_drafter_spec_run,
          test_trained_drafter_spec_run, teardown)
