/* The table of drafter architectures: which architectures[0] opens which
 * constructor, and the target family it serves. It sits above the
 * architectures (each depends on drafter.c's shared parts), so adding one is
 * a row here. */
#include <string.h>

#include "draft/drafter.h"
#include "draft/drafter_batch.h"
#include "draft/dspark_gemma4.h"
#include "draft/dspark_qwen3.h"

/* A drafter reads the target's taps and copies its embeddings and head: it
 * only serves the family it was trained on (target_type, named in errors as
 * family). */
static const struct {
    const char *architecture, *target_type, *family;
    ds_error *(*open)(ds_backend *be, ds_checkpoint *ck, const ds_target *target, const ds_drafter_opts *opts,
                      ds_drafter **out);
} archs[] = {
    {"Qwen3DSparkModel", "qwen3", "a qwen3", ds_dspark_qwen3_open},
    {"Gemma4DSparkModel", "gemma4_text", "a Gemma 4", ds_dspark_gemma4_open},
};

ds_error *ds_drafter_open(ds_backend *be, const char *dir, const ds_target *target, const ds_drafter_opts *opts,
                          ds_drafter **out) {
    *out = NULL;
    ds_checkpoint *ck;
    DS_TRY(ds_checkpoint_open(dir, &ck));
    const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ck->config, "architectures"), 0);
    const char *an = cJSON_IsString(arch) ? arch->valuestring : "(none)";
    ds_error *e = NULL;
    size_t i = 0;
    while (i < sizeof archs / sizeof archs[0] && strcmp(an, archs[i].architecture)) i++;
    if (i == sizeof archs / sizeof archs[0])
        e = ds_errorf("%s: unsupported drafter architecture \"%s\" (supported: Qwen3DSparkModel, Gemma4DSparkModel)",
                      dir, an);
    else if (strcmp(target->model_type, archs[i].target_type))
        e = ds_errorf("%s: a %s drafter cannot serve a %s target (it needs %s target)", dir, an, target->model_type,
                      archs[i].family);
    else e = archs[i].open(be, ck, target, opts, out);
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
