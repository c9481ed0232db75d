/* The table of target architectures: which (model_type, architectures[0])
 * of config.json opens which constructor. It sits above the architectures
 * (each depends on target.c's shared parts), so adding one is a row here. */
#include <stdlib.h>
#include <string.h>

#include "io/config.h"
#include "model/gemma4.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"
#include "model/target.h"

typedef ds_error *(*arch_open_fn)(ds_backend *be, ds_checkpoint *ck, const ds_target_opts *opts, ds_target **out);
/* Bytes a cached position takes in the caches the constructor would allocate (as a pool of pages). */
typedef ds_error *(*arch_kv_fn)(const cJSON *cfg, const char *where, int64_t *out, int *max_ctx);

/* A config matches a row when model_type is the row's and architectures[0]
 * is the row's or absent. */
static const struct {
    const char *model_type, *architecture;
    arch_open_fn open;
    arch_kv_fn kv_row_bytes;
} archs[] = {
    {"qwen3", "Qwen3ForCausalLM", ds_qwen3_open, ds_qwen3_kv_row_bytes_of},
    {"gemma4_text", "Gemma4ForCausalLM", ds_gemma4_open, ds_gemma4_kv_row_bytes_of},
    {"gemma4_text", "Gemma4ForConditionalGeneration", ds_gemma4_open, ds_gemma4_kv_row_bytes_of},
    {"gemma4", "Gemma4ForCausalLM", ds_gemma4_open, ds_gemma4_kv_row_bytes_of},
    {"gemma4", "Gemma4ForConditionalGeneration", ds_gemma4_open, ds_gemma4_kv_row_bytes_of},
    /* google/gemma-4-12B: Gemma 4's text model in its own wrapper (gemma4_layout.h). */
    {"gemma4_unified", "Gemma4UnifiedForConditionalGeneration", ds_gemma4_open, ds_gemma4_kv_row_bytes_of},
    {"gemma4_unified_text", "Gemma4UnifiedForCausalLM", ds_gemma4_open, ds_gemma4_kv_row_bytes_of},
};
enum { N_ARCHS = sizeof archs / sizeof archs[0] };

/* The row of archs that config (dir's config.json) opens, or N_ARCHS with *err set. */
static size_t find_arch(const cJSON *config, const char *dir, ds_error **err) {
    const char *mt = ds_cfg_str(config, "model_type");
    const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(config, "architectures"), 0);
    const char *an = cJSON_IsString(arch) ? arch->valuestring : NULL;
    for (size_t i = 0; mt && i < N_ARCHS; i++)
        if (!strcmp(mt, archs[i].model_type) && (!an || !strcmp(an, archs[i].architecture))) return i;
    *err = ds_errorf("%s: unsupported architecture (model_type \"%s\", architectures[0] \"%s\"); supported: "
                     "Qwen3ForCausalLM (qwen3), Gemma4ForCausalLM (gemma4_text), Gemma4ForConditionalGeneration "
                     "(gemma4), Gemma4UnifiedForConditionalGeneration (gemma4_unified), Gemma4UnifiedForCausalLM "
                     "(gemma4_unified_text)",
                     dir, mt ? mt : "(none)", an ? an : "(none)");
    return N_ARCHS;
}

ds_error *ds_target_kv_row_bytes(const char *dir, int64_t *out) {
    int max_ctx;
    return ds_target_kv_shape(dir, out, &max_ctx);
}

ds_error *ds_target_kv_shape(const char *dir, int64_t *out, int *max_ctx) {
    *out = 0;
    *max_ctx = 0;
    char *path = ds_path_join(dir, "config.json");
    if (!path) return ds_errorf("out of memory");
    cJSON *cfg;
    ds_error *e = ds_read_json(path, &cfg);
    free(path);
    DS_TRY(e);
    const size_t i = find_arch(cfg, dir, &e);
    if (i < N_ARCHS) e = archs[i].kv_row_bytes(cfg, dir, out, max_ctx);
    cJSON_Delete(cfg);
    if (!e && *out > DS_KV_ROW_BYTES_MAX)
        e = ds_errorf("%s/config.json: its layers' K/V would take over %lld bytes a position (no real model does)", dir,
                      (long long)DS_KV_ROW_BYTES_MAX);
    return e;
}

ds_error *ds_target_open(ds_backend *be, const char *dir, const ds_target_opts *opts, ds_target **out) {
    *out = NULL;
    ds_checkpoint *ck;
    DS_TRY(ds_checkpoint_open(dir, &ck));
    ds_error *e = NULL;
    const size_t i = find_arch(ck->config, dir, &e);
    ds_target *t = NULL;
    if (i < N_ARCHS) e = archs[i].open(be, ck, opts, &t);
    if (e) {
        ds_checkpoint_close(ck);
        return e;
    }
    e = ds_target_open_finish(t);
    if (e) {
        ds_target_free(t);
        return e;
    }
    *out = t;
    return NULL;
}
