#include "io/json_file.h"
#include "io/checkpoint.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The line of text that contains byte `at`, for a parse error a person can find. */
static int line_of(const char *text, const char *at) {
    int line = 1;
    for (const char *p = text; p < at && *p; p++) line += *p == '\n';
    return line;
}

ds_error *ds_json_file_read(const char *path, size_t max_bytes, cJSON **out) {
    *out = NULL;
    char *buf;
    size_t n;
    DS_TRY(ds_read_file_max(path, max_bytes, &buf, &n));
    ds_error *e = NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, n, &end, false);
    const char *rest = j && end ? end : NULL;
    while (rest && rest < buf + n && (*rest == ' ' || *rest == '\t' || *rest == '\n' || *rest == '\r')) rest++;
    if (j && rest != buf + n) { /* only whitespace may follow the value */
        cJSON_Delete(j);
        j = NULL;
    }
    if (!j) e = ds_errorf("%s: not JSON (parsing stopped at line %d)", path, line_of(buf, end ? end : buf));
    free(buf);
    *out = j;
    return e;
}

ds_error *ds_json_file_write(const char *path, const cJSON *j) {
    char *text = cJSON_Print(j);
    if (!text) return ds_errorf("%s: out of memory printing JSON", path);
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) {
        free(text);
        return ds_errorf("%s: out of memory", path);
    }
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    ds_error *e = NULL;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        e = ds_errorf("cannot write %s: %s", tmp, strerror(errno));
    } else {
        size_t len = strlen(text);
        bool ok = fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF;
        if (fclose(f) != 0) ok = false;
        if (!ok) e = ds_errorf("cannot write %s: %s", tmp, strerror(errno));
        else if (rename(tmp, path) != 0) e = ds_errorf("cannot rename %s to %s: %s", tmp, path, strerror(errno));
        if (e) unlink(tmp);
    }
    free(tmp);
    free(text);
    return e;
}
