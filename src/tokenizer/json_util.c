#include "tokenizer/json_util.h"

#include <math.h>

#include "base/error.h"

const cJSON *ds_json_get(const cJSON *o, const char *key) {
    if (!cJSON_IsObject(o)) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNull(v) ? NULL : v;
}

const char *ds_json_kind(const cJSON *v) {
    if (!v) return "missing";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "invalid";
}

ds_error *ds_json_str_opt(const cJSON *o, const char *key, const char *where, const char **out) {
    const cJSON *v = ds_json_get(o, key);
    *out = NULL;
    if (!v) return NULL;
    if (!cJSON_IsString(v)) return ds_errorf("%s.%s should be a string, is %s", where, key, ds_json_kind(v));
    *out = v->valuestring;
    return NULL;
}

ds_error *ds_json_str(const cJSON *o, const char *key, const char *where, const char **out) {
    DS_TRY(ds_json_str_opt(o, key, where, out));
    if (!*out) return ds_errorf("%s.%s is missing", where, key);
    return NULL;
}

ds_error *ds_json_bool(const cJSON *o, const char *key, const char *where, bool dflt, bool *out) {
    const cJSON *v = ds_json_get(o, key);
    *out = dflt;
    if (!v) return NULL;
    if (!cJSON_IsBool(v)) return ds_errorf("%s.%s should be true or false, is %s", where, key, ds_json_kind(v));
    *out = cJSON_IsTrue(v);
    return NULL;
}

ds_error *ds_json_as_uint(const cJSON *v, const char *where, long long max, long long *out) {
    if (!cJSON_IsNumber(v)) return ds_errorf("%s should be a number, is %s", where, ds_json_kind(v));
    double d = v->valuedouble;
    if (!(d >= 0) || d > (double)max || d != floor(d))
        return ds_errorf("%s = %g is not an integer in [0, %lld]", where, d, max);
    *out = (long long)d;
    return NULL;
}

ds_error *ds_json_uint(const cJSON *o, const char *key, const char *where, long long dflt, long long *out) {
    const cJSON *v = ds_json_get(o, key);
    *out = dflt;
    if (!v) return NULL;
    if (!cJSON_IsNumber(v)) return ds_errorf("%s.%s should be a number, is %s", where, key, ds_json_kind(v));
    double d = v->valuedouble;
    if (!(d >= 0) || d > 1e15 || d != floor(d))
        return ds_errorf("%s.%s = %g is not a non-negative integer", where, key, d);
    *out = (long long)d;
    return NULL;
}
