#include "serve/sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(ds_sbuf *b, size_t extra) {
    if (b->oom) return false;
    if (extra > ((size_t)-1) / 2 - b->len) {
        b->oom = true;
        return false;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void ds_sbuf_append(ds_sbuf *b, const char *s, size_t n) {
    if (!reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void ds_sbuf_puts(ds_sbuf *b, const char *s) { ds_sbuf_append(b, s, strlen(s)); }

void ds_sbuf_printf(ds_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        ds_sbuf_append(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void ds_sbuf_consume(ds_sbuf *b, size_t n) {
    if (n >= b->len) {
        ds_sbuf_clear(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

void ds_sbuf_clear(ds_sbuf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

void ds_sbuf_free(ds_sbuf *b) {
    free(b->data);
    *b = (ds_sbuf){0};
}

const char *ds_sbuf_str(const ds_sbuf *b) { return b->data ? b->data : ""; }
