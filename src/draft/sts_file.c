#include "draft/sts_file.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/checkpoint.h"

bool ds_sts_path(const char *dir, char *buf, int size) {
    const int n = snprintf(buf, (size_t)size, "%s/%s", dir, DS_STS_FILE_NAME);
    return n >= 0 && n < size;
}

static ds_error *parse(const char *path, const cJSON *j, ds_sts *out) {
    if (!cJSON_IsObject(j)) return ds_errorf("%s: not a JSON object", path);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (!cJSON_IsString(f) || strcmp(f->valuestring, DS_STS_FORMAT))
        return ds_errorf("%s: field \"format\" must be \"%s\"", path, DS_STS_FORMAT);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "version");
    if (!cJSON_IsNumber(v) || v->valuedouble != 1)
        return ds_errorf("%s: field \"version\" must be 1 (the only version there is)", path);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "temperatures");
    if (!cJSON_IsArray(t)) return ds_errorf("%s: field \"temperatures\" is missing or not an array", path);
    const int n = cJSON_GetArraySize(t);
    if (n < 1 || n > DS_STS_MAX)
        return ds_errorf("%s: field \"temperatures\" has %d entries (1 .. %d)", path, n, DS_STS_MAX);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "block_size");
    if (!cJSON_IsNumber(b) || b->valuedouble != n)
        return ds_errorf("%s: field \"block_size\" must be the number of temperatures, %d", path, n);
    out->n = n;
    int k = 0;
    for (const cJSON *it = t->child; it; it = it->next, k++) {
        const float s = cJSON_IsNumber(it) ? (float)it->valuedouble : NAN;
        if (!(s > 0 && isfinite(s)))
            return ds_errorf("%s: temperatures[%d] must be a finite number > 0 (as fp32)", path, k);
        out->temp[k] = s;
    }
    return NULL;
}

ds_error *ds_sts_read(const char *path, ds_sts *out) {
    memset(out, 0, sizeof *out);
    cJSON *j;
    DS_TRY(ds_read_json(path, &j));
    ds_error *e = parse(path, j, out);
    cJSON_Delete(j);
    if (e) memset(out, 0, sizeof *out);
    return e;
}

ds_error *ds_sts_write(const char *path, const ds_sts *sts, cJSON *extra) {
    if (sts->n < 1 || sts->n > DS_STS_MAX) {
        cJSON_Delete(extra);
        return ds_errorf("%s: %d temperatures (1 .. %d)", path, sts->n, DS_STS_MAX);
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", DS_STS_FORMAT);
    cJSON_AddNumberToObject(j, "version", 1);
    cJSON_AddStringToObject(j, "definition",
                            "position k's calibrated confidence is sigmoid(z_k / s_k) in fp32, z_k the confidence "
                            "head's logit and s_k = temperatures[k]");
    cJSON_AddNumberToObject(j, "block_size", sts->n);
    cJSON *t = cJSON_AddArrayToObject(j, "temperatures");
    for (int k = 0; k < sts->n; k++) cJSON_AddItemToArray(t, cJSON_CreateNumber(sts->temp[k]));
    for (cJSON *it = extra ? extra->child : NULL; it; it = it->next)
        if (!cJSON_GetObjectItemCaseSensitive(j, it->string))
            cJSON_AddItemToObject(j, it->string, cJSON_Duplicate(it, 1));
    cJSON_Delete(extra);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return ds_errorf("out of memory");
    /* Through a temporary file and a rename: a generation starting meanwhile
     * reads the old file or the new one, never half of one. */
    char tmp[4096];
    ds_error *e = NULL;
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        e = ds_errorf("%s: path too long", path);
    } else {
        FILE *f = fopen(tmp, "w");
        if (!f) e = ds_errorf("%s: cannot open for writing", tmp);
        else {
            const size_t len = strlen(text);
            if (fwrite(text, 1, len, f) != len || fputc('\n', f) == EOF) e = ds_errorf("%s: write failed", tmp);
            if (fclose(f) && !e) e = ds_errorf("%s: write failed", tmp);
            if (!e && rename(tmp, path)) e = ds_errorf("%s: cannot rename %s to it", path, tmp);
            if (e) remove(tmp);
        }
    }
    free(text);
    return e;
}
