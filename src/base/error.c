#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ds_error {
    char *msg;
};

static char *vformat(const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) n = 0;
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

/* Returned when even the error cannot be allocated; never freed. */
static ds_error oom_error = {"out of memory while reporting an error"};

ds_error *ds_errorf(const char *fmt, ...) {
    ds_error *e = malloc(sizeof *e);
    if (!e) return &oom_error;
    va_list ap;
    va_start(ap, fmt);
    e->msg = vformat(fmt, ap);
    va_end(ap);
    if (!e->msg) {
        free(e);
        return &oom_error;
    }
    return e;
}

ds_error *ds_error_wrap(ds_error *e, const char *fmt, ...) {
    if (!e || e == &oom_error) return e;
    va_list ap;
    va_start(ap, fmt);
    char *ctx = vformat(fmt, ap);
    va_end(ap);
    if (!ctx) return e;
    size_t n = strlen(ctx) + 2 + strlen(e->msg) + 1;
    char *m = malloc(n);
    if (m) {
        snprintf(m, n, "%s: %s", ctx, e->msg);
        free(e->msg);
        e->msg = m;
    }
    free(ctx);
    return e;
}

const char *ds_error_message(const ds_error *e) { return e ? e->msg : "ok"; }

void ds_error_free(ds_error *e) {
    if (!e || e == &oom_error) return;
    free(e->msg);
    free(e);
}
