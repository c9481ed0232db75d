/* Gemma4DSparkModel drafter + speculative loop against the reference's fp32
 * goldens (testdata/fixtures/gemma4-tiny), for the random drafter and the
 * trained one (where acceptance is partial):
 *  - round 0: context projection, block hidden states, soft-capped base
 *    logits and Markov-corrected logits within 1e-4 relative error, draft
 *    tokens exact, confidences within 1e-5;
 *  - every later round replayed from the golden verify inputs: confidence
 *    logits (all rounds) and base / Markov logits (rounds 0..5), which
 *    checks the incremental context rows;
 *  - the speculative greedy run: tokens and per-round accepted lengths
 *    identical, and the same tokens as plain greedy decoding;
 *  - refusals: a drafter for the other family, and drafter configs the
 *    reference's Gemma4 drafter cannot have. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "draft/drafter.h"
#include "speculate/generate.h"
#include "drafter_goldens.h"
#include "testlib.h"

#define FIX DS_TESTDATA "/fixtures/gemma4-tiny"
#define QWEN DS_TESTDATA "/fixtures/qwen3-tiny"
#define TOL 1e-4

static ds_backend *be;

/* Drafted greedy == AR greedy past the golden's 48 tokens, with confidence
 * truncation (short and empty proposals), a shorter gamma, and a small
 * row budget that chunks prefill and wraps the target's sliding ring. */
static void check_lossless(const char *drafter_dir, const ds_target_opts *topts, float threshold, int gamma) {
    ds_target *t;
    ds_drafter *d;
    ds_drafter_opts dopts = {.max_rows = topts ? topts->max_rows : 0};
    CHECK_OK(open_target_and_drafter(be, FIX "/target", topts, drafter_dir, &dopts, &t, &d));
    ds_safetensors *g = golden_open(FIX "/golden.safetensors");
    size_t T;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    ds_gen_params p = {.max_new = 96, .ignore_stop = true, .threshold = threshold, .gamma = gamma};
    ds_gen_result ar = {0}, sp = {0};
    ds_error *e1 = ids ? ds_generate(t, NULL, ids, (int)T, &p, NULL, NULL, &ar) : NULL;
    ds_error *e2 = ids ? ds_generate(t, d, ids, (int)T, &p, NULL, NULL, &sp) : NULL;
    CHECK(!e1 && !e2, "generate: %s / %s", e1 ? ds_error_message(e1) : "ok", e2 ? ds_error_message(e2) : "ok");
    if (ids && !e1 && !e2) {
        CHECK(sp.n_tokens == ar.n_tokens && ar.n_tokens == p.max_new, "%d drafted vs %d AR tokens", sp.n_tokens,
              ar.n_tokens);
        int first_diff = -1;
        for (int i = 0; i < sp.n_tokens && i < ar.n_tokens && first_diff < 0; i++)
            if (sp.tokens[i] != ar.tokens[i]) first_diff = i;
        CHECK(first_diff < 0, "drafted differs from AR at token %d", first_diff);
        int acc = 0, empty = 0;
        for (int i = 0; i < sp.rounds; i++) {
            acc += sp.accepted[i];
            empty += sp.proposed[i] == 0;
            CHECK(sp.proposed[i] <= (gamma ? gamma : d->gamma), "round %d proposed %d", i, sp.proposed[i]);
        }
        printf("  threshold %.2f gamma %d max_rows %d: %d rounds, %d accepted, %d empty proposals\n", threshold,
               gamma ? gamma : d->gamma, t->max_rows, sp.rounds, acc, empty);
    }
    ds_error_free(e1);
    ds_error_free(e2);
    ds_gen_result_free(&ar);
    ds_gen_result_free(&sp);
    free(ids);
    golden_close(g);
    ds_drafter_free(d);
    ds_target_free(t);
}

/* The wrong family for the target, each way, with a message naming both. */
static void test_family_mismatch(void) {
    ds_target *t;
    ds_drafter *d = NULL;
    CHECK_OK(ds_target_open(be, QWEN "/target", NULL, &t));
    CHECK_ERR(ds_drafter_open(be, FIX "/drafter", t, NULL, &d),
              "a Gemma4DSparkModel drafter cannot serve a qwen3 target");
    CHECK(d == NULL, "a drafter came back with the error");
    ds_target_free(t);
    CHECK_OK(ds_target_open(be, FIX "/target", NULL, &t));
    CHECK_ERR(ds_drafter_open(be, QWEN "/drafter", t, NULL, &d),
              "a Qwen3DSparkModel drafter cannot serve a gemma4_text target");
    CHECK(d == NULL, "a drafter came back with the error");
    ds_target_free(t);
}

/* A temporary drafter directory: the fixture's config with the fields of
 * the JSON object `patch` replaced or added, and a link to its weights. */
static char *drafter_copy(const char *patch) {
    char path[512];
    char *text = read_text_file(FIX "/drafter/config.json", NULL);
    cJSON *c = text ? cJSON_Parse(text) : NULL, *pt = cJSON_Parse(patch);
    free(text);
    CHECK(c != NULL && cJSON_IsObject(pt), "cannot read the drafter config or the patch %s", patch);
    char *dir = c && cJSON_IsObject(pt) ? strdup("/tmp/ds_dspark_gemma4_XXXXXX") : NULL;
    if (dir && !mkdtemp(dir)) {
        free(dir);
        dir = NULL;
        CHECK(0, "mkdtemp failed");
    }
    if (dir) {
        for (const cJSON *it = pt->child; it; it = it->next) {
            cJSON_DeleteItemFromObjectCaseSensitive(c, it->string);
            cJSON_AddItemToObject(c, it->string, cJSON_Duplicate(it, true));
        }
        snprintf(path, sizeof path, "%s/config.json", dir);
        char *out = cJSON_Print(c);
        FILE *f = fopen(path, "w");
        CHECK(f && out && fputs(out, f) >= 0, "write %s", path);
        if (f) fclose(f);
        free(out);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK(symlink(FIX "/drafter/model.safetensors", path) == 0, "symlink %s", path);
    }
    cJSON_Delete(c);
    cJSON_Delete(pt);
    return dir;
}

/* Opens the drafter with its config patched; needle NULL = must open. */
static void expect_drafter(ds_target *t, const char *patch, const char *needle) {
    char *dir = drafter_copy(patch);
    if (!dir) return;
    ds_drafter *d = NULL;
    ds_error *e = ds_drafter_open(be, dir, t, NULL, &d);
    if (needle) {
        CHECK_ERR(e, needle);
        CHECK(d == NULL, "%s: a drafter came back with the error", patch);
    } else {
        CHECK(e == NULL, "%s: %s", patch, e ? ds_error_message(e) : "");
        ds_error_free(e);
    }
    ds_drafter_free(d);
    remove_model_dir(dir);
}

static void test_drafter_configs(void) {
    ds_target *t;
    CHECK_OK(ds_target_open(be, FIX "/target", NULL, &t));
    /* An inherited num_kv_shared_layers deeper than the drafter is the target's business. */
    expect_drafter(t, "{\"num_kv_shared_layers\": 20}", NULL);
    expect_drafter(t, "{\"hidden_size_per_layer_input\": 256}",
                   "hidden_size_per_layer_input = 256 (default 256 when absent): a Gemma4DSparkModel drafter has no "
                   "per-layer inputs");
    /* (The config reader makes the last layer full whatever it says, as the reference's config does.) */
    expect_drafter(t, "{\"layer_types\": [\"sliding_attention\", \"full_attention\"]}",
                   "layer_types[0] is sliding_attention");
    /* The reference doubles the MLP of the drafter layers in the last
     * num_kv_shared_layers of its own depth when use_double_wide_mlp is set:
     * the fixture's weights are then the wrong shape for layer 1 only. */
    expect_drafter(t, "{\"use_double_wide_mlp\": true, \"num_kv_shared_layers\": 1}",
                   "tensor layers.1.mlp.gate_proj.weight has shape [128, 64], expected [256, 64]");
    expect_drafter(t, "{\"use_double_wide_mlp\": true, \"num_kv_shared_layers\": 2}", NULL);
    ds_target_free(t);
}

/* What makes it a Gemma 4 drafter: its architecture and the soft-cap it
 * applies to the base logits before the Markov bias. */
static void test_drafter_identity(void) {
    ds_target *t;
    ds_drafter *d;
    CHECK_OK(open_target_and_drafter(be, FIX "/target", NULL, FIX "/drafter", NULL, &t, &d));
    CHECK(!strcmp(d->arch, "Gemma4DSparkModel"), "arch %s", d->arch);
    CHECK(d->logit_softcap == 15.0f, "drafter soft-cap %g, want 15", d->logit_softcap);
    ds_drafter_free(d);
    ds_target_free(t);
}

static void test_random_drafter_round0(void) {
    check_drafter_round0(be, FIX "/target", FIX "/drafter", FIX "/golden.safetensors");
}
static void test_trained_drafter_round0(void) {
    check_drafter_round0(be, FIX "/target", FIX "/drafter-trained", FIX "/golden-trained.safetensors");
}
static void test_random_drafter_rounds(void) { check_drafter_rounds(be, FIX "/target", FIX "/drafter", FIX "/golden.safetensors", NULL); }
static void test_trained_drafter_rounds(void) {
    check_drafter_rounds(be, FIX "/target", FIX "/drafter-trained", FIX "/golden-trained.safetensors", NULL);
    /* Context rows appended 5 at a time give the same K/V. */
    const ds_drafter_opts small = {.max_rows = 5};
    check_drafter_rounds(be, FIX "/target", FIX "/drafter-trained", FIX "/golden-trained.safetensors", &small);
}
static void test_random_drafter_spec_run(void) {
    check_drafter_spec_run(be, FIX "/target", FIX "/drafter", FIX "/golden.safetensors");
}
static void test_trained_drafter_spec_run(void) {
    check_drafter_spec_run(be, FIX "/target", FIX "/drafter-trained", FIX "/golden-trained.safetensors");
}
static void test_lossless_greedy(void) {
    static const ds_target_opts small_ring = {.max_rows = 6, .max_logit_rows = 6};
    check_lossless(FIX "/drafter-trained", NULL, 0, 0);
    check_lossless(FIX "/drafter-trained", NULL, 0.5f, 0);
    check_lossless(FIX "/drafter-trained", &small_ring, 0, 3);
    check_lossless(FIX "/drafter", &small_ring, 0.3f, 0);
}

static void setup(void) { CHECK_OK(ds_backend_cpu_new(2, &be)); }
static void teardown(void) { be->ops->destroy(be); }

RUN_TESTS("dspark_gemma4", setup, test_drafter_identity, test_random_drafter_round0, test_trained_drafter_round0, test_random_drafter_rounds,
          test_trained_drafter_rounds, test_random_drafter_spec_run, test_trained_drafter_spec_run,
          test_lossless_greedy, test_family_mismatch, test_drafter_configs, teardown)
