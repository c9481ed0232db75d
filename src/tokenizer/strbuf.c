#include "tokenizer/strbuf.h"

#include <stdlib.h>
#include <string.h>

bool ds_buf_reserve(ds_buf *b, size_t extra) {
    if (b->failed) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->failed = true;
        return false;
    }
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

bool ds_buf_append(ds_buf *b, const void *p, size_t n) {
    if (!ds_buf_reserve(b, n)) return false;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return true;
}

bool ds_buf_putc(ds_buf *b, char c) { return ds_buf_append(b, &c, 1); }

bool ds_buf_put_cp(ds_buf *b, uint32_t cp) {
    char s[4];
    size_t n;
    if (cp < 0x80) {
        s[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        s[0] = (char)(0xC0 | (cp >> 6));
        s[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        s[0] = (char)(0xE0 | (cp >> 12));
        s[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        s[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        s[0] = (char)(0xF0 | (cp >> 18));
        s[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        s[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        s[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return ds_buf_append(b, s, n);
}

void ds_buf_free(ds_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

char *ds_buf_take(ds_buf *b, size_t *len) {
    if (!b->data && !b->failed) ds_buf_reserve(b, 0);
    if (b->failed) {
        ds_buf_free(b);
        return NULL;
    }
    char *p = b->data;
    p[b->len] = 0;
    if (len) *len = b->len;
    memset(b, 0, sizeof *b);
    return p;
}

bool ds_ids_push(ds_ids *a, int32_t id) { return ds_ids_append(a, &id, 1); }

bool ds_ids_append(ds_ids *a, const int32_t *ids, size_t n) {
    if (a->failed) return false;
    if (a->n + n > a->cap) {
        size_t cap = a->cap ? a->cap : 32;
        while (cap < a->n + n) cap *= 2;
        int32_t *p = realloc(a->v, cap * sizeof *p);
        if (!p) {
            a->failed = true;
            return false;
        }
        a->v = p;
        a->cap = cap;
    }
    if (n) memcpy(a->v + a->n, ids, n * sizeof *ids);
    a->n += n;
    return true;
}

void ds_ids_free(ds_ids *a) {
    free(a->v);
    memset(a, 0, sizeof *a);
}
