/* The table of target architectures: which (model_type, architectures[0])
 * of config.json opens which constructor. It sits above the architectures
 * (each depends on target.c's shared parts), so adding one is a row here. */
#include <string.h>

#include "io/config.h"
#include "model/gemma4.h"
#include "model/qwen3.h"
#include "model/target.h"

typedef ds_error *(*arch_open_fn)(ds_backend *be, ds_checkpoint *ck, const ds_target_opts *opts, ds_target **out);

/* A config matches a row when model_type is the row's and architectures[0]
 * is the row's or absent. */
static const struct {
    const char *model_type, *architecture;
    arch_open_fn open;
} archs[] = {
    {"qwen3", "Qwen3ForCausalLM", ds_qwen3_open},
    {"gemma4_text", "Gemma4ForCausalLM", ds_gemma4_open},
    {"gemma4_text", "Gemma4ForConditionalGeneration", ds_gemma4_open},
    {"gemma4", "Gemma4ForCausalLM", ds_gemma4_open},
    {"gemma4", "Gemma4ForConditionalGeneration", ds_gemma4_open},
    /* google/gemma-4-12B: Gemma 4's text model in its own wrapper (gemma4_layout.h). */
    {"gemma4_unified", "Gemma4UnifiedForConditionalGeneration", ds_gemma4_open},
    {"gemma4_unified_text", "Gemma4UnifiedForCausalLM", ds_gemma4_open},
};

ds_error *ds_target_open(ds_backend *be, const char *dir, const ds_target_opts *opts, ds_target **out) {
    *out = NULL;
    ds_checkpoint *ck;
    DS_TRY(ds_checkpoint_open(dir, &ck));
    const char *mt = ds_cfg_str(ck->config, "model_type");
    const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ck->config, "architectures"), 0);
    const char *an = cJSON_IsString(arch) ? arch->valuestring : NULL;
    arch_open_fn ctor = NULL;
    for (size_t i = 0; mt && !ctor && i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(mt, archs[i].model_type) && (!an || !strcmp(an, archs[i].architecture))) ctor = archs[i].open;
    ds_target *t = NULL;
    ds_error *e;
    if (ctor) {
        e = ctor(be, ck, opts, &t);
    } else {
        e = ds_errorf("%s: unsupported architecture (model_type \"%s\", architectures[0] \"%s\"); supported: "
                      "Qwen3ForCausalLM (qwen3), Gemma4ForCausalLM (gemma4_text), Gemma4ForConditionalGeneration "
                      "(gemma4), Gemma4UnifiedForConditionalGeneration (gemma4_unified), Gemma4UnifiedForCausalLM "
                      "(gemma4_unified_text)",
                      dir, mt ? mt : "(none)", an ? an : "(none)");
    }
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
