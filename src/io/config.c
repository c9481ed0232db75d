#include "io/config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const cJSON *get(const cJSON *cfg, const char *field) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, field);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static ds_error *as_int(const cJSON *v, const char *where, const char *field, int64_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 9e15)
        return ds_errorf("%s: config field %s is not an integer", where, field);
    *out = (int64_t)v->valuedouble;
    return NULL;
}

ds_error *ds_cfg_int(const cJSON *cfg, const char *where, const char *field, int64_t *out) {
    const cJSON *v = get(cfg, field);
    if (!v) return ds_errorf("%s: config is missing field %s", where, field);
    return as_int(v, where, field, out);
}

ds_error *ds_cfg_float(const cJSON *cfg, const char *where, const char *field, double *out) {
    const cJSON *v = get(cfg, field);
    if (!v) return ds_errorf("%s: config is missing field %s", where, field);
    if (!cJSON_IsNumber(v)) return ds_errorf("%s: config field %s is not a number", where, field);
    *out = v->valuedouble;
    return NULL;
}

ds_error *ds_cfg_int_or(const cJSON *cfg, const char *where, const char *field, int64_t def, int64_t *out) {
    const cJSON *v = get(cfg, field);
    if (!v) {
        *out = def;
        return NULL;
    }
    return as_int(v, where, field, out);
}

ds_error *ds_cfg_float_or(const cJSON *cfg, const char *where, const char *field, double def, double *out) {
    const cJSON *v = get(cfg, field);
    if (!v) {
        *out = def;
        return NULL;
    }
    if (!cJSON_IsNumber(v)) return ds_errorf("%s: config field %s is not a number", where, field);
    *out = v->valuedouble;
    return NULL;
}

ds_error *ds_cfg_bool_or(const cJSON *cfg, const char *where, const char *field, bool def, bool *out) {
    const cJSON *v = get(cfg, field);
    if (!v) {
        *out = def;
        return NULL;
    }
    if (!cJSON_IsBool(v)) return ds_errorf("%s: config field %s is not true/false", where, field);
    *out = cJSON_IsTrue(v);
    return NULL;
}

ds_error *ds_cfg_int_list(const cJSON *cfg, const char *where, const char *field, int64_t **out, int *n) {
    const cJSON *v = get(cfg, field);
    *out = NULL;
    *n = 0;
    if (!v) return NULL;
    int count = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 1;
    int64_t *vals = malloc((size_t)(count ? count : 1) * sizeof *vals);
    if (!vals) return ds_errorf("out of memory");
    for (int i = 0; i < count; i++) {
        ds_error *e = as_int(cJSON_IsArray(v) ? cJSON_GetArrayItem(v, i) : v, where, field, &vals[i]);
        if (e) {
            free(vals);
            return e;
        }
    }
    *out = vals;
    *n = count;
    return NULL;
}

/* Generous bounds, far above any released model (the largest have ~160
 * layers, 262k vocabularies, 32k hidden, 10M positions), but low enough that
 * the per-layer arrays and caches sized from them are allocations, not
 * a bare "out of memory" (or a sanitizer abort) long after the config. */
static const struct {
    const char *field;
    double max;
} size_limits[] = {
    {"num_hidden_layers", 1024},          {"vocab_size", 1 << 24},
    {"hidden_size", 1 << 17},             {"intermediate_size", 1 << 20},
    {"num_attention_heads", 4096},        {"num_key_value_heads", 4096},
    {"head_dim", 4096},                   {"global_head_dim", 4096},
    {"max_position_embeddings", 1 << 24}, {"block_size", 1024},
};

ds_error *ds_cfg_check_sizes(const cJSON *cfg, const char *where) {
    for (const cJSON *it = cfg ? cfg->child : NULL; it; it = it->next) {
        if (cJSON_IsObject(it)) { /* text_config, vision_config, ... */
            DS_TRY(ds_cfg_check_sizes(it, where));
            continue;
        }
        if (!it->string || !cJSON_IsNumber(it)) continue; /* a mistyped size is the model reader's to name */
        for (size_t i = 0; i < sizeof size_limits / sizeof size_limits[0]; i++)
            if (!strcmp(it->string, size_limits[i].field) && !(fabs(it->valuedouble) <= size_limits[i].max))
                return ds_errorf("%s: config field %s = %.17g is out of range (at most %.0f)", where, it->string,
                                 it->valuedouble, size_limits[i].max);
    }
    return NULL;
}

const char *ds_cfg_str(const cJSON *cfg, const char *field) {
    const cJSON *v = get(cfg, field);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
