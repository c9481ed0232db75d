/* dspark synth and dspark bench on the CPU: the safetensors writer round
 * trips through the reader; a tiny synthetic checkpoint (sharded, with a
 * drafter) is byte-identical for any thread count, has N(0, 0.02) matrices
 * and unit norms, loads as a target + DSpark drafter whose drafted greedy
 * output equals plain greedy decoding; bench reports every figure. Gemma 4:
 * the 12B and 31B configs (written without weights) carry the released
 * models' numbers, DeepSpec's taps and their parameter counts, and parse as
 * the engine reads them; gemma4-tiny (the 12B's structure, narrow) loads as a
 * Gemma 4 target + Gemma4DSparkModel drafter with the layers, geometry and
 * taps the config says, and drafted greedy output equals plain greedy. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "draft/drafter.h"
#include "io/checkpoint.h"
#include "io/safetensors_write.h"
#include "model/gemma4_layer.h"
#include "speculate/generate.h"
#include "testlib.h"

/* This process's scratch directory, /tmp/ds_test_synth_<pid> (made on first use). */
static const char *tmpdir(char buf[64]) {
    snprintf(buf, 64, "/tmp/ds_test_synth_%ld", (long)getpid());
    mkdir(buf, 0700);
    return buf;
}

static int cli(const char *args, const char *out_file) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>/dev/null", DS_CLI, args, out_file ? out_file : "/dev/null");
    return system(cmd);
}

static ds_error *fill_iota(void *user, size_t index, size_t offset, void *buf, size_t nbytes) {
    (void)user;
    float *f = buf;
    for (size_t i = 0; i < nbytes / 4; i++) f[i] = (float)(index * 1000 + offset / 4 + i);
    return NULL;
}

static void test_writer_roundtrip(void) {
    char path[512], tb[64];
    snprintf(path, sizeof path, "%s/rt.safetensors", tmpdir(tb));
    ds_st_spec specs[] = {{"a", DS_F32, 2, {3, 5}}, {"b.c", DS_F32, 1, {7}}, {"s", DS_F32, 0, {0}}};
    /* A block of 8 bytes forces many fill calls per tensor. */
    CHECK_OK(ds_safetensors_write(path, specs, 3, 8, fill_iota, NULL));
    ds_safetensors *st;
    CHECK_OK(ds_safetensors_open(path, &st));
    const ds_st_tensor *a = ds_safetensors_find(st, "a"), *b = ds_safetensors_find(st, "b.c"),
                       *s = ds_safetensors_find(st, "s");
    CHECK(a && b && s, "tensors missing");
    if (a && b && s) {
        CHECK(a->ndim == 2 && a->shape[0] == 3 && a->shape[1] == 5 && a->nbytes == 60, "a's shape");
        CHECK(((const float *)a->data)[14] == 14.0f, "a[14] = %g", ((const float *)a->data)[14]);
        CHECK(((const float *)b->data)[6] == 1006.0f, "b[6] = %g", ((const float *)b->data)[6]);
        CHECK(s->ndim == 0 && ((const float *)s->data)[0] == 2000.0f, "scalar");
        CHECK(((uintptr_t)a->data - (uintptr_t)st->map) % 8 == 0, "data not 8-byte aligned");
    }
    ds_safetensors_close(st);
    ds_st_spec dup[] = {{"x", DS_F32, 1, {2}}, {"x", DS_F32, 1, {2}}};
    CHECK_ERR(ds_safetensors_write(path, dup, 2, 0, fill_iota, NULL), "listed twice");
    CHECK_ERR(ds_safetensors_write("/nonexistent-dir/x.safetensors", specs, 1, 0, fill_iota, NULL),
              "/nonexistent-dir/x.safetensors");
}

static bool same_file(const char *a, const char *b) {
    size_t la, lb;
    char *x = read_text_file(a, &la), *y = read_text_file(b, &lb);
    bool same = x && y && la == lb && !memcmp(x, y, la);
    free(x);
    free(y);
    return same;
}

static void test_synth_files(void) {
    char args[1024], a[512], b[512];
    char tb[64];
    const char *T = tmpdir(tb);
    snprintf(args, sizeof args, "synth --like tiny --out %s/t1 --drafter --threads 1 --shard-size 300000", T);
    CHECK(cli(args, NULL) == 0, "%s", args);
    snprintf(args, sizeof args, "synth --like tiny --out %s/t3 --drafter --threads 3 --shard-size 300000", T);
    CHECK(cli(args, NULL) == 0, "%s", args);
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors.index.json",
                           "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(a, sizeof a, "%s/t1/%s", T, files[i]);
        snprintf(b, sizeof b, "%s/t3/%s", T, files[i]);
        CHECK(access(a, R_OK) == 0 && same_file(a, b), "%s differs between 1 and 3 threads (or is missing)", files[i]);
    }
    snprintf(a, sizeof a, "%s/t1-dspark/model-00001-of-00002.safetensors", T);
    snprintf(b, sizeof b, "%s/t3-dspark/model-00001-of-00002.safetensors", T);
    CHECK(same_file(a, b), "drafter shard differs between thread counts");
    snprintf(args, sizeof args, "synth --like gemma4-e4b --out %s/g", T);
    CHECK(cli(args, NULL) != 0, "gemma4-e4b should be refused");
    snprintf(args, sizeof args, "synth --like nope --out %s/g", T);
    CHECK(cli(args, NULL) != 0, "an unknown --like should be refused");

    ds_checkpoint *ck;
    snprintf(a, sizeof a, "%s/t1", T);
    CHECK_OK(ds_checkpoint_open(a, &ck));
    CHECK(ck->n_shards == 3, "%zu shards, expected 3", ck->n_shards);
    const ds_st_tensor *n = ds_checkpoint_find(ck, "model.layers.3.input_layernorm.weight"),
                       *w = ds_checkpoint_find(ck, "model.layers.2.mlp.gate_proj.weight");
    CHECK(n && w, "tensors missing");
    if (n && w) {
        bool ones = true;
        for (int64_t i = 0; i < n->shape[0]; i++) ones &= ds_bf16_to_f32(((const uint16_t *)n->data)[i]) == 1.0f;
        CHECK(ones, "norm weights are not 1");
        size_t cnt = w->nbytes / 2;
        double s = 0, s2 = 0;
        for (size_t i = 0; i < cnt; i++) {
            double v = ds_bf16_to_f32(((const uint16_t *)w->data)[i]);
            s += v;
            s2 += v * v;
        }
        double mean = s / cnt, sd = sqrt(s2 / cnt - mean * mean);
        CHECK(fabs(mean) < 1e-3 && fabs(sd - 0.02) < 1e-3, "gate_proj mean %g sd %g, expected 0 / 0.02", mean, sd);
    }
    ds_checkpoint_close(ck);
}

/* Target m and drafter d on a 2-thread CPU backend; *t and *dr stay NULL
 * where loading failed (reported). NULL: no backend. */
static ds_backend *open_pair(const char *m, const char *d, ds_target **t, ds_drafter **dr) {
    ds_backend *be = NULL;
    *t = NULL;
    *dr = NULL;
    ds_error *e = ds_backend_cpu_new(2, &be);
    ds_target_opts to = {.max_rows = 64, .max_logit_rows = DS_MAX_GAMMA + 1};
    if (!e) e = ds_target_open(be, m, &to, t);
    if (!e) e = ds_drafter_open(be, d, *t, NULL, dr);
    CHECK(!e, "%s", e ? ds_error_message(e) : "");
    ds_error_free(e);
    return be;
}

static void close_pair(ds_backend *be, ds_target *t, ds_drafter *dr) {
    ds_drafter_free(dr);
    ds_target_free(t);
    if (be) be->ops->destroy(be);
}

/* Greedy decoding of n tokens after a fixed 12-token prompt, plain and
 * drafted: both n tokens long and identical. *ar keeps the plain run. */
static void check_drafted_is_ar(ds_target *t, ds_drafter *dr, int n, ds_gen_result *ar) {
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = (int32_t)(i * 37 % 512);
    ds_gen_params p = {.max_new = n, .sampling = {.top_p = 1.0f}, .ignore_stop = true};
    ds_gen_result sp = {0};
    ds_error *e = ds_generate(t, NULL, prompt, 12, &p, NULL, NULL, ar);
    if (!e) e = ds_generate(t, dr, prompt, 12, &p, NULL, NULL, &sp);
    CHECK(!e, "%s", e ? ds_error_message(e) : "");
    ds_error_free(e);
    CHECK(ar->n_tokens == n && sp.n_tokens == n && !memcmp(ar->tokens, sp.tokens, sizeof *ar->tokens * (size_t)n),
          "drafted greedy output differs from plain greedy");
    ds_gen_result_free(&sp);
}

static void test_load_and_generate(void) {
    char m[512], d[512], tb[64];
    snprintf(m, sizeof m, "%s/t1", tmpdir(tb));
    snprintf(d, sizeof d, "%s/t1-dspark", tmpdir(tb));
    ds_target *t;
    ds_drafter *dr;
    ds_backend *be = open_pair(m, d, &t, &dr);
    if (t && dr) {
        CHECK(t->n_layers == 8 && t->hidden == 64 && t->vocab == 512, "target shape");
        CHECK(dr->gamma == 7 && dr->n_taps == 2 && dr->tap_layers[0] == 1 && dr->tap_layers[1] == 5 &&
                  dr->markov == DS_MARKOV_VANILLA && dr->markov_rank == 16 && dr->confidence,
              "drafter config");
        ds_gen_result ar = {0};
        check_drafted_is_ar(t, dr, 24, &ar);
        ds_gen_result_free(&ar);
    }
    close_pair(be, t, dr);
}


static double num(const cJSON *o, const char *k) { return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k)); }

static bool int_array_is(const cJSON *a, const int *want, int n) {
    if (cJSON_GetArraySize(a) != n) return false;
    for (int i = 0; i < n; i++)
        if (cJSON_GetNumberValue(cJSON_GetArrayItem(a, i)) != want[i]) return false;
    return true;
}

/* A released Gemma 4 shape, configs only: the numbers written, the size the
 * weights would have, and the engine's reading of the configs. */
static void check_gemma4_shape(const char *like, bool unified, int hidden, int layers, int heads, int kv, int gkv,
                               int inter, double params_lo, double params_hi, const int *taps) {
    char args[1024], path[512], dir[256], tb[64];
    const char *T = tmpdir(tb);
    snprintf(dir, sizeof dir, "%s/%s", T, like);
    snprintf(path, sizeof path, "%s/%s.json", T, like);
    snprintf(args, sizeof args, "synth --like %s --out %s --drafter --config-only", like, dir);
    CHECK(cli(args, path) == 0, "%s", args);
    cJSON *out = (cJSON *)read_json_file(path);
    /* No weights written, their size reported: 2 bytes a parameter. */
    const double params = num(out, "target_bytes") / 2;
    CHECK(params >= params_lo && params <= params_hi, "%s: %.4g parameters, expected %.4g..%.4g", like, params,
          params_lo, params_hi);
    CHECK(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(out, "weights_written")), "%s: weights_written", like);
    cJSON_Delete(out);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(access(path, F_OK) != 0, "%s: --config-only wrote weights", like);

    snprintf(path, sizeof path, "%s/config.json", dir);
    /* transformers' strict Gemma4TextConfig refuses an integer for a float field. */
    char *txt = read_text_file(path, NULL);
    CHECK(txt && strstr(txt, "\"final_logit_softcapping\":\t30.0,") && strstr(txt, "\"rope_theta\":\t1000000.0,") &&
              strstr(txt, "\"attention_dropout\":\t0.0,"),
          "%s: float fields not written as floats", like);
    free(txt);
    cJSON *root = (cJSON *)read_json_file(path);
    /* The unified layout (the 12B as released) nests the text config. */
    const char *arch =
        cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "architectures"), 0));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "model_type")),
                  unified ? "gemma4_unified" : "gemma4_text") &&
              !strcmp(arch, unified ? "Gemma4UnifiedForConditionalGeneration" : "Gemma4ForCausalLM"),
          "%s: model_type / architectures", like);
    cJSON *c = unified ? cJSON_GetObjectItemCaseSensitive(root, "text_config") : root;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(c, "layer_types");
    int full = 0;
    for (int i = 0; i < cJSON_GetArraySize(lt); i++)
        full += !strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(lt, i)), "full_attention");
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "model_type")),
                  unified ? "gemma4_unified_text" : "gemma4_text"),
          "%s: text model_type", like);
    CHECK(num(c, "hidden_size") == hidden && num(c, "num_hidden_layers") == layers &&
              num(c, "num_attention_heads") == heads && num(c, "num_key_value_heads") == kv &&
              num(c, "num_global_key_value_heads") == gkv && num(c, "intermediate_size") == inter &&
              num(c, "head_dim") == 256 && num(c, "global_head_dim") == 512 && num(c, "vocab_size") == 262144 &&
              num(c, "sliding_window") == 1024 && num(c, "max_position_embeddings") == 262144 &&
              num(c, "final_logit_softcapping") == 30 && num(c, "hidden_size_per_layer_input") == 0 &&
              cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "attention_k_eq_v")) &&
              cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "tie_word_embeddings")),
          "%s: config numbers", like);
    CHECK(cJSON_GetArraySize(lt) == layers && full == layers / 6 &&
              !strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(lt, 5)), "full_attention") &&
              !strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(lt, 6)), "sliding_attention"),
          "%s: layer_types (5 sliding : 1 full)", like);
    /* As the engine reads it. */
    ds_gemma4_config g;
    ds_error *e = ds_gemma4_config_read(c, like, true, &g);
    CHECK(!e, "%s", e ? ds_error_message(e) : "");
    ds_error_free(e);
    if (!e) {
        const ds_gemma4_attn_geom *s = &g.geom[DS_G4_SLIDING], *f = &g.geom[DS_G4_FULL];
        CHECK(g.n_layers == layers && g.window == 1024 && g.softcap == 30.0f && g.k_eq_v && !g.ple_dim &&
                  g.n_kv_shared == 0 && g.layer_type[layers - 1] == DS_G4_FULL && s->head_dim == 256 &&
                  s->n_kv_heads == kv && f->head_dim == 512 && f->n_kv_heads == gkv,
              "%s: engine's reading of the config", like);
        /* Proportional RoPE on full layers: 0.25 of the 256 frequency pairs turn. */
        CHECK(f->inv_freq[63] > 0 && f->inv_freq[64] == 0 && s->inv_freq[127] > 0, "%s: RoPE tables", like);
        ds_gemma4_config_free(&g);
    }
    cJSON_Delete(root);

    snprintf(path, sizeof path, "%s-dspark/config.json", dir);
    cJSON *d = (cJSON *)read_json_file(path);
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(d, "architectures"), 0)),
                  "Gemma4DSparkModel") &&
              num(d, "num_hidden_layers") == 5 && num(d, "block_size") == 7 && num(d, "markov_rank") == 256 &&
              num(d, "mask_token_id") == 4 && num(d, "num_target_layers") == layers &&
              int_array_is(cJSON_GetObjectItemCaseSensitive(d, "target_layer_ids"), taps, 5) &&
              cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(d, "tie_word_embeddings")) &&
              !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "target_model_type")),
                      unified ? "gemma4_unified" : "gemma4"),
          "%s: drafter config", like);
    cJSON_Delete(d);
}

static void test_gemma4_real_shapes(void) {
    /* gemma-4-12B, written as released (Gemma4UnifiedForConditionalGeneration):
     * the text model's 11.907B parameters and 52.4M in the encoder-free
     * vision/audio projections; DeepSpec's config/dflash/dflash_gemma4_12b.py
     * taps [5, 17, 29, 41, 46]. */
    const int taps12[] = {5, 17, 29, 41, 46}, taps31[] = {5, 23, 35, 53, 58};
    check_gemma4_shape("gemma4-12b", true, 3840, 48, 16, 8, 1, 15360, 11.95e9, 11.97e9, taps12);
    /* gemma-4-31B: 30.7B parameters. */
    check_gemma4_shape("gemma4-31b", false, 5376, 60, 32, 16, 4, 21504, 30.6e9, 30.8e9, taps31);
}

/* Qwen3-32B (issue 43's two-GPU shape), configs only: Qwen/Qwen3-32B's numbers and its 32.8 B parameters. */
static void test_qwen3_32b_shape(void) {
    char args[1024], path[512], dir[256], tb[64];
    const char *T = tmpdir(tb);
    snprintf(dir, sizeof dir, "%s/qwen3-32b", T);
    snprintf(path, sizeof path, "%s/qwen3-32b.json", T);
    snprintf(args, sizeof args, "synth --like qwen3-32b --out %s --drafter --config-only", dir);
    CHECK(cli(args, path) == 0, "%s", args);
    cJSON *out = (cJSON *)read_json_file(path);
    const double params = num(out, "target_bytes") / 2;
    CHECK(params > 32.7e9 && params < 32.8e9, "qwen3-32b: %.4g parameters (Qwen/Qwen3-32B: 32.76 B)", params);
    cJSON_Delete(out);
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *c = (cJSON *)read_json_file(path);
    CHECK(c && num(c, "hidden_size") == 5120 && num(c, "intermediate_size") == 25600 &&
              num(c, "num_hidden_layers") == 64 && num(c, "num_attention_heads") == 64 &&
              num(c, "num_key_value_heads") == 8 && num(c, "head_dim") == 128 && num(c, "vocab_size") == 151936,
          "qwen3-32b: config.json's shapes");
    cJSON_Delete(c);
}

static void test_gemma4_tiny_generate(void) {
    char args[1024], m[512], d[512], tb[64];
    const char *T = tmpdir(tb);
    snprintf(m, sizeof m, "%s/g4", T);
    snprintf(d, sizeof d, "%s/g4-dspark", T);
    snprintf(args, sizeof args, "synth --like gemma4-tiny --out %s --drafter --threads 2", m);
    CHECK(cli(args, NULL) == 0, "%s", args);
    ds_checkpoint *ck;
    CHECK_OK(ds_checkpoint_open(m, &ck));
    const ds_st_tensor *k5 = ds_checkpoint_find(ck, "model.layers.5.self_attn.k_proj.weight"),
                       *k4 = ds_checkpoint_find(ck, "model.layers.4.self_attn.k_proj.weight");
    CHECK(k5 && k4 && k5->dtype == DS_BF16 && k5->shape[0] == 32 && k4->shape[0] == 32 && k5->shape[1] == 64,
          "k_proj shapes (full layer 5: 1 head x 32, sliding layer 4: 2 heads x 16)");
    CHECK(!ds_checkpoint_find(ck, "model.layers.5.self_attn.v_proj.weight") &&
              ds_checkpoint_find(ck, "model.layers.4.self_attn.v_proj.weight") &&
              ds_checkpoint_find(ck, "model.layers.47.layer_scalar") && !ds_checkpoint_find(ck, "lm_head.weight"),
          "K = V on full layers only, layer_scalar, tied head");
    ds_checkpoint_close(ck);

    ds_target *t;
    ds_drafter *dr;
    ds_backend *be = open_pair(m, d, &t, &dr);
    if (t && dr) {
        CHECK(!strcmp(t->model_type, "gemma4_text") && t->n_layers == 48 && t->hidden == 64 && t->vocab == 512,
              "target shape");
        CHECK(!strcmp(dr->arch, "Gemma4DSparkModel") && dr->gamma == 7 && dr->n_taps == 5 &&
                  dr->tap_layers[0] == 5 && dr->tap_layers[1] == 17 && dr->tap_layers[2] == 29 &&
                  dr->tap_layers[3] == 41 && dr->tap_layers[4] == 46 && dr->markov == DS_MARKOV_VANILLA &&
                  dr->markov_rank == 16 && dr->confidence && dr->logit_softcap == 30.0f,
              "drafter config (DeepSpec's 12B taps)");
        /* Longer than the window (8): the sliding layers' ring is used. */
        ds_gen_result ar = {0};
        check_drafted_is_ar(t, dr, 40, &ar);
        int distinct = 0;
        for (int i = 0; i < ar.n_tokens; i++) {
            bool seen = false;
            for (int j = 0; j < i; j++) seen |= ar.tokens[j] == ar.tokens[i];
            distinct += !seen;
        }
        CHECK(distinct >= 4, "degenerate greedy output (%d distinct tokens)", distinct);
        ds_gen_result_free(&ar);
    }
    close_pair(be, t, dr);
}

/* A bench array of one entry per context row count n = 1..gamma+1, each a positive time. */
static void check_context_rows(const cJSON *arr, const char *name, int G) {
    CHECK(cJSON_GetArraySize(arr) == G + 1, "%s: %d entries, gamma %d", name, cJSON_GetArraySize(arr), G);
    for (int n = 1; n <= cJSON_GetArraySize(arr); n++) {
        const cJSON *it = cJSON_GetArrayItem(arr, n - 1);
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(it, "context_rows")) == n &&
                  cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(it, "ms")) > 0,
              "%s[%d]", name, n - 1);
    }
}

static void test_bench_cli(void) {
    char args[1024], out[512];
    char tb[64];
    const char *T = tmpdir(tb);
    snprintf(out, sizeof out, "%s/bench.json", T);
    snprintf(args, sizeof args,
             "bench -m %s/t1 -d %s/t1-dspark --threads 2 --prompt-len 16 --decode 8 --reps 2 --assume-tau 3 --json", T,
             T);
    CHECK(cli(args, out) == 0, "%s", args);
    char *txt = read_text_file(out, NULL);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    CHECK(j, "bench output is not JSON: %s", txt ? txt : "(none)");
    if (j) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "ar_decode"),
                    *v = cJSON_GetObjectItemCaseSensitive(j, "verify"),
                    *dr = cJSON_GetObjectItemCaseSensitive(j, "drafter"),
                    *run = cJSON_GetObjectItemCaseSensitive(j, "drafted_run"),
                    *pj = cJSON_GetObjectItemCaseSensitive(j, "projection");
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(a, "ms_per_token")) > 0, "ar ms_per_token");
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(a, "pct_of_floor")) > 0, "pct_of_floor");
        CHECK(cJSON_GetArraySize(v) == 8, "verify rows 1..8: %d", cJSON_GetArraySize(v));
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(dr, "draft_round_ms")) > 0, "draft_round_ms");
        const int G = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(dr, "gamma"));
        /* the drafter's round with the context append of n = 1..gamma+1 rows, and the round as the greedy loop
         * runs it */
        const cJSON *wc = cJSON_GetObjectItemCaseSensitive(dr, "draft_with_context_ms"),
                    *lr = cJSON_GetObjectItemCaseSensitive(dr, "loop_round_ms");
        check_context_rows(wc, "draft_with_context_ms", G);
        check_context_rows(lr, "loop_round_ms", G);
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(run, "tau_measured")) >= 1, "tau_measured");
        const cJSON *p0 = cJSON_GetArrayItem(pj, 0);
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(p0, "tau")) == 3 &&
                  strstr(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p0, "kind")), "projection"),
              "projection entry");
        /* tau 3's round: the drafter's with 3 context rows and the verify of gamma+1 */
        const double want = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(wc, 2), "ms")) +
                            cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(dr, "verify_gamma_plus_1_ms")),
                     got = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(p0, "round_ms"));
        CHECK(fabs(got - want) < 1e-9 * want, "projection round_ms %g, want %g", got, want);
        const double want_loop = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(lr, 2), "ms")),
                     got_loop = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(p0, "loop_round_ms"));
        CHECK(fabs(got_loop - want_loop) < 1e-9 * want_loop, "projection loop_round_ms %g, want %g", got_loop, want_loop);
    }
    cJSON_Delete(j);
    free(txt);
    snprintf(args, sizeof args, "bench -m %s/t1 --assume-tau 0.5", T);
    CHECK(cli(args, NULL) != 0, "--assume-tau 0.5 should be refused");
    snprintf(args, sizeof args, "bench -m %s/nonexistent", T);
    CHECK(cli(args, NULL) != 0, "a missing model should fail");
}

static void test_cleanup(void) {
    char cmd[512], tb[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir(tb));
    CHECK(system(cmd) == 0, "cleanup of %s", tb);
}

RUN_TESTS("synth", test_writer_roundtrip, test_synth_files, test_load_and_generate, test_gemma4_real_shapes, test_qwen3_32b_shape,
          test_gemma4_tiny_generate, test_bench_cli, test_cleanup)
