/* DSpark drafter + speculative loop against the reference's fp32 goldens
 * (testdata/fixtures/qwen3-tiny): context projection, block hidden states,
 * base and Markov-corrected logits within 1e-4 relative error, confidences
 * within 1e-5, draft tokens exact, every round replayed, and the
 * speculative greedy run's tokens and per-round accepted lengths identical —
 * for the random drafter and the trained one (where acceptance is partial).
 * The checks themselves are shared with the Gemma 4 drafter's test. */
#include <stddef.h>

#include "drafter_goldens.h"
#include "testlib.h"

#define FIX DS_TESTDATA "/fixtures/qwen3-tiny"

static ds_backend *be;

#define RANDOM FIX "/drafter", FIX "/golden.safetensors"
#define TRAINED FIX "/drafter-trained", FIX "/golden-trained.safetensors"

static void test_random_drafter_round0(void) { check_drafter_round0(be, FIX "/target", RANDOM); }
static void test_trained_drafter_round0(void) { check_drafter_round0(be, FIX "/target", TRAINED); }
static void test_random_drafter_rounds(void) { check_drafter_rounds(be, FIX "/target", RANDOM, NULL); }
static void test_trained_drafter_rounds(void) { check_drafter_rounds(be, FIX "/target", TRAINED, NULL); }
static void test_random_drafter_spec_run(void) { check_drafter_spec_run(be, FIX "/target", RANDOM); }
static void test_trained_drafter_spec_run(void) { check_drafter_spec_run(be, FIX "/target", TRAINED); }

static void setup(void) { CHECK_OK(test_backend_new(&be)); }
static void teardown(void) { be->ops->destroy(be); }

RUN_TESTS("dspark", setup, test_random_drafter_round0, test_trained_drafter_round0, test_random_drafter_rounds,
          test_trained_drafter_rounds, test_random_drafter_spec_run, test_trained_drafter_spec_run, teardown)
