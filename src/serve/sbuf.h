/* A growable byte buffer for the server: response bodies, SSE frames, held
 * text. Always NUL-terminated (text goes to cJSON and printf as is). An
 * append that cannot allocate marks the buffer failed instead of returning
 * an error from every call site; the owner checks `oom` once at the end. */
#ifndef DS_SERVE_SBUF_H
#define DS_SERVE_SBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *data; /* NULL until the first append */
    size_t len, cap;
    bool oom;
} ds_sbuf;

void ds_sbuf_append(ds_sbuf *b, const char *s, size_t n);
void ds_sbuf_puts(ds_sbuf *b, const char *s);
void ds_sbuf_printf(ds_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes (what a consumer has taken). */
void ds_sbuf_consume(ds_sbuf *b, size_t n);
void ds_sbuf_clear(ds_sbuf *b);
void ds_sbuf_free(ds_sbuf *b);
/* The text (never NULL: "" when empty). */
const char *ds_sbuf_str(const ds_sbuf *b);

#endif
