/* Gemma 4 "unified" checkpoints (google/gemma-4-12B's format,
 * Gemma4UnifiedForConditionalGeneration / model_type gemma4_unified) as
 * targets: `dspark synth --like gemma4-tiny --layout unified` writes the
 * 12B's format at a test width, with the same text weights as
 * `--layout text` for the same seed. The unified checkpoint must
 *  - load its text model from text_config and model.language_model.*,
 *    ignoring the vision/audio projections;
 *  - give exactly the text layout's greedy tokens (plain, and drafted with a
 *    Gemma4DSparkModel whose config is DeepSpec's copy of a unified text
 *    config);
 *  - embed the multimodal placeholder ids as the pad token, as the
 *    reference's wrapper does;
 *  - refuse malformed configs with an error naming the field;
 * the text-only gemma4_unified_text layout (Gemma4UnifiedForCausalLM) loads
 * from "model." and computes the text layout's logits;
 * and google/gemma-4-12B's released config.json reads as the 12B. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "draft/drafter.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "model/gemma4_layer.h"
#include "model/gemma4_layout.h"
#include "speculate/generate.h"
#include "testlib.h"

#define IMAGE_ID 500 /* gemma4-tiny's image_token_id in the unified layout */

static ds_backend *be;
static char T[64], UNI[128], TXT[128];

static int cli(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s >/dev/null 2>&1", DS_CLI, args);
    return system(cmd);
}


static const char *str_at(const cJSON *o, const char *k) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

static void setup(void) {
    CHECK_OK(test_backend_new(&be));
    snprintf(T, sizeof T, "/tmp/ds_test_g4u_%ld", (long)getpid());
    mkdir(T, 0700);
    snprintf(UNI, sizeof UNI, "%s/uni", T);
    snprintf(TXT, sizeof TXT, "%s/txt", T);
    char args[1024];
    snprintf(args, sizeof args, "synth --like gemma4-tiny --layout unified --seed 7 --threads 2 --drafter --out %s",
             UNI);
    CHECK(cli(args) == 0, "%s", args);
    snprintf(args, sizeof args, "synth --like gemma4-tiny --layout text --seed 7 --threads 2 --out %s", TXT);
    CHECK(cli(args) == 0, "%s", args);
}

/* The unified checkpoint's config.json, parsed (NULL: a check has failed). */
static cJSON *unified_config(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", UNI);
    return (cJSON *)read_json_file(path);
}

/* The files look like google/gemma-4-12B's: nested gemma4_unified_text
 * config, text tensors under model.language_model. (the same bytes as the
 * text layout's), the encoder-free projections, no stored LM head. */
static void test_format(void) {
    char path[512];
    cJSON *c = unified_config();
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(c, "text_config");
    CHECK(str_at(c, "model_type") && !strcmp(str_at(c, "model_type"), "gemma4_unified") &&
              !strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(c, "architectures"), 0)),
                      "Gemma4UnifiedForConditionalGeneration") &&
              str_at(tc, "model_type") && !strcmp(str_at(tc, "model_type"), "gemma4_unified_text") &&
              !cJSON_GetObjectItemCaseSensitive(tc, "architectures") &&
              cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "image_token_id")) == IMAGE_ID &&
              cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(c, "vision_config")) &&
              cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(c, "audio_config")),
          "unified config.json");
    cJSON_Delete(c);
    snprintf(path, sizeof path, "%s-dspark/config.json", UNI);
    cJSON *d = (cJSON *)read_json_file(path);
    CHECK(str_at(d, "model_type") && !strcmp(str_at(d, "model_type"), "gemma4_unified_text") &&
              !strcmp(str_at(d, "target_model_type"), "gemma4_unified") &&
              !strcmp(str_at(d, "target_text_model_type"), "gemma4_unified_text"),
          "drafter config: DeepSpec's copy of a unified text config");
    cJSON_Delete(d);

    ds_checkpoint *u, *t;
    CHECK_OK(ds_checkpoint_open(UNI, &u));
    ds_error *e = ds_checkpoint_open(TXT, &t);
    if (e) ds_checkpoint_close(u);
    CHECK_OK(e);
    const ds_st_tensor *pe = ds_checkpoint_find(u, "model.vision_embedder.pos_embedding");
    CHECK(pe && pe->ndim == 3 && pe->shape[0] == 16 && pe->shape[1] == 2 && pe->shape[2] == 64,
          "pos_embedding [posemb, 2, hidden]");
    CHECK(ds_checkpoint_find(u, "model.embed_audio.embedding_projection.weight") &&
              ds_checkpoint_find(u, "model.embed_vision.embedding_projection.weight") &&
              !ds_checkpoint_find(u, "lm_head.weight") && !ds_checkpoint_find(u, "model.layers.0.layer_scalar"),
          "unified tensor names");
    const char *names[] = {"embed_tokens.weight", "layers.5.self_attn.k_proj.weight", "layers.46.mlp.up_proj.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char a[128], b[128];
        snprintf(a, sizeof a, "model.language_model.%s", names[i]);
        snprintf(b, sizeof b, "model.%s", names[i]);
        const ds_st_tensor *x = ds_checkpoint_find(u, a), *y = ds_checkpoint_find(t, b);
        CHECK(x && y && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes),
              "%s: not the text layout's bytes", a);
    }
    ds_checkpoint_close(u);
    ds_checkpoint_close(t);
}

static void open_target(const char *dir, ds_target **t) {
    ds_target_opts o = {.max_rows = 64, .max_logit_rows = DS_MAX_GAMMA + 1};
    ds_error *e = ds_target_open(be, dir, &o, t);
    CHECK(!e, "%s: %s", dir, e ? ds_error_message(e) : "");
    ds_error_free(e);
    if (e) *t = NULL;
}

/* Greedy tokens after prompt; *out is malloc'd (n of them). */
static bool greedy(ds_target *t, ds_drafter *d, const int32_t *prompt, int n_prompt, int n, int32_t **out) {
    ds_gen_params p = {.max_new = n, .sampling = {.top_p = 1.0f}, .ignore_stop = true};
    ds_gen_result r = {0};
    ds_error *e = ds_generate(t, d, prompt, n_prompt, &p, NULL, NULL, &r);
    CHECK(!e, "%s", e ? ds_error_message(e) : "");
    ds_error_free(e);
    *out = NULL;
    if (e || r.n_tokens != n) {
        CHECK(e, "%d tokens, expected %d", r.n_tokens, n);
        ds_gen_result_free(&r);
        return false;
    }
    *out = malloc((size_t)n * sizeof **out);
    memcpy(*out, r.tokens, (size_t)n * sizeof **out);
    ds_gen_result_free(&r);
    return true;
}

/* Same weights, two layouts: the same config read and the same greedy
 * tokens, token for token, plain and drafted, past the sliding window. */
static void test_greedy_equals_text_layout(void) {
    ds_target *u = NULL, *t = NULL;
    open_target(UNI, &u);
    open_target(TXT, &t);
    if (u && t) {
        CHECK(u->n_layers == 48 && u->hidden == 64 && u->vocab == 512 && u->max_ctx == t->max_ctx &&
                  !strcmp(u->model_type, "gemma4_text") && u->n_placeholders == 3 && u->pad_id == 0 &&
                  t->n_placeholders == 0,
              "unified target: shape, placeholders");
        int32_t prompt[12];
        for (int i = 0; i < 12; i++) prompt[i] = (int32_t)(i * 37 % 512);
        const int n = 40;
        int32_t *a = NULL, *b = NULL;
        if (greedy(u, NULL, prompt, 12, n, &a) && greedy(t, NULL, prompt, 12, n, &b)) {
            CHECK(!memcmp(a, b, (size_t)n * sizeof *a), "unified greedy tokens differ from the text layout's");
            int distinct = 0;
            for (int i = 0; i < n; i++) {
                bool seen = false;
                for (int j = 0; j < i; j++) seen |= a[j] == a[i];
                distinct += !seen;
            }
            CHECK(distinct >= 4, "degenerate greedy output (%d distinct tokens)", distinct);
            char dd[256];
            snprintf(dd, sizeof dd, "%s-dspark", UNI);
            ds_drafter *dr = NULL;
            ds_error *e = ds_drafter_open(be, dd, u, NULL, &dr);
            CHECK(!e, "%s", e ? ds_error_message(e) : "");
            ds_error_free(e);
            int32_t *c;
            if (dr && greedy(u, dr, prompt, 12, n, &c)) {
                CHECK(!memcmp(a, c, (size_t)n * sizeof *a), "drafted greedy tokens differ from plain greedy");
                free(c);
            }
            ds_drafter_free(dr);
        }
        free(a);
        free(b);
    }
    ds_target_free(u);
    ds_target_free(t);
}

/* A prompt holding the image placeholder: the unified model embeds it as
 * pad (id 0), so its logits are the text layout's for the prompt with 0
 * there, bit for bit; the text layout embeds the id itself. */
static void test_placeholder_embeds_as_pad(void) {
    ds_target *u = NULL, *t = NULL;
    open_target(UNI, &u);
    open_target(TXT, &t);
    if (u && t) {
        int32_t with[8] = {2, 17, IMAGE_ID, IMAGE_ID, 33, 504, 90, 7}, as_pad[8];
        memcpy(as_pad, with, sizeof with);
        as_pad[2] = as_pad[3] = as_pad[5] = 0; /* 504: video_token_id */
        const size_t V = (size_t)u->vocab;
        float *lu = malloc(8 * V * sizeof *lu), *lt = malloc(8 * V * sizeof *lt), *lr = malloc(8 * V * sizeof *lr);
        ds_error *e = ds_target_forward(u, with, 8, 0, 8);
        if (!e) be->ops->download(be, ds_rows(u->logits, 0, 8), lu);
        if (!e) e = ds_target_forward(t, as_pad, 8, 0, 8);
        if (!e) be->ops->download(be, ds_rows(t->logits, 0, 8), lt);
        if (!e) e = ds_target_forward(t, with, 8, 0, 8);
        if (!e) be->ops->download(be, ds_rows(t->logits, 0, 8), lr);
        CHECK(!e, "%s", e ? ds_error_message(e) : "");
        ds_error_free(e);
        if (!e) {
            CHECK(!memcmp(lu, lt, 8 * V * sizeof *lu), "placeholders not embedded as the pad token");
            CHECK(memcmp(lu + 2 * V, lr + 2 * V, V * sizeof *lu), "the placeholder row did not change anything");
        }
        free(lu);
        free(lt);
        free(lr);
    }
    ds_target_free(u);
    ds_target_free(t);
}

/* Without sliding_window or model_type in the nested text config, the
 * wrapper still makes it a Gemma4UnifiedTextConfig: window 1024 (512 for
 * gemma4_text), no per-layer inputs (256 for gemma4_text). */
static void test_unified_defaults(void) {
    cJSON *c = unified_config();
    if (!c) return;
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(c, "text_config");
    const char *drop[] = {"model_type", "sliding_window", "hidden_size_per_layer_input"};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++) cJSON_DeleteItemFromObjectCaseSensitive(tc, drop[i]);
    ds_gemma4_layout lay;
    ds_error *e = ds_gemma4_layout_read(c, "unified", &lay);
    if (e) cJSON_Delete(c);
    CHECK_OK(e);
    CHECK(lay.unified && lay.text == tc && !strcmp(lay.prefix, "model.language_model.") && lay.n_placeholders == 3,
          "layout of a gemma4_unified config");
    ds_gemma4_config g;
    e = ds_gemma4_config_read_as(lay.text, "unified", true, lay.unified, &g);
    if (!e) {
        CHECK(g.window == 1024 && g.ple_dim == 0, "unified defaults: window %d, per-layer inputs %d", g.window,
              g.ple_dim);
        ds_gemma4_config_free(&g);
    }
    e = e ? e : ds_gemma4_config_read_as(lay.text, "text", true, false, &g);
    if (!e) {
        CHECK(g.window == 512 && g.ple_dim == 256, "gemma4_text defaults: window %d, per-layer inputs %d", g.window,
              g.ple_dim);
        ds_gemma4_config_free(&g);
    }
    cJSON_Delete(c);
    CHECK_OK(e);
}

/* google/gemma-4-12B's own config.json (testdata/configs/README.md) reads
 * as the 12B: nested unified text config, its geometry, the wrapper's
 * placeholder ids and pad. */
static void test_released_config(void) {
    cJSON *c = (cJSON *)read_json_file(DS_TESTDATA "/configs/gemma-4-12B.config.json");
    if (!c) return;
    ds_gemma4_layout lay;
    ds_error *e = ds_gemma4_layout_read(c, "gemma-4-12B", &lay);
    ds_gemma4_config g;
    if (!e) e = ds_gemma4_config_read_as(lay.text, "gemma-4-12B", true, lay.unified, &g);
    if (e) cJSON_Delete(c);
    CHECK_OK(e);
    CHECK(lay.unified && !strcmp(lay.prefix, "model.language_model.") && lay.n_placeholders == 3 &&
              lay.placeholder[0] == 258880 && lay.placeholder[1] == 258884 && lay.placeholder[2] == 258881 &&
              lay.pad_id == 0,
          "gemma-4-12B layout");
    const ds_gemma4_attn_geom *sl = &g.geom[DS_G4_SLIDING], *fu = &g.geom[DS_G4_FULL];
    int full = 0;
    for (int l = 0; l < g.n_layers; l++) full += g.layer_type[l] == DS_G4_FULL;
    CHECK(g.vocab == 262144 && g.hidden == 3840 && g.n_layers == 48 && full == 8 && g.n_heads == 16 &&
              g.inter == 15360 && g.window == 1024 && g.max_pos == 262144 && g.softcap == 30.0f && g.k_eq_v &&
              g.tie_embeddings && !g.ple_dim && !g.n_kv_shared && !g.double_wide && sl->head_dim == 256 &&
              sl->n_kv_heads == 8 && fu->head_dim == 512 && fu->n_kv_heads == 1 && fu->inv_freq[63] > 0 &&
              fu->inv_freq[64] == 0,
          "gemma-4-12B text config as the engine reads it");
    ds_gemma4_config_free(&g);
    cJSON_Delete(c);
}

/* A copy of checkpoint `weights_of` whose config.json is `config`. */
static char *make_dir_of(const cJSON *config, const char *weights_of) {
    char *dir = malloc(256), path[512], target[512];
    snprintf(dir, 256, "%s/bad_XXXXXX", T);
    if (!mkdtemp(dir)) {
        free(dir);
        CHECK(0, "mkdtemp failed");
        return NULL;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_json_file(path, config);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(target, sizeof target, "%s/model.safetensors", weights_of);
    CHECK(symlink(target, path) == 0, "symlink %s", path);
    return dir;
}

static char *make_dir(const cJSON *config) { return make_dir_of(config, UNI); }

/* The converter's --text_only output (Gemma4UnifiedForCausalLM): the unified
 * text config at the top, tensors under "model.". With the text layout's
 * weights it computes the text layout's logits, bit for bit, and has no
 * placeholders (no wrapper). */
static void test_text_only_unified(void) {
    cJSON *c = unified_config();
    if (!c) return;
    cJSON *tc = cJSON_DetachItemFromObjectCaseSensitive(c, "text_config");
    /* The wrapper names the model's dtype at its top; a text-only save names it in its own (the K/V caches
     * follow it, model/kv_cache.h). */
    const char *dt = ds_cfg_str(c, "dtype");
    if (dt) cJSON_AddStringToObject(tc, "dtype", dt);
    cJSON_Delete(c);
    cJSON *a = cJSON_AddArrayToObject(tc, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString("Gemma4UnifiedForCausalLM"));
    char *dir = make_dir_of(tc, TXT);
    cJSON_Delete(tc);
    ds_target *u = NULL, *t = NULL;
    if (dir) open_target(dir, &u);
    open_target(TXT, &t);
    if (u && t) {
        CHECK(u->n_placeholders == 0, "a text-only checkpoint has no wrapper to swap placeholders");
        int32_t ids[6] = {2, 40, IMAGE_ID, 9, 300, 11};
        const size_t V = (size_t)u->vocab;
        float *lu = malloc(6 * V * sizeof *lu), *lt = malloc(6 * V * sizeof *lt);
        ds_error *e = ds_target_forward(u, ids, 6, 0, 6);
        if (!e) be->ops->download(be, ds_rows(u->logits, 0, 6), lu);
        if (!e) e = ds_target_forward(t, ids, 6, 0, 6);
        if (!e) be->ops->download(be, ds_rows(t->logits, 0, 6), lt);
        CHECK(!e, "%s", e ? ds_error_message(e) : "");
        ds_error_free(e);
        if (!e) CHECK(!memcmp(lu, lt, 6 * V * sizeof *lu), "text-only unified logits differ from the text layout's");
        free(lu);
        free(lt);
    }
    ds_target_free(u);
    ds_target_free(t);
    remove_model_dir(dir);
}

/* The unified config with field `field` of the top level (or of text_config
 * when in_text) replaced by the JSON `value` (NULL deletes it): opening it
 * fails with an error containing needle. */
static void expect_error(bool in_text, const char *field, const char *value, const char *needle) {
    cJSON *c = unified_config();
    if (!c) return;
    cJSON *o = in_text ? cJSON_GetObjectItemCaseSensitive(c, "text_config") : c;
    cJSON_DeleteItemFromObjectCaseSensitive(o, field);
    if (value) cJSON_AddItemToObject(o, field, cJSON_Parse(value));
    char *dir = make_dir(c);
    ds_target *t = NULL;
    if (dir) CHECK_ERR(ds_target_open(be, dir, NULL, &t), needle);
    CHECK(t == NULL, "%s: a target came back with the error", field);
    ds_target_free(t);
    remove_model_dir(dir);
    cJSON_Delete(c);
}

static void test_bad_configs(void) {
    expect_error(true, "model_type", "\"gemma4_text\"",
                 "text_config.model_type = \"gemma4_text\" does not match model_type gemma4_unified");
    expect_error(true, "hidden_size_per_layer_input", "256",
                 "hidden_size_per_layer_input = 256: gemma4_unified_text has no per-layer inputs");
    expect_error(false, "tie_word_embeddings", "false",
                 "tie_word_embeddings = false but text_config.tie_word_embeddings = true");
    expect_error(true, "use_bidirectional_attention", "\"all\"", "use_bidirectional_attention = \"all\"");
    expect_error(true, "pad_token_id", "null", "text_config.pad_token_id is null");
    expect_error(false, "image_token_id", "-3", "image_token_id = -3 is out of range");
    expect_error(false, "text_config", NULL, "model_type gemma4_unified but config has no text_config object");
    expect_error(false, "architectures", "[\"Gemma4ForCausalLM\"]", "unsupported architecture");
}

static void teardown(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", T);
    CHECK(system(cmd) == 0, "cleanup of %s", T);
    be->ops->destroy(be);
}

RUN_TESTS("gemma4_unified", setup, test_format, test_greedy_equals_text_layout, test_placeholder_embeds_as_pad,
          test_unified_defaults, test_released_config, test_text_only_unified, test_bad_configs, teardown)
