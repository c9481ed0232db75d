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
 * shows as wrong tokens, not only as logits off. On DS_BACKEND=cuda the
 * same checks run the walks on the device. */
#include <stddef.h>

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
          test_gated_rounds, test_rnn_rounds, test_gated_spec_run, test_rnn_spec_run, teardown)
