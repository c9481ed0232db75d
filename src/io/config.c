#include "io/config.h"

#include <math.h>
#include <stdlib.h>

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

const char *ds_cfg_str(const cJSON *cfg, const char *field) {
    const cJSON *v = get(cfg, field);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
