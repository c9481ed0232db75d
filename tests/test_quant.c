/* Affine-quantized weights (MLX's layout; issue 42) on the qwen3-tiny
 * fixture, quantized by scripts/mlx_quant_ref.py (a numpy re-implementation
 * of mx.quantize) into testdata/fixtures/qwen3-tiny-quant/:
 * - the quantized targets' logits match the numpy forward over the
 *   dequantized weights (golden.safetensors) within TOL, and equal to the
 *   bit the engine's own logits on the dequantized fp32 checkpoint (built
 *   here, each weight's bytes checked against numpy's: dequant_fnv.json);
 * - a row's logits do not depend on how many rows share the forward;
 * - greedy drafted == greedy AR on each quantized target (plain and int8 drafters);
 * - Gemma 4 (gemma4-tiny-quant): bit-equal to its dequantized copy, drafted == AR;
 * - mlx-lm's per-module overrides and exclusions load with the right layout;
 * - `dspark quantize` writes the script's model.safetensors byte for byte;
 * - broken checkpoints are refused with errors naming the field or tensor. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "draft/drafter.h"
#include "io/checkpoint.h"
#include "io/quant_checkpoint.h"
#include "io/safetensors_write.h"
#include "model/target.h"
#include "speculate/generate.h"
#include "pinned.h"
#include "testlib.h"

#define SRC DS_TESTDATA "/fixtures/qwen3-tiny"
#define FIX DS_TESTDATA "/fixtures/qwen3-tiny-quant"
/* fp32 throughout; the plain fixture's bound against torch (test_qwen3). */
#define TOL 1e-4

static ds_backend *be;
static const char *targets[] = {"target-q4g32", "target-q8g64"};
#define G4 DS_TESTDATA "/fixtures/gemma4-tiny-quant"
/* The dequantized fp32 copies (setup builds them, teardown removes them). */
static char tmp_root[] = "/tmp/ds_quant_dense_XXXXXX", dense[3][600];

static ds_error *fill_ptrs(void *user, size_t i, size_t off, void *buf, size_t nb) {
    const void *const *data = user;
    memcpy(buf, (const char *)data[i] + off, nb);
    return NULL;
}

/* dir: qdir's checkpoint with every quantized weight dequantized to fp32 (ds_quant_dequantize) and the rest as it
 * is, config.json without the quantization block. Each dequantized weight's bytes must hash (FNV-1a) to what
 * numpy's dequantize gave (scripts/mlx_quant_ref.py: fnv_file[variant]). */
static ds_error *make_dense(const char *qdir, const char *dir, const char *fnv_file, const char *variant) {
    ds_checkpoint *ck;
    DS_TRY(ds_checkpoint_open(qdir, &ck));
    cJSON *fnv = read_json_file(fnv_file);
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(fnv, variant);
    const ds_safetensors *st = ck->shards[0];
    ds_st_spec *specs = calloc(st->n_tensors, sizeof *specs);
    const void **data = calloc(st->n_tensors, sizeof *data);
    float **owned = calloc(st->n_tensors, sizeof *owned);
    size_t m = 0;
    int checked = 0;
    ds_error *e = want ? NULL : ds_errorf("%s: no %s", fnv_file, variant);
    for (size_t i = 0; i < st->n_tensors && !e; i++) {
        const ds_st_tensor *t = &st->tensors[i];
        const size_t n = strlen(t->name);
        if (n > 7 && (!strcmp(t->name + n - 7, ".scales") || !strcmp(t->name + n - 7, ".biases"))) continue;
        specs[m] = (ds_st_spec){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        memcpy(specs[m].shape, t->shape, sizeof specs[m].shape);
        data[m] = t->data;
        if (t->dtype == DS_U32) {
            char path[256];
            snprintf(path, sizeof path, "%.*s", (int)(n - 7), t->name);
            bool quantized;
            int bits = 0, group = 0;
            ds_quant_src q;
            e = ds_quant_config_for(ck->config, qdir, path, &quantized, &bits, &group);
            const int64_t rows = t->shape[0], cols = t->shape[1] * 32 / (bits ? bits : 32);
            if (!e) e = ds_checkpoint_quant(ck, t->name, rows, cols, &q);
            if (!e) e = ds_quant_dequantize(&q, rows, cols, &owned[m]);
            if (e) break;
            const cJSON *h = cJSON_GetObjectItemCaseSensitive(want, t->name);
            char hex[17];
            snprintf(hex, sizeof hex, "%016llx",
                     (unsigned long long)pinned_fnv(PINNED_FNV_START, owned[m], (size_t)(rows * cols) * sizeof(float)));
            CHECK(cJSON_IsString(h) && !strcmp(h->valuestring, hex), "%s %s: dequantized bytes hash %s, numpy's %s",
                  variant, t->name, hex, cJSON_IsString(h) ? h->valuestring : "(none)");
            checked++;
            specs[m].dtype = DS_F32;
            specs[m].shape[1] = cols;
            data[m] = owned[m];
        }
        m++;
    }
    CHECK(e || checked == cJSON_GetArraySize(want), "%s: %d weights dequantized, numpy hashed %d", variant, checked,
          cJSON_GetArraySize(want));
    char path[700];
    if (!e && mkdir(dir, 0700) != 0) e = ds_errorf("%s: cannot create", dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!e) e = ds_safetensors_write(path, specs, m, 0, fill_ptrs, data);
    cJSON *cfg = cJSON_Duplicate(ck->config, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!e) write_json_file(path, cfg);
    cJSON_Delete(cfg);
    for (size_t i = 0; i < m; i++) free(owned[i]);
    free(owned);
    free(data);
    free(specs);
    cJSON_Delete(fnv);
    ds_checkpoint_close(ck);
    return e;
}

static float *prompt_logits(const char *dir, const int32_t *ids, int T) {
    ds_target *t;
    ds_error *e = ds_target_open(be, dir, NULL, &t);
    if (e) {
        CHECK(false, "%s: %s", dir, ds_error_message(e));
        ds_error_free(e);
        return NULL;
    }
    float *out = malloc((size_t)T * t->vocab * sizeof *out);
    e = ds_target_forward(t, ids, T, 0, T);
    if (!e) be->ops->download(be, ds_rows(t->logits, 0, T), out);
    if (e) {
        CHECK(false, "%s: forward: %s", dir, ds_error_message(e));
        ds_error_free(e);
        free(out);
        out = NULL;
    }
    ds_target_free(t);
    return out;
}

static void test_logits(void) {
    ds_safetensors *g = golden_open(FIX "/golden.safetensors");
    if (!g) return;
    size_t T, n;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    for (int i = 0; i < 2; i++) {
        char dir[512], name[64];
        snprintf(dir, sizeof dir, "%s/%s", FIX, targets[i]);
        snprintf(name, sizeof name, "logits_%s", targets[i]);
        float *ref = golden_f32(g, name, &n), *q = prompt_logits(dir, ids, (int)T), *d = prompt_logits(dense[i], ids, (int)T);
        if (ref && q && d) {
            const double err = rel_err_max(q, ref, n);
            printf("  %s: logits vs numpy over the dequantized weights: rel err %.3g (bound %g)\n", targets[i], err, TOL);
            CHECK(err <= TOL, "%s: rel err %g > %g", targets[i], err, TOL);
            CHECK(!memcmp(q, d, n * sizeof *q), "%s: logits differ from the dequantized fp32 checkpoint's", targets[i]);
        }
        free(ref);
        free(q);
        free(d);
    }
    free(ids);
    golden_close(g);
}

static void test_row_invariance(void) {
    ds_safetensors *g = golden_open(FIX "/golden.safetensors");
    if (!g) return;
    size_t T;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    ds_target *t;
    CHECK_OK(ds_target_open(be, FIX "/target-q4g32", NULL, &t));
    const int V = t->vocab, P = (int)T - 6, n = 6;
    float *a = malloc((size_t)n * V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
    CHECK_OK(ds_target_forward(t, ids, P, 0, 1));
    CHECK_OK(ds_target_forward(t, ids + P, n, P, n));
    be->ops->download(be, ds_rows(t->logits, 0, n), a);
    ds_target_crop(t, P);
    for (int i = 0; i < n; i++) {
        CHECK_OK(ds_target_forward(t, ids + P + i, 1, P + i, 1));
        be->ops->download(be, ds_rows(t->logits, 0, 1), b);
        CHECK(!memcmp(a + (size_t)i * V, b, (size_t)V * sizeof *b), "row %d: %d-row forward != 1-row forward", i, n);
    }
    free(a);
    free(b);
    free(ids);
    golden_close(g);
    ds_target_free(t);
}

static void test_drafted_equals_ar(void) {
    ds_safetensors *g = golden_open(FIX "/golden.safetensors");
    if (!g) return;
    size_t T;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    const char *drafters[] = {SRC "/drafter-trained", FIX "/drafter-q8g32"};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) {
            char dir[512];
            snprintf(dir, sizeof dir, "%s/%s", FIX, targets[i]);
            ds_target *t;
            ds_drafter *d;
            CHECK_OK(ds_target_open(be, dir, NULL, &t));
            CHECK_OK(ds_drafter_open(be, drafters[k], t, NULL, &d));
            ds_gen_params p = {.max_new = 48, .ignore_stop = true};
            ds_gen_result ar = {0}, sp = {0};
            CHECK_OK(ds_generate(t, NULL, ids, (int)T, &p, NULL, NULL, &ar));
            ds_target_crop(t, 0);
            CHECK_OK(ds_generate(t, d, ids, (int)T, &p, NULL, NULL, &sp));
            CHECK(ar.n_tokens == sp.n_tokens && !memcmp(ar.tokens, sp.tokens, (size_t)ar.n_tokens * sizeof *ar.tokens),
                  "%s + %s: drafted greedy != AR greedy", targets[i], drafters[k]);
            int acc = 0;
            for (int r = 0; r < sp.rounds; r++) acc += sp.accept_len[r];
            printf("  %s + %s: drafted == AR (%d tokens), tau %.3f over %d rounds\n", targets[i],
                   strrchr(drafters[k], '/') + 1, sp.n_tokens, sp.rounds ? (double)acc / sp.rounds : 0.0, sp.rounds);
            ds_gen_result_free(&ar);
            ds_gen_result_free(&sp);
            ds_drafter_free(d);
            ds_target_free(t);
        }
    free(ids);
    golden_close(g);
}

/* Gemma 4 (tied: the quantized embedding table is the LM head; k_eq_v): bit-equal to its dequantized fp32
 * copy, and drafted == AR with a plain and an int8 drafter. */
static void test_gemma4(void) {
    ds_safetensors *g = golden_open(FIX "/golden.safetensors");
    if (!g) return;
    size_t T;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    golden_close(g);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/target-q4g32", G4);
    float *q = prompt_logits(dir, ids, (int)T), *d = prompt_logits(dense[2], ids, (int)T);
    CHECK(q && d && !memcmp(q, d, (size_t)T * 512 * sizeof *q), "gemma4 q4g32: logits differ from the dequantized fp32 checkpoint's");
    free(q);
    free(d);
    const char *drafters[] = {DS_TESTDATA "/fixtures/gemma4-tiny/drafter-trained", DS_TESTDATA "/fixtures/gemma4-tiny-quant/drafter-q8g32"};
    for (int k = 0; k < 2; k++) {
        ds_target *t;
        ds_drafter *dr;
        CHECK_OK(ds_target_open(be, dir, NULL, &t));
        CHECK_OK(ds_drafter_open(be, drafters[k], t, NULL, &dr));
        ds_gen_params p = {.max_new = 48, .ignore_stop = true};
        ds_gen_result ar = {0}, sp = {0};
        CHECK_OK(ds_generate(t, NULL, ids, (int)T, &p, NULL, NULL, &ar));
        ds_target_crop(t, 0);
        CHECK_OK(ds_generate(t, dr, ids, (int)T, &p, NULL, NULL, &sp));
        CHECK(ar.n_tokens == sp.n_tokens && !memcmp(ar.tokens, sp.tokens, (size_t)ar.n_tokens * sizeof *ar.tokens),
              "gemma4 q4g32 + %s: drafted greedy != AR greedy", drafters[k]);
        int acc = 0;
        for (int r = 0; r < sp.rounds; r++) acc += sp.accept_len[r];
        printf("  gemma4 target-q4g32 + %s: drafted == AR (%d tokens), tau %.3f\n", strrchr(drafters[k], '/') + 1,
               sp.n_tokens, sp.rounds ? (double)acc / sp.rounds : 0.0);
        ds_gen_result_free(&ar);
        ds_gen_result_free(&sp);
        ds_drafter_free(dr);
        ds_target_free(t);
    }
    free(ids);
}

static bool same_file(const char *a, const char *b) {
    size_t la, lb;
    char *x = read_text_file(a, &la), *y = read_text_file(b, &lb);
    const bool same = x && y && la == lb && !memcmp(x, y, la);
    free(x);
    free(y);
    return same;
}

static void test_quantize_cli(void) {
    char root[] = "/tmp/ds_quant_XXXXXX";
    if (!mkdtemp(root)) {
        CHECK(false, "mkdtemp");
        return;
    }
    const struct {
        const char *src, *args, *fix;
    } cases[] = {{SRC "/target", "--bits 4 --group 32", "target-q4g32"},
                 {SRC "/target", "--bits 8 --group 64 --skip lm_head", "target-q8g64"},
                 {SRC "/drafter-trained", "--bits 8 --group 32", "drafter-q8g32"}};
    for (int i = 0; i < 3; i++) {
        char cmd[2048], out[600], got[700], want[700];
        snprintf(out, sizeof out, "%s/%s", root, cases[i].fix);
        snprintf(cmd, sizeof cmd, "%s quantize -m %s %s --out %s 2>/dev/null", DS_CLI, cases[i].src, cases[i].args, out);
        CHECK(system(cmd) == 0, "%s failed", cmd);
        snprintf(got, sizeof got, "%s/model.safetensors", out);
        snprintf(want, sizeof want, "%s/%s/model.safetensors", FIX, cases[i].fix);
        CHECK(same_file(got, want), "%s: %s differs from the numpy-made %s", cases[i].args, got, want);
        remove(got);
        snprintf(got, sizeof got, "%s/config.json", out);
        cJSON *cfg = read_json_file(got);
        const cJSON *q = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "quantization") : NULL;
        CHECK(q && cJSON_GetObjectItemCaseSensitive(q, "bits") && cJSON_GetObjectItemCaseSensitive(q, "group_size"),
              "%s: no quantization block", got);
        cJSON_Delete(cfg);
        char rm[800];
        snprintf(rm, sizeof rm, "rm -rf '%s'", out);
        CHECK(system(rm) == 0, "%s", rm);
    }
    /* Arguments out of range exit 2 before reading anything. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s quantize -m %s --bits 3 --out %s/x 2>/dev/null", DS_CLI, SRC "/target", root);
    CHECK(WEXITSTATUS(system(cmd)) == 2, "--bits 3 accepted");
    snprintf(cmd, sizeof cmd, "%s quantize -m %s --bits 4 --group 48 --out %s/x 2>/dev/null", DS_CLI, SRC "/target", root);
    CHECK(WEXITSTATUS(system(cmd)) == 2, "--group 48 accepted");
    rmdir(root);
}

/* A copy of target-q4g32 with its config edited and one tensor dropped or
 * given another shape, in dir. */
typedef struct {
    const ds_checkpoint *ck;
    ds_st_spec *specs;
    const ds_st_tensor **src;
} variant_fill;

static ds_error *fill_variant(void *user, size_t i, size_t off, void *buf, size_t nb) {
    const variant_fill *v = user;
    const ds_st_tensor *t = v->src[i];
    memset(buf, 0, nb);
    if (off < t->nbytes) memcpy(buf, (const char *)t->data + off, off + nb <= t->nbytes ? nb : t->nbytes - off);
    return NULL;
}

static ds_error *open_variant(const char *cfg_patch, const char *drop, const char *reshape, int64_t r, int64_t c) {
    char dir[] = "/tmp/ds_quant_bad_XXXXXX";
    if (!mkdtemp(dir)) return ds_errorf("mkdtemp failed");
    ds_checkpoint *ck;
    DS_TRY(ds_checkpoint_open(FIX "/target-q4g32", &ck));
    ds_safetensors *st = ck->shards[0];
    variant_fill v = {.ck = ck, .specs = calloc(st->n_tensors, sizeof *v.specs), .src = calloc(st->n_tensors, sizeof *v.src)};
    size_t n = 0;
    for (size_t i = 0; i < st->n_tensors; i++) {
        const ds_st_tensor *t = &st->tensors[i];
        if (drop && !strcmp(t->name, drop)) continue;
        ds_st_spec *s = &v.specs[n];
        s->name = t->name;
        s->dtype = t->dtype;
        s->ndim = t->ndim;
        memcpy(s->shape, t->shape, sizeof s->shape);
        if (reshape && !strcmp(t->name, reshape)) s->shape[0] = r, s->shape[1] = c;
        v.src[n++] = t;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ds_error *e = ds_safetensors_write(path, v.specs, n, 0, fill_variant, &v);
    cJSON *cfg = cJSON_Duplicate(ck->config, 1);
    cJSON *patch = cJSON_Parse(cfg_patch ? cfg_patch : "{}");
    for (cJSON *it = patch ? patch->child : NULL; it; it = it->next) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, it->string);
        if (!cJSON_IsNull(it)) cJSON_AddItemToObject(cfg, it->string, cJSON_Duplicate(it, 1));
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_json_file(path, cfg);
    cJSON_Delete(cfg);
    cJSON_Delete(patch);
    free(v.specs);
    free(v.src);
    ds_checkpoint_close(ck);
    ds_target *t = NULL;
    if (!e) e = ds_target_open(be, dir, NULL, &t);
    if (t) ds_target_free(t);
    remove_model_dir(strdup(dir));
    return e ? e : ds_errorf("(opened without error)");
}

static void test_bad_checkpoints(void) {
    CHECK_ERR(open_variant("{\"quantization\": {\"group_size\": 32, \"bits\": 3}, \"quantization_config\": null}", NULL,
                           NULL, 0, 0),
              "quantization.bits 3 is not supported (4 or 8)");
    CHECK_ERR(open_variant("{\"quantization\": {\"group_size\": 48, \"bits\": 4}}", NULL, NULL, 0, 0),
              "quantization.group_size 48 is not supported");
    CHECK_ERR(open_variant("{\"quantization\": {\"group_size\": 32, \"bits\": 4, \"mode\": \"mxfp4\"}}", NULL, NULL, 0, 0),
              "quantization.mode \"mxfp4\" is not supported");
    CHECK_ERR(open_variant("{\"quantization\": null, \"quantization_config\": null}", NULL, NULL, 0, 0),
              "config.json's quantization block is missing");
    CHECK_ERR(open_variant("{\"quantization\": {\"group_size\": 32, \"bits\": 4, \"model.layers.1.mlp.down_proj\": "
                           "{\"group_size\": 64, \"bits\": 4}}}",
                           NULL, NULL, 0, 0),
              "model.layers.1.mlp.down_proj.weight: group_size 64 does not divide the input dimension 160");
    CHECK_ERR(open_variant("{\"quantization\": {\"group_size\": 32, \"bits\": 4, \"model.layers.2.self_attn.k_proj\": false}}",
                           NULL, NULL, 0, 0),
              "model.layers.2.self_attn.k_proj.weight has scales and biases but config.json's quantization leaves it");
    CHECK_ERR(open_variant(NULL, "model.layers.0.self_attn.q_proj.biases", NULL, 0, 0),
              "missing tensor model.layers.0.self_attn.q_proj.biases");
    CHECK_ERR(open_variant(NULL, "model.layers.3.mlp.up_proj.scales", NULL, 0, 0),
              "missing tensor model.layers.3.mlp.up_proj.scales");
    CHECK_ERR(open_variant(NULL, NULL, "model.layers.1.mlp.up_proj.scales", 160, 1),
              "model.layers.1.mlp.up_proj.scales has shape [160, 1], expected [160, 2]");
    CHECK_ERR(open_variant(NULL, NULL, "model.layers.1.mlp.gate_proj.weight", 160, 16),
              "model.layers.1.mlp.gate_proj.weight has shape [160, 16], expected [160, 8]");
    /* 8-bit words read as 4-bit: the packed width no longer matches. */
    CHECK_ERR(open_variant("{\"quantization\": {\"group_size\": 32, \"bits\": 8}}", NULL, NULL, 0, 0), "expected [");
}

/* A directory made of base_dir's tensors, with `n` of them taken from other
 * checkpoints (from NULL: dropped; a name base_dir lacks: added) and its
 * config.json patched (top-level keys replaced, null deletes). */
typedef struct {
    const char *name, *from;
} mix_part;

static ds_error *fill_mix(void *user, size_t i, size_t off, void *buf, size_t nb) {
    const ds_st_tensor **src = user;
    memcpy(buf, (const char *)src[i]->data + off, nb);
    return NULL;
}

static ds_error *write_mix(const char *dir, const char *base_dir, const char *patch_json, const mix_part *parts, int n) {
    ds_checkpoint *base, *from[8] = {0};
    DS_TRY(ds_checkpoint_open(base_dir, &base));
    ds_error *e = NULL;
    for (int i = 0; i < n && !e; i++)
        if (parts[i].from) e = ds_checkpoint_open(parts[i].from, &from[i]);
    const ds_safetensors *st = base->shards[0];
    const size_t cap = st->n_tensors + (size_t)n;
    ds_st_spec *specs = calloc(cap, sizeof *specs);
    const ds_st_tensor **src = calloc(cap, sizeof *src);
    size_t m = 0;
    for (size_t i = 0; i < st->n_tensors + (size_t)n && !e; i++) {
        const ds_st_tensor *t = i < st->n_tensors ? &st->tensors[i] : NULL;
        const char *name = t ? t->name : parts[i - st->n_tensors].name;
        int k = -1;
        for (int j = 0; j < n; j++)
            if (!strcmp(parts[j].name, name)) k = j;
        if (!t && ds_checkpoint_find(base, name)) continue; /* replaced in place already */
        if (k >= 0) t = parts[k].from ? ds_checkpoint_find(from[k], name) : NULL;
        if (!t) continue;
        specs[m] = (ds_st_spec){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        memcpy(specs[m].shape, t->shape, sizeof specs[m].shape);
        src[m++] = t;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!e) e = ds_safetensors_write(path, specs, m, 0, fill_mix, src);
    cJSON *cfg = cJSON_Duplicate(base->config, 1), *patch = cJSON_Parse(patch_json ? patch_json : "{}");
    for (cJSON *it = patch ? patch->child : NULL; it; it = it->next) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, it->string);
        if (!cJSON_IsNull(it)) cJSON_AddItemToObject(cfg, it->string, cJSON_Duplicate(it, 1));
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_json_file(path, cfg);
    cJSON_Delete(cfg);
    cJSON_Delete(patch);
    free(specs);
    free(src);
    for (int i = 0; i < n; i++)
        if (from[i]) ds_checkpoint_close(from[i]);
    ds_checkpoint_close(base);
    return e;
}

/* mlx-lm's mixed recipes: a per-module override ({group_size, bits}) and a
 * module left unquantized (false) beside the global layout. The mixed model's
 * logits equal, to the bit, those of the fp32 model holding each module's
 * dequantized (or plain) values, assembled from the dequantized copies. */
static void test_mixed_overrides(void) {
    char qdir[] = "/tmp/ds_quant_mix_XXXXXX", ddir[] = "/tmp/ds_quant_mixd_XXXXXX";
    if (!mkdtemp(qdir) || !mkdtemp(ddir)) {
        CHECK(false, "mkdtemp");
        return;
    }
    const char *q4 = FIX "/target-q4g32", *q8 = FIX "/target-q8g64", *plain = SRC "/target";
    const char *g = "model.layers.1.mlp.gate_proj", *v = "model.layers.2.self_attn.v_proj";
    char gw[96], gs[96], gb[96], vw[96], vs[96], vb[96];
    snprintf(gw, sizeof gw, "%s.weight", g);
    snprintf(gs, sizeof gs, "%s.scales", g);
    snprintf(gb, sizeof gb, "%s.biases", g);
    snprintf(vw, sizeof vw, "%s.weight", v);
    snprintf(vs, sizeof vs, "%s.scales", v);
    snprintf(vb, sizeof vb, "%s.biases", v);
    const mix_part qparts[] = {{gw, q8}, {gs, q8}, {gb, q8}, {vw, plain}, {vs, NULL}, {vb, NULL}};
    char patch[512];
    snprintf(patch, sizeof patch,
             "{\"quantization\": {\"group_size\": 32, \"bits\": 4, \"%s\": {\"group_size\": 64, \"bits\": 8}, "
             "\"%s\": false}, \"quantization_config\": null}",
             g, v);
    CHECK_OK(write_mix(qdir, q4, patch, qparts, 6));
    const mix_part dparts[] = {{gw, dense[1]}, {vw, plain}};
    CHECK_OK(write_mix(ddir, dense[0], NULL, dparts, 2));
    ds_safetensors *gold = golden_open(FIX "/golden.safetensors");
    size_t T;
    int32_t *ids = gold ? golden_i32(gold, "prompt_ids", &T) : NULL;
    if (ids) {
        float *a = prompt_logits(qdir, ids, (int)T), *b = prompt_logits(ddir, ids, (int)T);
        CHECK(a && b && !memcmp(a, b, (size_t)T * 512 * sizeof *a),
              "mixed q4 / q8 / plain: logits differ from the assembled dequantized model's");
        free(a);
        free(b);
    }
    free(ids);
    if (gold) golden_close(gold);
    remove_model_dir(strdup(qdir));
    remove_model_dir(strdup(ddir));
}

static void setup(void) {
    CHECK_OK(test_backend_new(&be));
    if (!mkdtemp(tmp_root)) {
        CHECK(false, "mkdtemp");
        return;
    }
    const char *src[3] = {FIX "/target-q4g32", FIX "/target-q8g64", G4 "/target-q4g32"};
    const char *fnv[3] = {FIX "/dequant_fnv.json", FIX "/dequant_fnv.json", G4 "/dequant_fnv.json"};
    const char *var[3] = {"target-q4g32", "target-q8g64", "target-q4g32"};
    for (int i = 0; i < 3; i++) {
        snprintf(dense[i], sizeof dense[i], "%s/dense%d", tmp_root, i);
        CHECK_OK(make_dense(src[i], dense[i], fnv[i], var[i]));
    }
}
static void teardown(void) {
    for (int i = 0; i < 3; i++) remove_model_dir(strdup(dense[i]));
    rmdir(tmp_root);
    be->ops->destroy(be);
}

RUN_TESTS("quant", setup, test_logits, test_row_invariance, test_drafted_equals_ar, test_gemma4, test_mixed_overrides, test_quantize_cli,
          test_bad_checkpoints, teardown)
