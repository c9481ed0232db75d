/* The K/V caches' dtype from config.json (the rule: kv_cache.h). */
#include "model/kv_cache.h"

#include <string.h>

/* The dtype field cfg holds ("dtype" first: transformers >= 4.56 writes it
 * and reads "torch_dtype" as its old name), its name in *field; NULL when
 * neither is there (or null). */
static const cJSON *dtype_field(const cJSON *cfg, const char **field) {
    static const char *const names[] = {"dtype", "torch_dtype"};
    for (int i = 0; cfg && i < 2; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(cfg, names[i]);
        if (f && !cJSON_IsNull(f)) {
            *field = names[i];
            return f;
        }
    }
    return NULL;
}

ds_error *ds_kv_dtype_read(const cJSON *cfg, const cJSON *inner, const char *where, ds_dtype *out) {
    *out = DS_F32;
    const char *field = NULL;
    const cJSON *f = dtype_field(cfg, &field);
    if (!f && inner != cfg) f = dtype_field(inner, &field);
    if (!f) return NULL; /* transformers' default */
    static const struct {
        const char *name;
        ds_dtype dtype;
    } known[] = {{"float32", DS_F32}, {"bfloat16", DS_BF16}, {"float16", DS_F16}};
    for (size_t i = 0; cJSON_IsString(f) && i < sizeof known / sizeof *known; i++)
        if (!strcmp(f->valuestring, known[i].name)) {
            *out = ds_kv_dtype(known[i].dtype);
            return NULL;
        }
    return ds_errorf("%s: config field %s = %s is not supported (float32, bfloat16 or float16)", where, field,
                     cJSON_IsString(f) ? f->valuestring : "(not a string)");
}
