/* DeepSpec's gated and RNN Markov heads against the reference's fp32 goldens
 * (testdata/fixtures/qwen3-tiny-heads, made by
 * tools/fixtures/make_markov_heads_fixture.py with DeepSpec's own code), on
 * the qwen3-tiny target: round 0's base and walked (Markov-corrected) logits
 * within 1e-4 relative error (fp32 agrees to ~1e-5; the fixtures' smallest
 * draft margin is 0.0045), drafts exact, confidences within 1e-5; every
 * round of the reference's speculative run replayed with its drafts and
 * confidences; and the speculative greedy run's tokens and per-round
 * accepted lengths identical to the reference's, its tokens identical to
 * plain greedy decoding (lossless). The heads change 11 (gated) and 110
 * (RNN) of the run's drafts from the base logits' argmax, so a wrong walk
 * shows as wrong tokens, not only as logits off. On DS_BACKEND=cuda (ctest:
 * test_markov_heads_cuda) the same checks run the walks on the device, and a
 * greedy round's drafts come back in one copy (test_*_round_trips). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "drafter_goldens.h"
#include "testlib.h"

#define TARGET DS_TESTDATA "/fixtures/qwen3-tiny/target"
#define FIX DS_TESTDATA "/fixtures/qwen3-tiny-heads"
#define GATED FIX "/drafter-gated", FIX "/golden-gated.safetensors"
#define RNN FIX "/drafter-rnn", FIX "/golden-rnn.safetensors"

static ds_backend *be;

/* The fixtures are what they say: the drafter's config names the head. */
static void check_head(const char *drafter_dir, ds_markov_type want) {
    ds_target *t;
    ds_drafter *d;
    CHECK_OK(open_target_and_drafter(be, TARGET, NULL, drafter_dir, NULL, &t, &d));
    CHECK(d->markov == want && d->markov_rank == 16 && d->gamma == 4, "%s: head %d rank %d gamma %d", drafter_dir,
          (int)d->markov, d->markov_rank, d->gamma);
    ds_drafter_free(d);
    ds_target_free(t);
}

/* On a backend that walks the gated / RNN heads itself (CUDA), a greedy
 * round brings its drafts back in one copy and its confidences in one more
 * (ds_region_stats.d2h), where the host walk makes three round trips per
 * position; the drafts are the reference's. The round runs twice: recorded,
 * then replayed where the backend records step regions. */
static void check_round_trips(const char *drafter_dir, const char *golden) {
    if (!ds_spec(be)->markov_greedy_latent) {
        printf("  %s backend: the host walks gated / RNN heads\n", be->ops->name);
        return;
    }
    ds_target *t;
    ds_drafter *d;
    CHECK_OK(open_target_and_drafter(be, TARGET, NULL, drafter_dir, NULL, &t, &d));
    ds_safetensors *g = golden_open(golden);
    size_t T, G;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    int32_t *block_in = golden_i32(g, "round0_block_input_ids", NULL);
    int32_t *want = golden_i32(g, "round0_draft_tokens", &G);
    if (d && ids && block_in && want && G == (size_t)d->gamma) {
        CHECK_OK(ds_target_set_taps(t, d->tap_layers, d->n_taps));
        CHECK_OK(ds_target_forward(t, ids, (int)T, 0, 1));
        CHECK_OK(ds_drafter_append(d, t->taps, 0, (int)T));
        ds_sampling greedy = {0};
        for (int round = 0; round < 2; round++) {
            ds_region_stats before = ds_backend_region_stats(be);
            ds_proposal prop;
            CHECK_OK(ds_drafter_propose(d, block_in[0], (int)T, &greedy, 0, NULL, &prop));
            const int64_t d2h = ds_backend_region_stats(be).d2h - before.d2h;
            printf("  round %d: %lld device->host copies for %zu drafts\n", round, (long long)d2h, G);
            CHECK(d2h <= 2, "%lld device->host copies in a greedy round: a round trip per position?", (long long)d2h);
            for (size_t k = 0; k < G; k++)
                CHECK(prop.tokens[k] == want[k], "round %d draft %zu: %d vs %d", round, k, prop.tokens[k], want[k]);
        }
    }
    free(ids);
    free(block_in);
    free(want);
    golden_close(g);
    ds_drafter_free(d);
    ds_target_free(t);
}

static void test_gated_round_trips(void) { check_round_trips(GATED); }
static void test_rnn_round_trips(void) { check_round_trips(RNN); }
static void test_gated_head(void) { check_head(FIX "/drafter-gated", DS_MARKOV_GATED); }
static void test_rnn_head(void) { check_head(FIX "/drafter-rnn", DS_MARKOV_RNN); }
static void test_gated_round0(void) { check_drafter_round0(be, TARGET, GATED); }
static void test_rnn_round0(void) { check_drafter_round0(be, TARGET, RNN); }
static void test_gated_rounds(void) { check_drafter_rounds(be, TARGET, GATED, NULL); }
static void test_rnn_rounds(void) { check_drafter_rounds(be, TARGET, RNN, NULL); }
static void test_gated_spec_run(void) { check_drafter_spec_run(be, TARGET, GATED); }
static void test_rnn_spec_run(void) { check_drafter_spec_run(be, TARGET, RNN); }

static void setup(void) { CHECK_OK(test_backend_new(&be)); }
static void teardown(void) { be->ops->destroy(be); }

RUN_TESTS("markov_heads", setup, test_gated_head, test_rnn_head, test_gated_round0, test_rnn_round0,
          test_gated_rounds, test_rnn_rounds, test_gated_spec_run, test_rnn_spec_run, test_gated_round_trips,
          test_rnn_round_trips, teardown)
