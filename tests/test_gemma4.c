/* Gemma 4 text target against the reference's fp32 goldens:
 *  - gemma4-tiny: sliding/full layers, K = V full layers, proportional RoPE,
 *    soft-capped tied head (fixtures from DeepSpec's generator);
 *  - gemma4-e-tiny: the E-series extras (per-layer inputs, KV sharing,
 *    double-wide MLP), made by tools/fixtures/make_gemma4_e_fixture.py.
 * Logits and hidden states within 1e-4 relative error, greedy continuations
 * token-identical, and row invariance / crop correctness of the sliding
 * ring cache past the window. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "model/gemma4_layer.h"
#include "speculate/round.h"
#include "target_goldens.h"

#define TINY DS_TESTDATA "/fixtures/gemma4-tiny"
#define ETINY DS_TESTDATA "/fixtures/gemma4-e-tiny"
#define TOL 1e-4

static ds_backend *be;

/* Small max_rows make the sliding ring (window 8 + max_rows) wrap many
 * times within the fixtures' sequences; prefill is then chunked. */
static const ds_target_opts small_ring = {.max_rows = 6, .max_logit_rows = 6};

/* Feeds ids[0..n) at positions pos0.. in max_rows chunks; logits for the last row. */
static ds_error *feed(ds_target *t, const int32_t *ids, int n, int pos0) {
    for (int i = 0; i < n;) {
        int k = n - i < t->max_rows ? n - i : t->max_rows;
        DS_TRY(ds_target_forward(t, ids + i, k, pos0 + i, i + k == n ? 1 : 0));
        i += k;
    }
    return NULL;
}

static void check_prompt(const char *fix) {
    ds_target *t;
    ds_safetensors *g;
    CHECK_OK(open_target_fixture(be, fix, NULL, &t, &g));
    check_target_prompt(t, g, TOL, strrchr(fix, '/') + 1);
    golden_close(g);
    ds_target_free(t);
}

/* Prefill, then one token at a time: every step's logits match the
 * reference's no-cache forward, and the greedy tokens are the reference's. */
static void check_greedy(const char *fix, const ds_target_opts *opts) {
    ds_target *t;
    ds_safetensors *g;
    CHECK_OK(open_target_fixture(be, fix, opts, &t, &g));
    size_t T;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    CHECK_OK(feed(t, ids, (int)T, 0));
    check_target_greedy(t, g, (int)T, TOL, strrchr(fix, '/') + 1);
    free(ids);
    golden_close(g);
    ds_target_free(t);
}

/* Verification's pattern: score k rows, keep only some, rewind the cache
 * and go on. Every row's logits still match the no-cache reference. */
static void check_verify_and_crop(const char *fix, const ds_target_opts *opts) {
    ds_target *t;
    ds_safetensors *g;
    CHECK_OK(open_target_fixture(be, fix, opts, &t, &g));
    size_t T, n_full;
    int32_t *prompt = golden_i32(g, "prompt_ids", &T);
    int32_t *ids = golden_i32(g, "full_ids", &n_full);
    float *full = golden_f32(g, "target_logits_full", NULL);
    const int V = t->vocab, k = t->max_rows < 5 ? t->max_rows : 5;
    float *rows = malloc((size_t)k * V * sizeof *rows);
    CHECK_OK(feed(t, ids, (int)T, 0));
    double worst = 0;
    int rounds = 0;
    for (int start = (int)T; start + k <= (int)n_full; rounds++) {
        CHECK_OK(ds_target_forward(t, ids + start, k, start, k));
        be->ops->download(be, ds_rows(t->logits, 0, k), rows);
        double err = rel_err_max(rows, full + (size_t)start * V, (size_t)k * V);
        if (err > worst) worst = err;
        int keep = 1 + rounds % k; /* accept 0..k-1 drafts, then the bonus is re-fed */
        ds_target_crop(t, start + keep);
        start += keep;
    }
    printf("  %s verify+crop (%d-row calls, max_rows %d): %d rounds, max rel err %.2e\n", strrchr(fix, '/') + 1, k,
           t->max_rows, rounds, worst);
    CHECK(worst < TOL, "verify logits rel err %.3g", worst);
    free(rows);
    free(prompt);
    free(ids);
    free(full);
    golden_close(g);
    ds_target_free(t);
}

/* A row's logits and taps must not depend on how many rows share the
 * forward, at every distance from the sliding window's edge. */
static void check_row_invariance(const char *fix, const ds_target_opts *opts) {
    ds_target *t;
    ds_safetensors *g;
    CHECK_OK(open_target_fixture(be, fix, opts, &t, &g));
    size_t T, N;
    int32_t *prompt = golden_i32(g, "prompt_ids", &T);
    int32_t *full = golden_i32(g, "full_ids", &N);
    const int V = t->vocab, H = t->hidden, n = 5;
    const int taps[] = {-1, 0, t->n_layers - 2};
    CHECK_OK(ds_target_set_taps(t, taps, 3));
    float *a = malloc((size_t)n * V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
    float *ta = malloc((size_t)n * 3 * H * sizeof *ta), *tb = malloc((size_t)3 * H * sizeof *tb);
    CHECK_OK(feed(t, full, (int)T, 0));
    int checked = 0;
    for (int start = (int)T; start + n <= (int)N; start += 3) {
        CHECK_OK(ds_target_forward(t, full + start, n, start, n));
        be->ops->download(be, ds_rows(t->logits, 0, n), a);
        be->ops->download(be, ds_rows(t->taps, 0, n), ta);
        ds_target_crop(t, start);
        for (int i = 0; i < n; i++) {
            CHECK_OK(ds_target_forward(t, full + start + i, 1, start + i, 1));
            be->ops->download(be, ds_rows(t->logits, 0, 1), b);
            be->ops->download(be, ds_rows(t->taps, 0, 1), tb);
            CHECK(!memcmp(a + (size_t)i * V, b, (size_t)V * sizeof *b),
                  "position %d: logits differ between a %d-row and a 1-row forward", start + i, n);
            CHECK(!memcmp(ta + (size_t)i * 3 * H, tb, (size_t)3 * H * sizeof *tb),
                  "position %d: taps differ between a %d-row and a 1-row forward", start + i, n);
        }
        ds_target_crop(t, start + 3);
        checked += n;
    }
    printf("  %s row invariance: %d rows up to position %zu\n", strrchr(fix, '/') + 1, checked, N - 1);
    free(a);
    free(b);
    free(ta);
    free(tb);
    free(prompt);
    free(full);
    golden_close(g);
    ds_target_free(t);
}

static void check_inv_freq(const char *fix) {
    char path[512];
    ds_checkpoint *ck;
    snprintf(path, sizeof path, "%s/target", fix);
    CHECK_OK(ds_checkpoint_open(path, &ck));
    ds_gemma4_config c;
    ds_error *e = ds_gemma4_config_read(ck->config, path, true, &c);
    ds_checkpoint_close(ck);
    CHECK_OK(e);
    snprintf(path, sizeof path, "%s/golden.safetensors", fix);
    ds_safetensors *g = golden_open(path);
    const char *names[DS_G4_N_TYPES] = {"rope_target_sliding_attention_inv_freq",
                                        "rope_target_full_attention_inv_freq"};
    for (int ty = 0; ty < DS_G4_N_TYPES; ty++) {
        size_t n;
        float *want = golden_f32(g, names[ty], &n);
        CHECK(c.geom[ty].used && (size_t)c.geom[ty].head_dim / 2 == n, "%s: %zu frequencies, head_dim %d", names[ty], n,
              c.geom[ty].head_dim);
        if (want && c.geom[ty].used && (size_t)c.geom[ty].head_dim / 2 == n) {
            double err = rel_err_max(c.geom[ty].inv_freq, want, n);
            printf("  %s %s: max rel err %.2e\n", strrchr(fix, '/') + 1, names[ty], err);
            CHECK(err < 1e-6, "%s rel err %.3g", names[ty], err);
            for (size_t i = 0; i < n; i++)
                CHECK((want[i] == 0) == (c.geom[ty].inv_freq[i] == 0), "%s[%zu]: identity tail differs", names[ty], i);
        }
        free(want);
    }
    golden_close(g);
    ds_gemma4_config_free(&c);
}

/* The drafter reads the same config code: all layers full, its own K/V,
 * global_head_dim with the full-attention RoPE. */
static void check_drafter_config(void) {
    ds_checkpoint *ck;
    CHECK_OK(ds_checkpoint_open(TINY "/drafter", &ck));
    ds_gemma4_config c;
    ds_error *e = ds_gemma4_config_read(ck->config, TINY "/drafter", false, &c);
    ds_checkpoint_close(ck);
    CHECK_OK(e);
    ds_safetensors *g = golden_open(TINY "/golden.safetensors");
    size_t n;
    float *want = golden_f32(g, "rope_drafter_full_attention_inv_freq", &n);
    CHECK(!c.geom[DS_G4_SLIDING].used && c.geom[DS_G4_FULL].head_dim == 32 && c.geom[DS_G4_FULL].n_kv_heads == 1,
          "drafter geometry: full head_dim %d, %d KV heads", c.geom[DS_G4_FULL].head_dim,
          c.geom[DS_G4_FULL].n_kv_heads);
    if (want && n == 16) CHECK(rel_err_max(c.geom[DS_G4_FULL].inv_freq, want, n) < 1e-6, "drafter inv_freq differs");
    for (int l = 0; l < c.n_layers; l++) CHECK(c.kv_source[l] == l, "drafter layer %d shares K/V", l);
    free(want);
    golden_close(g);
    ds_gemma4_config_free(&c);
}

static void test_tiny_prompt(void) { check_prompt(TINY); }
static void test_tiny_greedy(void) {
    check_greedy(TINY, NULL);
    check_greedy(TINY, &small_ring);
}
static void test_tiny_verify_and_crop(void) {
    check_verify_and_crop(TINY, NULL);
    check_verify_and_crop(TINY, &small_ring);
}
static void test_tiny_row_invariance(void) {
    check_row_invariance(TINY, NULL);
    check_row_invariance(TINY, &small_ring);
}
static void test_e_prompt(void) { check_prompt(ETINY); }
static void test_e_greedy(void) {
    check_greedy(ETINY, NULL);
    check_greedy(ETINY, &small_ring);
}
static void test_e_verify_and_crop(void) { check_verify_and_crop(ETINY, &small_ring); }
static void test_e_row_invariance(void) { check_row_invariance(ETINY, &small_ring); }
static void test_inv_freq(void) {
    check_inv_freq(TINY);
    check_inv_freq(ETINY);
    check_drafter_config();
    /* sqrt(H) rounded to the weight dtype, as the reference scales embeddings. */
    CHECK(ds_gemma4_embed_scale(DS_BF16, 3840) == 62.0f, "bf16 sqrt(3840) = %g", ds_gemma4_embed_scale(DS_BF16, 3840));
    CHECK(ds_gemma4_embed_scale(DS_F16, 3840) == 61.96875f, "f16 sqrt(3840) = %g", ds_gemma4_embed_scale(DS_F16, 3840));
    CHECK(ds_gemma4_embed_scale(DS_F32, 3840) == sqrtf(3840.0f), "f32 sqrt(3840)");
}

/* Rewinding the sliding ring past what it still holds is an error, not
 * silently wrong attention. */
static void test_ring_rewind_refused(void) {
    ds_target *t;
    ds_safetensors *g;
    CHECK_OK(open_target_fixture(be, TINY, &small_ring, &t, &g));
    size_t N;
    int32_t *full = golden_i32(g, "full_ids", &N);
    CHECK_OK(feed(t, full, 40, 0));
    ds_target_crop(t, 20);
    CHECK_ERR(ds_target_forward(t, full + 20, 1, 20, 1), "sliding-window cache no longer holds position");
    free(full);
    golden_close(g);
    ds_target_free(t);
}

/* Greedy verification keeps the sliding ring's bookkeeping as forwards do:
 * after verify rounds (3 rows scored, 2 kept, past the window and the ring's
 * wrap) a plain forward goes on where they stopped, with the logits of a
 * target that only ever ran forwards; and a verification rewound further
 * than the ring holds is refused like a forward (not scored against keys
 * the ring has overwritten). */
static void test_verify_greedy_ring(void) {
    ds_target *t, *ref;
    ds_safetensors *g;
    CHECK_OK(open_target_fixture(be, TINY, &small_ring, &t, &g));
    CHECK_OK(ds_target_open(be, TINY "/target", &small_ring, &ref));
    size_t N;
    int32_t *full = golden_i32(g, "full_ids", &N);
    const int V = t->vocab;
    float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
    CHECK_OK(feed(t, full, 4, 0));
    int pos = 4;
    for (; pos + 3 <= 40 && pos + 3 <= (int)N; pos += 2) {
        int32_t best[4];
        ds_proposal prop = {.tokens = {full[pos + 1], full[pos + 2]}};
        int m = 0, acc = 0;
        CHECK_OK(ds_round_verify_greedy(t, full[pos], &prop, 2, 2, pos, best, &m, &acc));
        ds_target_crop(t, pos + 2);
    }
    CHECK_OK(feed(ref, full, pos, 0));
    CHECK_OK(ds_target_forward(t, full + pos, 1, pos, 1));
    CHECK_OK(ds_target_forward(ref, full + pos, 1, pos, 1));
    be->ops->download(be, ds_rows(t->logits, 0, 1), a);
    be->ops->download(be, ds_rows(ref->logits, 0, 1), b);
    CHECK(!memcmp(a, b, (size_t)V * sizeof *a), "position %d: logits after verify rounds differ from forwards'", pos);
    ds_target_crop(t, pos - 20);
    int32_t best[4];
    ds_proposal prop = {.tokens = {full[pos - 19], full[pos - 18]}};
    int m = 0, acc = 0;
    CHECK_ERR(ds_round_verify_greedy(t, full[pos - 20], &prop, 2, 2, pos - 20, best, &m, &acc),
              "sliding-window cache no longer holds position");
    printf("  verify rounds to position %d, then a forward: logits as forwards'; a rewind of 20 refused\n", pos);
    free(a);
    free(b);
    free(full);
    golden_close(g);
    ds_target_free(ref);
    ds_target_free(t);
}

/* ---- scratch model directories for the config / layout tests ---------- */

static cJSON *fixture_config(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = read_text_file(path, NULL);
    cJSON *c = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(c != NULL, "cannot read %s", path);
    return c;
}

/* A temporary model directory holding config and, when weights is set, a
 * link to that safetensors file. Returns the malloc'd path or NULL. */
static char *make_dir(const cJSON *config, const char *weights) {
    char *dir = strdup("/tmp/ds_gemma4_test_XXXXXX"), path[512];
    if (!dir || !mkdtemp(dir)) {
        free(dir);
        CHECK(0, "mkdtemp failed");
        return NULL;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_json_file(path, config);
    if (weights) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK(symlink(weights, path) == 0, "symlink %s", path);
    }
    return dir;
}

/* Opens a copy of gemma4-tiny whose config field `field` is replaced by
 * `value` (a JSON text; NULL deletes it) and expects an error with needle. */
static void expect_config_error(const char *field, const char *value, const char *needle) {
    cJSON *c = fixture_config(TINY "/target");
    if (!c) return;
    cJSON_DeleteItemFromObjectCaseSensitive(c, field);
    if (value) cJSON_AddItemToObject(c, field, cJSON_Parse(value));
    char *dir = make_dir(c, TINY "/target/model.safetensors");
    ds_target *t = NULL;
    if (dir) CHECK_ERR(ds_target_open(be, dir, NULL, &t), needle);
    CHECK(t == NULL, "%s: a target came back with the error", field);
    remove_model_dir(dir);
    cJSON_Delete(c);
}

static void test_bad_configs(void) {
    expect_config_error("enable_moe_block", "true", "enable_moe_block = true: Gemma 4 MoE models are not supported");
    expect_config_error("num_experts", "8", "num_experts = 8: Gemma 4 MoE models are not supported");
    expect_config_error("num_kv_shared_layers", "3", "no earlier full_attention layer to share K/V with");
    expect_config_error("layer_types",
                        "[\"sliding_attention\", \"chunked_attention\", \"sliding_attention\", \"full_attention\"]",
                        "layer_types[1] = \"chunked_attention\"");
    expect_config_error("rope_parameters", "{\"full_attention\": {\"rope_type\": \"yarn\", \"rope_theta\": 1e6}}",
                        "rope_parameters.full_attention): rope_type \"yarn\" is not supported");
    expect_config_error("per_layer_config", "{\"1\": {\"sliding_window\": 4}}",
                        "override of sliding_window is not supported");
    expect_config_error("hidden_activation", "\"silu\"", "hidden_activation = \"silu\" is not supported");
    expect_config_error("model_type", "\"gemma4\"", "no text_config object");
}

/* Writes src's tensors to path with every name's prefix `from` replaced by `to`. */
static bool write_renamed(const char *src, const char *path, const char *from, const char *to) {
    ds_safetensors *st;
    ds_error *e = ds_safetensors_open(src, &st);
    if (e) {
        ds_error_free(e);
        return false;
    }
    cJSON *hdr = cJSON_CreateObject();
    size_t off = 0;
    for (size_t i = 0; i < st->n_tensors; i++) {
        const ds_st_tensor *t = &st->tensors[i];
        char name[512];
        size_t lf = strlen(from);
        snprintf(name, sizeof name, "%s%s", strncmp(t->name, from, lf) ? "" : to,
                 t->name + (strncmp(t->name, from, lf) ? 0 : lf));
        cJSON *d = cJSON_AddObjectToObject(hdr, name);
        cJSON_AddStringToObject(d, "dtype", ds_dtype_name(t->dtype));
        cJSON *shape = cJSON_AddArrayToObject(d, "shape");
        for (int k = 0; k < t->ndim; k++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[k]));
        cJSON *offs = cJSON_AddArrayToObject(d, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *text = cJSON_PrintUnformatted(hdr);
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    bool ok = f != NULL;
    if (f) {
        uint64_t n = padded;
        unsigned char le[8];
        for (int k = 0; k < 8; k++) le[k] = (unsigned char)(n >> (8 * k));
        ok = fwrite(le, 1, 8, f) == 8 && fwrite(text, 1, len, f) == len;
        for (size_t k = len; ok && k < padded; k++) ok = fputc(' ', f) != EOF;
        for (size_t i = 0; ok && i < st->n_tensors; i++)
            ok = fwrite(st->tensors[i].data, 1, st->tensors[i].nbytes, f) == st->tensors[i].nbytes;
        ok = fclose(f) == 0 && ok;
    }
    free(text);
    cJSON_Delete(hdr);
    ds_safetensors_close(st);
    return ok;
}

/* A top-level gemma4 (multimodal) checkpoint: text config nested in
 * text_config, tensors under model.language_model. Same logits, bit for bit. */
static void test_multimodal_layout(void) {
    cJSON *text = fixture_config(ETINY "/target");
    if (!text) return;
    cJSON *root = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("Gemma4ForConditionalGeneration"));
    cJSON_AddStringToObject(root, "model_type", "gemma4");
    cJSON_AddItemToObject(root, "text_config", text);
    char *dir = make_dir(root, NULL), path[512];
    cJSON_Delete(root);
    if (!dir) return;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(write_renamed(ETINY "/target/model.safetensors", path, "model.", "model.language_model."), "writing %s",
          path);
    ds_target *a = NULL, *b = NULL;
    ds_safetensors *g = golden_open(ETINY "/golden.safetensors");
    size_t T;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    ds_error *e = ds_target_open(be, dir, NULL, &a);
    if (!e) e = ds_target_open(be, ETINY "/target", NULL, &b);
    if (!e) e = ds_target_forward(a, ids, (int)T, 0, (int)T);
    if (!e) e = ds_target_forward(b, ids, (int)T, 0, (int)T);
    if (e) {
        CHECK(0, "%s", ds_error_message(e));
        ds_error_free(e);
    } else {
        size_t n = T * (size_t)a->vocab;
        float *la = malloc(n * sizeof *la), *lb = malloc(n * sizeof *lb);
        be->ops->download(be, ds_rows(a->logits, 0, (int64_t)T), la);
        be->ops->download(be, ds_rows(b->logits, 0, (int64_t)T), lb);
        CHECK(!memcmp(la, lb, n * sizeof *la), "multimodal-layout logits differ from the text-only checkpoint's");
        free(la);
        free(lb);
    }
    ds_target_free(a);
    ds_target_free(b);
    free(ids);
    golden_close(g);
    remove_model_dir(dir);
}

static void setup(void) { CHECK_OK(test_backend_new(&be)); }
static void teardown(void) { be->ops->destroy(be); }

RUN_TESTS("gemma4", setup, test_inv_freq, test_tiny_prompt, test_tiny_greedy, test_tiny_verify_and_crop,
          test_tiny_row_invariance, test_e_prompt, test_e_greedy, test_e_verify_and_crop, test_e_row_invariance,
          test_ring_rewind_refused, test_verify_greedy_ring, test_bad_configs, test_multimodal_layout, teardown)
