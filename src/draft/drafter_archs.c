/* The table of drafter architectures: which architectures[0] opens which
 * constructor, and the target family it serves. It sits above the
 * architectures (each depends on drafter.c's shared parts), so adding one is
 * a row here. */
#include <stdlib.h>
#include <string.h>

#include "draft/drafter.h"
#include "draft/drafter_batch.h"
#include "draft/dspark_gemma4.h"
#include "draft/dspark_qwen3.h"
#include "model/kv_cache.h"

/* A drafter reads the target's taps and copies its embeddings and head: it
 * only serves the family it was trained on (target_type, named in errors as
 * family). */
static const struct {
    const char *architecture, *target_type, *family;
    ds_error *(*open)(ds_backend *be, ds_checkpoint *ck, const ds_target *target, const ds_drafter_opts *opts,
                      ds_drafter **out);
    ds_error *(*kv_row_bytes)(const cJSON *cfg, const char *where, int64_t *out);
} archs[] = {
    {"Qwen3DSparkModel", "qwen3", "a qwen3", ds_dspark_qwen3_open, ds_dspark_qwen3_kv_row_bytes},
    {"Gemma4DSparkModel", "gemma4_text", "a Gemma 4", ds_dspark_gemma4_open, ds_dspark_gemma4_kv_row_bytes},
};
enum { N_ARCHS = sizeof archs / sizeof archs[0] };

/* The row of archs that config (dir's config.json) names, or N_ARCHS with *err set. */
static size_t find_arch(const cJSON *config, const char *dir, ds_error **err) {
    const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(config, "architectures"), 0);
    const char *an = cJSON_IsString(arch) ? arch->valuestring : "(none)";
    for (size_t i = 0; i < N_ARCHS; i++)
        if (!strcmp(an, archs[i].architecture)) return i;
    *err = ds_errorf("%s: unsupported drafter architecture \"%s\" (supported: Qwen3DSparkModel, Gemma4DSparkModel)",
                     dir, an);
    return N_ARCHS;
}

ds_error *ds_drafter_kv_row_bytes(const char *dir, int64_t *out) {
    *out = 0;
    char *path = ds_path_join(dir, "config.json");
    if (!path) return ds_errorf("out of memory");
    cJSON *cfg;
    ds_error *e = ds_read_json(path, &cfg);
    free(path);
    DS_TRY(e);
    const size_t i = find_arch(cfg, dir, &e);
    if (i < N_ARCHS) e = archs[i].kv_row_bytes(cfg, dir, out);
    cJSON_Delete(cfg);
    if (!e && *out > DS_KV_ROW_BYTES_MAX)
        e = ds_errorf("%s/config.json: its layers' K/V would take over %lld bytes a position (no real model does)", dir,
                      (long long)DS_KV_ROW_BYTES_MAX);
    return e;
}

ds_error *ds_drafter_open(ds_backend *be, const char *dir, const ds_target *target, const ds_drafter_opts *opts,
                          ds_drafter **out) {
    *out = NULL;
    ds_checkpoint *ck;
    DS_TRY(ds_checkpoint_open(dir, &ck));
    ds_error *e = NULL;
    const size_t i = find_arch(ck->config, dir, &e);
    if (i < N_ARCHS && strcmp(target->model_type, archs[i].target_type))
        e = ds_errorf("%s: a %s drafter cannot serve a %s target (it needs %s target)", dir, archs[i].architecture,
                      target->model_type, archs[i].family);
    else if (i < N_ARCHS) e = archs[i].open(be, ck, target, opts, out);
    if (e) {
        ds_checkpoint_close(ck);
        return e;
    }
    (*out)->max_seqs = 1;
    if (opts && opts->max_seqs > 1 && (e = ds_drafter_reserve_seqs(*out, opts->max_seqs))) {
        ds_drafter_free(*out);
        *out = NULL;
    }
    return e;
}
