#include "io/json_file.h"

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
    FILE *f = fopen(path, "rb");
    if (!f) return ds_errorf("cannot open %s: %s", path, strerror(errno));
    struct stat st;
    ds_error *e = NULL;
    char *buf = NULL;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        e = ds_errorf("cannot read %s: not a regular file", path);
    } else if ((unsigned long long)st.st_size > max_bytes) {
        e = ds_errorf("%s: %lld bytes, more than the %zu this file may have", path, (long long)st.st_size,
                      max_bytes);
    } else if (!(buf = malloc((size_t)st.st_size + 1))) {
        e = ds_errorf("cannot read %s: out of memory", path);
    } else if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        e = ds_errorf("cannot read %s: %s", path, ferror(f) ? strerror(errno) : "file shrank while reading");
    }
    fclose(f);
    if (e) {
        free(buf);
        return e;
    }
    buf[st.st_size] = 0;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, (size_t)st.st_size, &end, false);
    const char *rest = j && end ? end : NULL;
    while (rest && rest < buf + st.st_size && (*rest == ' ' || *rest == '\t' || *rest == '\n' || *rest == '\r')) rest++;
    if (j && rest != buf + st.st_size) { /* only whitespace may follow the value */
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
